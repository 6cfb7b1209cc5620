"""`specdecode train medusa`: Medusa-1 heads on the frozen target (Cai et al. 2024).

Self-distillation: head i at position t learns the target's own next-token distribution at
position t + i (KL over the draft vocabulary), on the target's responses from `train data`.
Batches are random response positions; the target's hidden states come from one teacher-forced
forward per sequence (features.py).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from specdecode.backends import checkpoint
from specdecode.drafters.medusa import MedusaHeads
from specdecode.train import data, features, loop


def train(
    loaded,
    data_dir,
    out,
    *,
    features_dir=None,
    source: features.Source | None = None,
    seed: int = 0,
    resume: bool = False,
    save_every: int = 50,
    stop_after: int | None = None,
    amp: str = "fp32",
    num_heads: int = 4,
    vocab: int = 8192,
    steps: int = 300,
    lr: float = 3e-3,
    batch_tokens: int = 1024,
    topk: int = 0,
    topk_weight: float = 1.0,
    val: float = 0.0,
    eval_every: int = 200,
    patience: int = 0,
) -> loop.TrainResult:
    """val: hold out this fraction of the sequences (data.split) and score each head's top-1 agreement
    with the target's token i + 1 positions ahead there (head 1's is the score)."""
    torch.manual_seed(seed)
    seqs = data.read(data_dir)
    target = checkpoint.describe(loaded)
    source = source or features.Source(loaded.model)
    feats = source.features(features_dir or Path(data_dir) / "features", seqs, target["fingerprint"])
    train_ids, val_ids = data.split(seqs, val)
    token_map = data.token_map([seqs[i] for i in train_ids], loaded.model.vocab_size, vocab)
    lm_head = loaded.model.output_weight().detach().float().cpu()[token_map]  # [Vd, H]
    # base rows t: response positions (and the last prompt row) whose head-1 target t + 1 exists;
    # head i's target row t + i is valid while it stays inside the same sequence. Only these rows
    # are gathered (prompts are most of the tokens of long-context data).
    kept, bases, room, held = [], [], [], []
    offset = 0
    is_val = torch.zeros(len(seqs), dtype=torch.bool)
    is_val[val_ids] = True
    for h, start, out_of_training in zip(feats.hidden, feats.start, is_val.tolist()):
        first = max(start - 1, 0)
        n = len(h) - first  # rows kept from this sequence
        kept.append(h[first:])
        t = torch.arange(0, n - 1)
        bases.append(offset + t)
        room.append(n - 1 - t)  # how many later rows exist in this sequence
        held.append(torch.full((n - 1,), out_of_training))
        offset += n
    hidden = torch.cat(kept)  # [N, H]
    bases, room, held = torch.cat(bases), torch.cat(room), torch.cat(held)
    val_bases, val_room, bases, room = bases[held], room[held], bases[~held], room[~held]
    heads = MedusaHeads(hidden.shape[1], num_heads)
    offsets = torch.arange(1, num_heads + 1)

    def forward(module, rows, room_left):
        """base rows [B], later rows left in their sequence [B] -> loss, student [B, K, Vd],
        teacher [B, K, Vd], valid [B, K]."""
        valid = room_left[:, None] >= offsets  # [B, K]
        target_rows = (rows[:, None] + offsets).clamp_max(len(hidden) - 1)  # [B, K]
        student = module(hidden[rows], partial(F.linear, weight=lm_head))  # [B, K, Vd]
        teacher = hidden[target_rows] @ lm_head.T  # [B, K, Vd]
        loss, agree = loop.kl_loss(student, teacher, valid, topk, topk_weight)
        return loss, agree, (student.argmax(-1) == teacher.argmax(-1)) & valid, valid

    def loss_fn(module, step):
        pick = torch.randint(len(bases), (batch_tokens,), generator=loop.batch_generator(seed, step))
        loss, agree, _, _ = forward(module, bases[pick], room[pick])
        return loss, {"top1": agree}

    def evaluate(module):
        def part(lo):
            _, _, hits, valid = forward(
                module, val_bases[lo : lo + batch_tokens], val_room[lo : lo + batch_tokens]
            )
            counts = valid.sum(0)
            metrics = {
                f"top1_{i}": float(hits[:, i].sum() / max(1, int(counts[i]))) for i in range(num_heads)
            }
            return metrics, counts.tolist()

        agree = loop.weighted_metrics(part(lo) for lo in range(0, len(val_bases), batch_tokens))
        return agree["top1_0"], agree

    def export(module, directory):
        recipe = {
            "steps": steps,
            "lr": lr,
            "amp": amp,
            "features": source.dtype,
            "batch_tokens": batch_tokens,
            "topk": topk,
            "topk_weight": topk_weight,
            "seed": seed,
            "sequences": len(train_ids),
            "response_tokens": data.response_tokens([seqs[i] for i in train_ids]),
            "val": val,
            "val_sequences": len(val_ids),
        }
        config = {
            "kind": "medusa",
            "target": target,
            "hidden": hidden.shape[1],
            "num_heads": num_heads,
            "vocab": len(token_map),
            "train": recipe,
        }
        tensors = {
            "weight": module.weight.to(torch.bfloat16),
            "bias": module.bias.to(torch.bfloat16),
            "token_map": token_map,
        }
        checkpoint.save(directory, tensors, config)

    return loop.run(
        heads,
        loss_fn,
        export,
        out=out,
        steps=steps,
        lr=lr,
        resume=resume,
        save_every=save_every,
        stop_after=stop_after,
        desc="medusa",
        amp=amp,
        evaluate=evaluate if val_ids else None,
        eval_every=eval_every,
        patience=patience,
    )
