"""The training loop every trainer shares.

A trainer supplies the module, `loss_fn(module, step) -> (loss, metrics)` that draws its batch from
(seed, step) alone, and `export(module, directory)` that writes the drafter checkpoint. The loop
owns AdamW with warm-up and cosine decay, gradient clipping, tqdm, and every `save_every` steps an
atomic checkpoint: the drafter (export) plus `train_state.pt` (fp32 weights, optimizer, step, loss
history). Because batches depend only on (seed, step), `resume` after a kill continues to the same
final state as an uninterrupted run. At the end: `loss.png` and `losses.json`.

Held-out validation (optional): `evaluate(module) -> (score, metrics)` on sequences the batches never
draw, every `eval_every` steps; the best-scoring drafter is exported to `out/best`, the history kept
in `train_state.pt` and `losses.json`, and `patience` evaluations without a better score end the run
(training "as long as the held-out acceptance still improves").

A run's schedule (steps, learning rate, precision, seed, checkpoints, validation) is one frozen
`Schedule`, built once from the command line and handed through a trainer to `run` unchanged
(steps and lr left unset take the trainer's defaults, `Schedule.filled`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from specdecode.backends.precision import BF16, FP32, Precision
from specdecode.errors import UserError
from specdecode.files import write_atomic


@dataclass
class TrainResult:
    out: Path
    steps: int
    final_loss: float  # mean loss over the last 10% of steps
    seconds: float  # training time of this run and the runs it resumed
    losses: list[float]

    def summary(self) -> str:
        return (
            f"trained {self.steps} steps in {self.seconds:.0f} s; final loss {self.final_loss:.4f}; "
            f"checkpoint in {self.out}, loss curve {self.out / 'loss.png'}"
        )


@dataclass(frozen=True)
class Schedule:
    """How a trainer runs, whatever it trains: what `run` and every trainer's recipe read.
    steps, lr: None takes the trainer's own defaults (`filled`). seed: the batches of step s are a
    function of (seed, s) alone, so `resume` after a kill reaches the uninterrupted run's state.
    stop_after: leave early after that many steps of this run, as a kill would (only tests use it).
    val: the fraction of sequences held out (by id) and scored every `eval_every` steps; `patience`
    scores without a better one end the run (0: never)."""

    steps: int | None = None
    lr: float | None = None
    amp: str = "fp32"
    seed: int = 0
    resume: bool = False
    save_every: int = 50
    stop_after: int | None = None
    val: float = 0.0
    eval_every: int = 200
    patience: int = 0

    def filled(self, steps: int, lr: float) -> Schedule:
        """This schedule with a trainer's default steps and learning rate where they are unset."""
        return replace(
            self, steps=steps if self.steps is None else self.steps, lr=lr if self.lr is None else self.lr
        )


