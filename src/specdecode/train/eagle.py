"""`specdecode train eagle`: an EAGLE-3-style head (drafters/eagle_head.py) by self-distillation.

Per batch: whole sequences (their last `window` tokens), the target's captured low/mid/high layer
features and final hidden states from features.py. Loss: KL from the target's next-token
distribution (over the draft vocabulary) at every response position, averaged over `ttt_steps`
unrolled draft steps (EAGLE-3's training-time test: step s drafts from the head's own outputs).
The decoder layer is initialised from the target's last layer (attention and MLP shapes match).
Any family of the fast forward (Llama, Qwen2/3, Mistral, Gemma 3, Phi-3).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from specdecode.backends import checkpoint
from specdecode.backends.layer import norm_offset, norm_weight
from specdecode.drafters.eagle_head import EagleHead, head_from_config, rope_tables
from specdecode.errors import UserError
from specdecode.train import features, loop
from specdecode.train.corpus import TrainingSet, load


def default_layers(num_layers: int) -> tuple[int, ...]:
    """Low, mid and high layers as in EAGLE-3 (the high one short of the top)."""
    return tuple(sorted({min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0)}))


def mlp_width(intermediate: int, width: float) -> int:
    """The head's MLP width: `width` x the target's intermediate size, in multiples of 64."""
    if not 0 < width <= 1:
        raise UserError(f"--set width={width}: the head's MLP width is a fraction of the target's, in (0, 1]")
    return min(intermediate, max(64, round(intermediate * width / 64) * 64))


def _init_from_target(head: EagleHead, hf_model) -> None:
    """Start the attention output, MLP and norms from the target's last layer (Phi-3: its fused
    gate|up; Gemma 3: its pre-MLP norm and (1 + w) multipliers; the head's MLP stays SiLU). A narrower
    MLP starts from the first of the layer's units."""
    last = hf_model.model.layers[-1]
    mlp = last.mlp
    offset = norm_offset(hf_model.config)
    pre_mlp = getattr(last, "pre_feedforward_layernorm", None) or last.post_attention_layernorm
    units = head.down.in_features
    with torch.no_grad():
        head.o.weight.copy_(last.self_attn.o_proj.weight)
        gate, up = (
            mlp.gate_up_proj.weight.chunk(2)
            if hasattr(mlp, "gate_up_proj")
            else (mlp.gate_proj.weight, mlp.up_proj.weight)
        )
        head.gate_up.weight.copy_(torch.cat([gate[:units], up[:units]]))
        head.down.weight.copy_(mlp.down_proj.weight[:, :units])
        head.norm_mlp.copy_(norm_weight(pre_mlp, offset, torch.float32))
        head.norm_out.copy_(norm_weight(hf_model.model.norm, offset, torch.float32))


