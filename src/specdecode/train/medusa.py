"""`specdecode train medusa`: Medusa-1 heads on the frozen target (Cai et al. 2024).

Self-distillation: head i at position t learns the target's own next-token distribution at
position t + i (KL over the draft vocabulary), on the target's responses from `train data`.
Batches are random response positions; the target's hidden states come from one teacher-forced
forward per sequence (features.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from specdecode.backends import checkpoint
from specdecode.drafters.medusa import MedusaHeads
from specdecode.train import features, loop
from specdecode.train.corpus import load


def train(
    loaded,
    data_dir,
    out,
    schedule: loop.Schedule = loop.Schedule(),
    *,
    features_dir=None,
    source: features.Source | None = None,
    num_heads: int = 4,
    vocab: int = 8192,
    batch_tokens: int = 1024,
    topk: int = 0,
    topk_weight: float = 1.0,
) -> loop.TrainResult:
    """schedule: steps (default 300), lr (default 3e-3), precision, checkpoints and held-out scoring
    (loop.Schedule). With schedule.val, each head's top-1 agreement with the target's token i + 1
    positions ahead is scored on the held-out sequences (data.split); head 1's is the score."""
    schedule = schedule.filled(steps=300, lr=3e-3)
    seed, val = schedule.seed, schedule.val
    torch.manual_seed(seed)
    corpus = load(loaded, data_dir, vocab=vocab, features_dir=features_dir, source=source, val=val)
    rows = _Rows.gather(corpus.feats, corpus.val_ids)
    heads = MedusaHeads(rows.hidden.shape[1], num_heads)
    objective = _Objective(rows, corpus.lm_head, num_heads, topk, topk_weight, batch_tokens, seed)
    recipe = {
        "steps": schedule.steps,
        "lr": schedule.lr,
        "amp": schedule.amp,
        "features": str(corpus.source.precision),
        "batch_tokens": batch_tokens,
        "topk": topk,
        "topk_weight": topk_weight,
        "seed": seed,
        "sequences": len(corpus.train_ids),
        "response_tokens": corpus.response_tokens,
        "val": val,
        "val_sequences": len(corpus.val_ids),
    }
    config = {
        "kind": "medusa",
        "target": corpus.target,
        "hidden": rows.hidden.shape[1],
        "num_heads": num_heads,
        "vocab": len(corpus.token_map),
        "train": recipe,
    }
    return loop.run(
        heads,
        objective.loss_fn,
        partial(_export, config=config, token_map=corpus.token_map),
        out=out,
        schedule=schedule,
        desc="medusa",
        evaluate=objective.evaluate if corpus.val_ids else None,
    )


@dataclass(frozen=True)
class _Rows:
    """The rows a batch draws from. Base rows t: response positions (and the last prompt row) whose
    head-1 target t + 1 exists; head i's target row t + i is valid while it stays inside the same
    sequence. Only these rows are gathered (prompts are most of the tokens of long-context data)."""

    hidden: torch.Tensor  # [N, H] the kept rows of every sequence
    bases: torch.Tensor  # [M] training base rows (indices into hidden)
    room: torch.Tensor  # [M] how many later rows exist in each one's sequence
    val_bases: torch.Tensor  # the held-out sequences' base rows
    val_room: torch.Tensor

    @classmethod
    def gather(cls, feats: features.Features, val_ids: list[int]) -> _Rows:
        kept, bases, room, held = [], [], [], []
        offset = 0
        is_val = torch.zeros(len(feats.hidden), dtype=torch.bool)
        is_val[val_ids] = True
        for h, start, out_of_training in zip(feats.hidden, feats.start, is_val.tolist()):
            first = max(start - 1, 0)
            n = len(h) - first  # rows kept from this sequence
            kept.append(h[first:].float())
            t = torch.arange(0, n - 1)
            bases.append(offset + t)
            room.append(n - 1 - t)  # how many later rows exist in this sequence
            held.append(torch.full((n - 1,), out_of_training))
            offset += n
        bases, room, held = torch.cat(bases), torch.cat(room), torch.cat(held)
        return cls(torch.cat(kept), bases[~held], room[~held], bases[held], room[held])


@dataclass(frozen=True)
class _Objective:
    """The heads' loss on a step's batch (`batch_tokens` base rows drawn by (seed, step)) and their
    held-out agreement: KL from the target's distribution i + 1 rows ahead, over the draft vocabulary."""

    rows: _Rows
    lm_head: torch.Tensor  # [Vd, H]
    num_heads: int
    topk: int
    topk_weight: float
    batch_tokens: int
    seed: int

    def forward(self, module, base: torch.Tensor, room_left: torch.Tensor):
        """base rows [B], later rows left in their sequence [B] -> loss, top-1 agreement, hits [B, K],
        valid [B, K]."""
        hidden = self.rows.hidden
        offsets = torch.arange(1, self.num_heads + 1)
        valid = room_left[:, None] >= offsets  # [B, K]
        target_rows = (base[:, None] + offsets).clamp_max(len(hidden) - 1)  # [B, K]
        student = module(hidden[base], partial(F.linear, weight=self.lm_head))  # [B, K, Vd]
        teacher = hidden[target_rows] @ self.lm_head.T  # [B, K, Vd]
        loss, agree = loop.kl_loss(student, teacher, valid, self.topk, self.topk_weight)
        return loss, agree, (student.argmax(-1) == teacher.argmax(-1)) & valid, valid

    def loss_fn(self, module, step: int):
        bases, room = self.rows.bases, self.rows.room
        pick = torch.randint(
            len(bases), (self.batch_tokens,), generator=loop.batch_generator(self.seed, step)
        )
        loss, agree, _, _ = self.forward(module, bases[pick], room[pick])
        return loss, {"top1": agree}

    def evaluate(self, module):
        """Each head's top-1 agreement over every held-out base row -> (head 1's, all of them)."""
        bases, room, n = self.rows.val_bases, self.rows.val_room, self.batch_tokens

        def part(lo):
            _, _, hits, valid = self.forward(module, bases[lo : lo + n], room[lo : lo + n])
            counts = valid.sum(0)
            metrics = {
                f"top1_{i}": float(hits[:, i].sum() / max(1, int(counts[i]))) for i in range(self.num_heads)
            }
            return metrics, counts.tolist()

        agree = loop.weighted_metrics(part(lo) for lo in range(0, len(bases), n))
        return agree["top1_0"], agree


def _export(module, directory, *, config: dict, token_map: torch.Tensor) -> None:
    tensors = {
        "weight": module.weight.to(torch.bfloat16),
        "bias": module.bias.to(torch.bfloat16),
        "token_map": token_map,
    }
    checkpoint.save(directory, tensors, config)