def lr_at(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up, then cosine decay to 10% of lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def check_resumable(out: str | Path) -> None:
    """--resume needs a training state in `out` (checked before the costly feature pass, too)."""
    if not (Path(out) / "train_state.pt").is_file():
        raise UserError(f"--resume: no training state in {out} (train without --resume to start)")


def run(
    module: torch.nn.Module,
    loss_fn: Callable,
    export: Callable,
    *,
    out: str | Path,
    schedule: Schedule,
    desc: str = "train",
    evaluate: Callable | None = None,
) -> TrainResult:
    """Train `module` for `schedule.steps` optimizer steps (a filled schedule: the trainer's defaults
    in). amp "bf16": the forward under bfloat16 autocast (matmuls in bf16, softmax and losses in fp32,
    fp32 master weights): faster where the CPU has bf16 dot products (AVX512-BF16, AMX), slower where
    it does not. evaluate: held-out `(score, metrics)`, higher is better (module docstring)."""
    steps, lr, amp = schedule.steps, schedule.lr, schedule.amp
    if steps is None or lr is None:
        raise ValueError("run: the schedule needs steps and lr (Schedule.filled)")
    try:
        autocast = Precision.parse(amp)
    except UserError:
        autocast = None
    if autocast not in (FP32, BF16):
        raise UserError(f"amp: expected fp32 or bf16, got {amp!r}")
    eval_every, patience = schedule.eval_every, schedule.patience
    if evaluate is not None and eval_every < 1:
        raise UserError(f"eval_every: expected a positive number of steps, got {eval_every}")
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = _Run(module, export, out, lr, autocast, schedule.resume)
    warmup = max(1, steps // 20)
    bar = tqdm(range(state.start, steps), initial=state.start, total=steps, desc=desc, unit="step")
    module.train()
    for step in bar:
        metrics = state.step(loss_fn, step, lr_at(step, steps, lr, warmup))
        bar.set_postfix(loss=f"{state.losses[-1]:.4f}", **{k: f"{v:.3f}" for k, v in metrics.items()})
        done = step + 1
        stop = False
        if evaluate is not None and (done % eval_every == 0 or done == steps):
            stop = state.validate(done, evaluate, patience, lambda line: bar.write(f"{desc} {line}"))
        if done % schedule.save_every == 0 or done == steps or stop:
            state.checkpoint(done)
        if stop or (schedule.stop_after is not None and done - state.start >= schedule.stop_after):
            break
    bar.close()
    module.eval()
    return state.finish(desc)


class _Run:
    """One run of the loop: the optimizer, the losses and held-out scores so far (restored from
    `out/train_state.pt` with resume) and the seconds of the runs it resumed; it takes the steps
    and writes the checkpoints."""

    def __init__(
        self, module: torch.nn.Module, export: Callable, out: Path, lr: float, amp: Precision, resume: bool
    ):
        self.module, self.export, self.out, self.amp = module, export, out, amp
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.device = self.params[0].device.type
        self.opt = torch.optim.AdamW(self.params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.state_path = out / "train_state.pt"
        self.start, self.losses, self.seconds, self.history = 0, [], 0.0, []
        if resume:
            self._restore()
        self.t0 = time.perf_counter()

    def _restore(self) -> None:
        check_resumable(self.out)
        state = torch.load(self.state_path, weights_only=False)
        trainable = {name for name, p in self.module.named_parameters() if p.requires_grad}
        if set(state["module"]) != trainable:
            raise UserError(f"--resume: the training state in {self.out} is for another model or settings")
        self.module.load_state_dict(state["module"], strict=False)  # holds the trainable weights only
        self.opt.load_state_dict(state["optimizer"])
        self.start, self.losses, self.seconds = state["step"], state["losses"], state["seconds"]
        self.history = state.get("val", [])

    def _autocast(self):
        return torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.amp == BF16)

    def step(self, loss_fn: Callable, step: int, lr: float) -> dict:
        """One optimizer step at learning rate lr on step `step`'s batch -> its metrics."""
        for group in self.opt.param_groups:
            group["lr"] = lr
        with self._autocast():
            loss, metrics = loss_fn(self.module, step)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.losses.append(loss.item())
        return metrics

    def checkpoint(self, step: int) -> None:
        """The training state after `step` steps, atomically, and the drafter (export) beside it."""
        trainable = {
            name: p.detach().clone() for name, p in self.module.named_parameters() if p.requires_grad
        }
        state = {
            "module": trainable,
            "optimizer": self.opt.state_dict(),
            "step": step,
            "losses": self.losses,
            "seconds": self.seconds + time.perf_counter() - self.t0,
            "val": self.history,
        }
        write_atomic(self.state_path, lambda tmp: torch.save(state, tmp))
        self.export(self.module, self.out)

    def validate(self, step: int, evaluate: Callable, patience: int, write: Callable[[str], None]) -> bool:
        """Score the module held out; export it to out/best when best so far. -> whether to stop."""
        self.module.eval()
        with torch.no_grad(), self._autocast():
            score, metrics = evaluate(self.module)
        self.module.train()
        best = max((h["score"] for h in self.history), default=-math.inf)
        self.history.append(
            {
                "step": step,
                "score": round(float(score), 5),
                **{k: round(float(v), 5) for k, v in metrics.items()},
            }
        )
        if score > best:
            self.export(self.module, self.out / "best")
        write(
            f"step {step}: held-out score {score:.4f} (best {max(best, score):.4f}) "
            + " ".join(f"{k}={v:.3f}" for k, v in metrics.items())
        )
        scores = [h["score"] for h in self.history]
        since = len(scores) - 1 - scores.index(max(scores))  # evaluations since the first best one
        return patience > 0 and since >= patience

    def finish(self, title: str) -> TrainResult:
        """The run's result; `losses.json` and the loss curve `loss.png` (titled `title`) in out."""
        self.seconds += time.perf_counter() - self.t0
        losses, out = self.losses, self.out
        tail = losses[-max(1, len(losses) // 10) :]
        result = TrainResult(out, len(losses), sum(tail) / len(tail), self.seconds, losses)
        (out / "losses.json").write_text(
            json.dumps({"losses": losses, "seconds": self.seconds, "val": self.history})
        )
        plot(losses, out / "loss.png", title)
        return result


def plot(losses: list[float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, lw=0.8, alpha=0.5, label="loss")
    window = max(1, len(losses) // 20)
    if len(losses) > window:
        smooth = torch.tensor(losses).unfold(0, window, 1).mean(1).tolist()
        ax.plot(range(window, len(losses) + 1), smooth, lw=1.5, label=f"mean of {window}")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def kl_loss(
    student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, topk: int = 0, topk_weight: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """student, teacher: logits [..., V]; mask: [...] bool -> (mean KL(teacher || student) over the
    masked rows, top-1 agreement there). Self-distillation: the teacher is the target itself.
    With topk > 0, plus topk_weight times HASS's top-K distillation term (Zhang et al. 2024,
    "Learning Harmonized Representations for Speculative Sampling", arXiv:2408.15766):
    -sum over the teacher's K most likely tokens of p log q, which spends a small head's capacity on
    the candidates that decide acceptance rather than on the tail of the distribution."""
    logq = student.float().log_softmax(-1)
    logp = teacher.float().log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    if topk > 0:
        top_logp, top = logp.topk(min(topk, logp.shape[-1]), dim=-1)
        kl = kl - topk_weight * (top_logp.exp() * logq.gather(-1, top)).sum(-1)
    m = mask.float()
    n = m.sum().clamp_min(1)
    agree = ((student.argmax(-1) == teacher.argmax(-1)).float() * m).sum() / n
    return (kl * m).sum() / n, agree.detach()


def sequence_steps(
    forward: Callable, train_ids: list[int], val_ids: list[int], per_batch: int, seed: int, score: str
) -> tuple[Callable, Callable]:
    """For trainers whose batch is `per_batch` whole sequences: forward(module, sequence indices) ->
    (loss, metrics, rows scored per metric). Returns run()'s loss_fn (step's batch drawn from the
    training indices by (seed, step)) and evaluate (every held-out sequence once; `score` names the
    metric that ranks checkpoints)."""

    def loss_fn(module, step):
        draw = torch.randint(len(train_ids), (per_batch,), generator=batch_generator(seed, step)).tolist()
        loss, metrics, _ = forward(module, [train_ids[j] for j in draw])
        return loss, metrics

    def evaluate(module):
        agree = weighted_metrics(
            forward(module, val_ids[lo : lo + per_batch])[1:] for lo in range(0, len(val_ids), per_batch)
        )
        return agree[score], agree

    return loss_fn, evaluate


def weighted_metrics(parts) -> dict[str, float]:
    """(metrics, counts) per held-out batch -> each metric averaged over all the rows it scored."""
    sums, totals = {}, {}
    for metrics, counts in parts:
        for (name, value), n in zip(metrics.items(), counts):
            sums[name] = sums.get(name, 0.0) + value * n
            totals[name] = totals.get(name, 0) + n
    return {name: sums[name] / max(1, totals[name]) for name in sums}


def batch_generator(seed: int, step: int) -> torch.Generator:
    """The RNG a trainer draws step `step`'s batch from: a function of (seed, step) only."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)