def train(
    loaded,
    data_dir,
    out,
    schedule: loop.Schedule = loop.Schedule(),
    *,
    features_dir=None,
    source: features.Source | None = None,
    vocab: int = 8192,
    batch_tokens: int = 1024,
    window: int = 384,
    ttt_steps: int = 2,
    layers: str = "",
    topk: int = 0,
    topk_weight: float = 1.0,
    init: str = "",
    width: float | None = None,
) -> loop.TrainResult:
    """schedule: steps (default 200), lr (default 1e-3), precision, checkpoints and held-out scoring
    (loop.Schedule). width: the head's MLP width over the target's (EAGLE-3's is 1; a narrower one
    reads fewer weights a draft step, scripts/eagle_head_cost.py; default 1, or with `init` the
    checkpoint's; a wider one than the checkpoint's widens it, _load_widened). init: start from this
    EAGLE checkpoint (a directory, or "shipped") instead of the target's last layer, e.g. to train a head
    further on more data; the head's weights do not depend on the draft vocabulary (its LM head is the
    target's), so the new data's token map is used. With schedule.val, the head's teacher-forced top-1
    agreement with the target is scored on the held-out sequences (data.split) per unrolled step
    (top1_0 is position 1's acceptance under greedy decoding)."""
    schedule = schedule.filled(steps=200, lr=1e-3)
    seed, val = schedule.seed, schedule.val
    torch.manual_seed(seed)
    hf = loaded.model.hf
    init_tensors, init_config = (
        checkpoint.load(None if init == "shipped" else init, "eagle", loaded) if init else ({}, {})
    )
    layer_ids = _layer_ids(layers, init, init_config, hf.config.num_hidden_layers)
    intermediate = _intermediate(hf.config.intermediate_size, width, init_config.get("intermediate"))
    corpus = load(
        loaded, data_dir, vocab=vocab, features_dir=features_dir, source=source, val=val, layer_ids=layer_ids
    )
    settings = {"steps": schedule.steps, "lr": schedule.lr, "amp": schedule.amp}
    settings |= {"features": str(corpus.source.precision)}
    settings |= {"batch_tokens": batch_tokens, "window": window, "ttt_steps": ttt_steps, "topk": topk}
    settings |= {"topk_weight": topk_weight, "seed": seed, "init": init or None}
    config = _config(hf.config, layer_ids, intermediate, corpus, settings, val)
    head = head_from_config(config)
    if not init or intermediate > init_config["intermediate"]:
        _init_from_target(head, hf.cpu() if loaded.model.device.type == "cpu" else hf)
    if init:
        _load_widened(head, {k: v.float() for k, v in init_tensors.items() if k != "token_map"})
    cos, sin = rope_tables(hf, window)
    objective = _Objective(
        corpus.feats,
        loaded.model.embedding.weight().detach().float().cpu(),
        cos.cpu(),
        sin.cpu(),
        corpus.lm_head,
        window,
        ttt_steps,
        topk,
        topk_weight,
    )
    per_batch = max(1, batch_tokens // window)
    loss_fn, evaluate = loop.sequence_steps(
        objective.forward, corpus.train_ids, corpus.val_ids, per_batch, seed, "top1_0"
    )

    def export(module, directory):
        tensors = {k: v.to(torch.bfloat16) for k, v in module.state_dict().items()}
        checkpoint.save(directory, {**tensors, "token_map": corpus.token_map}, config)

    return loop.run(
        head,
        loss_fn,
        export,
        out=out,
        schedule=schedule,
        desc="eagle",
        evaluate=evaluate if corpus.val_ids else None,
    )


def _intermediate(target_units: int, width: float | None, init_units: int | None) -> int:
    """The head's MLP width: `width` x the target's (EAGLE-3's whole width by default); a head trained
    further keeps its checkpoint's unless a wider one is asked for (never a narrower one: that would
    drop trained units)."""
    units = mlp_width(target_units, 1.0 if width is None else width)
    if init_units is None:
        return units
    if width is None or units == init_units:
        return init_units
    if units < init_units:
        raise UserError(
            f"--set width={width}: a head trained further keeps at least its checkpoint's MLP width "
            f"({init_units} units; that width is {units})"
        )
    return units


def _load_widened(head: EagleHead, tensors: dict[str, torch.Tensor]) -> None:
    """Load a checkpoint into `head`, whose MLP may be wider: the checkpoint's units fill the first
    ones; the others keep their start from the target's last layer (_init_from_target) with their
    output columns zero, so the widened head computes what the checkpoint did until training moves
    them (a function-preserving widening, as Net2Net's)."""
    units = tensors["down.weight"].shape[1]
    if units == head.down.in_features:
        head.load_state_dict(tensors)
        return
    gate, up = tensors.pop("gate_up.weight").chunk(2)
    down = tensors.pop("down.weight")
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    if set(missing) != {"gate_up.weight", "down.weight"} or unexpected:
        raise UserError(f"--init: the checkpoint does not fit an EAGLE head ({missing=}, {unexpected=})")
    wide = head.down.in_features
    with torch.no_grad():
        head.gate_up.weight[:units].copy_(gate)
        head.gate_up.weight[wide : wide + units].copy_(up)
        head.down.weight[:, :units].copy_(down)
        head.down.weight[:, units:].zero_()


def _layer_ids(layers: str, init: str, init_config: dict, num_layers: int) -> tuple[int, ...]:
    """The target layers the head fuses: `layers` ("2,14,25"), else the init checkpoint's, else EAGLE-3's."""
    layer_ids = tuple(int(x) for x in str(layers).split(",") if x != "") or (
        tuple(init_config["layers"]) if init else default_layers(num_layers)
    )
    if init and list(layer_ids) != init_config["layers"]:
        raise UserError(
            f"--init {init}: that head fuses layers {init_config['layers']}, not {list(layer_ids)}"
        )
    return layer_ids


def _config(
    cfg, layer_ids: tuple[int, ...], intermediate: int, corpus: TrainingSet, settings: dict, val: float
) -> dict:
    """The checkpoint's config.json: the head's shape (the target's numbers, its own MLP width) and how
    it was trained."""
    train = {**settings, "sequences": len(corpus.train_ids), "response_tokens": corpus.response_tokens}
    return {
        "kind": "eagle",
        "target": corpus.target,
        "hidden": cfg.hidden_size,
        "layers": list(layer_ids),
        "heads": cfg.num_attention_heads,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        "intermediate": intermediate,
        "eps": cfg.rms_norm_eps,
        "vocab": len(corpus.token_map),
        "train": {**train, "val": val, "val_sequences": len(corpus.val_ids)},
    }


@dataclass(frozen=True)
class _Objective:
    """The loss of a batch of sequences: KL to the target over the draft vocabulary, per unrolled step."""

    feats: features.Features
    embed: torch.Tensor  # [V, H] float32: the target's embedding
    cos: torch.Tensor  # [window, head_dim]
    sin: torch.Tensor
    lm_head: torch.Tensor  # [Vd, H]
    window: int
    ttt_steps: int
    topk: int
    topk_weight: float

    def batch(self, pick):
        """sequence indices -> emb [B, T, H], fused [B, T, F], the target's final hidden rows [B, T, H]
        (its next-token logits once projected), loss mask [B, T]."""
        feats = self.feats
        t = min(self.window, max(len(feats.hidden[i]) - 1 for i in pick))
        emb, fused, teacher, mask = [], [], [], []
        for i in pick:  # n: positions with features (all, or all but the last: features.Writer)
            tokens, n = feats.tokens[i], len(feats.hidden[i])
            lo = max(0, n - 1 - t)  # row j of the window is position lo + j; token j+1 must exist
            rows = torch.arange(lo, n - 1)
            m = len(rows)
            pad = (0, 0, 0, t - m)
            emb.append(F.pad(self.embed[tokens[rows + 1]], pad))
            fused.append(F.pad(feats.layers[i][rows].float(), pad))
            teacher.append(F.pad(feats.hidden[i][rows + 1].float(), pad))
            # row j predicts the token at position j + 2: keep it when that is a response token
            mask.append(F.pad(rows + 2 >= feats.start[i], (0, t - m)))
        return torch.stack(emb), torch.stack(fused), torch.stack(teacher), torch.stack(mask)

    def forward(self, module, pick):
        """-> mean loss over the unrolled steps, top-1 agreement per step, rows scored per step."""
        emb, fused, teacher_hidden, mask = self.batch(pick)
        t = emb.shape[1]
        outs = module.unroll(emb, fused, self.cos[:t], self.sin[:t], self.ttt_steps)
        # logits only for the rows a loss reads (the response; the prompt rows are context): the
        # LM head over the draft vocabulary is most of a step's work
        teacher = teacher_hidden[mask] @ self.lm_head.T  # [n, Vd]
        row = torch.arange(mask.shape[1]).expand_as(mask)[mask]  # [n] each scored row's index in its window
        losses, metrics, counts = [], {}, []
        for s, o in enumerate(outs):
            student = module.logits(o[mask], partial(F.linear, weight=self.lm_head))  # [n, Vd]
            # step s has no draft at rows < s
            loss, agree = loop.kl_loss(student, teacher, row >= s, self.topk, self.topk_weight)
            losses.append(loss)
            metrics[f"top1_{s}"] = float(agree)
            counts.append(int((row >= s).sum()))
        return sum(losses) / len(losses), metrics, counts
