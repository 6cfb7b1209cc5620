"""Every version of a shipped EAGLE head in git's history, scored on the same sequences none of them
trained on: how acceptance grew with the data (and steps) each round added.

The held-out sequences are the data's own `--val` split (`train.data.split`: a prompt is held out when
the hash of its id falls under the fraction, so it stayed out of every round that trained with
`--val` at least that large), sampled per kind of prompt. Their features come from the target as it
serves (`--dtype gguf`: decoding's 64-row calls). Each head is scored by teacher forcing: per unrolled
step s (0 = the first drafted token), how often its most likely draft-vocabulary token is the target's
most likely token over the whole vocabulary, i.e. the token greedy decoding would keep.

    python3 scripts/eagle_head_history.py --target qwen2.5-coder-1.5b --data data/qwen2.5-coder-1.5b-gguf \
        --per-kind 80 --out docs/results/X.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specdecode.backends import checkpoint, kernels, models
from specdecode.backends.precision import FP32, GGUF
from specdecode.drafters.eagle_head import head_from_config, rope_tables
from specdecode.train import data, features

ROOT = Path(__file__).resolve().parent.parent
KINDS = {  # a record's category -> the kind it is scored under
    "chat": ("self-instruct", "humanities", "roleplay", "stem", "writing", "extraction", "summarization"),
    "code": ("code", "coding"),
    "reasoning": ("reasoning", "math"),
    "calls": ("bfcl",),
}


def kind_of(category: str) -> str | None:
    for kind, prefixes in KINDS.items():
        if category.startswith(prefixes):
            return kind
    return None


def sample(seqs, val: float, per_kind: int, seed: int) -> list[int]:
    """Indices of up to per_kind held-out sequences of each kind (seeded)."""
    _, held = data.split(seqs, val)
    rng = random.Random(seed)
    picked = []
    for kind in KINDS:
        ids = [i for i in held if kind_of(seqs[i].category) == kind]
        picked += sorted(rng.sample(ids, min(per_kind, len(ids))))
    return picked


def versions(shipped: Path) -> list[tuple[str, str, str]]:
    """(commit, date, subject) of every commit that changed the shipped head's weights, oldest first."""
    out = subprocess.run(
        [
            "git",
            "log",
            "--reverse",
            "--format=%h%x09%ad%x09%s",
            "--date=short",
            "--",
            str(shipped / "model.safetensors"),
        ],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    return [tuple(line.split("\t", 2)) for line in out.splitlines() if line]


def checkout(commit: str, shipped: Path, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        blob = subprocess.run(
            ["git", "show", f"{commit}:{shipped / name}"], check=True, capture_output=True, cwd=ROOT
        ).stdout
        (into / name).write_bytes(blob)
    return into


def window_rows(feats, i: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence i's last `window` rows [t] and the mask [t] of those whose prediction is scored: row j
    predicts the token at j + 2, scored where that is a response token (as `train eagle` does)."""
    n = len(feats.hidden[i])
    rows = torch.arange(max(0, n - 1 - window), n - 1)
    return rows, rows + 2 >= feats.start[i]


@torch.no_grad()
def greedy_tokens(feats, picked, lm_head_full, window: int) -> list[torch.Tensor]:
    """Per sequence, the target's most likely token over its whole vocabulary at each scored row [n]."""
    out = []
    for i in picked:
        rows, mask = window_rows(feats, i, window)
        out.append((feats.hidden[i][rows + 1].float()[mask] @ lm_head_full.T).argmax(-1))
    return out


@torch.no_grad()
def score(head, token_map, feats, picked, targets, embed, lm_head_full, cos, sin, window: int, steps: int):
    """-> {kind: [agreement per unrolled step]} and rows scored, one sequence at a time.
    embed [V, H], lm_head_full [V, H] float32; token_map [Vd] target ids of the draft vocabulary;
    targets: greedy_tokens() of the picked sequences."""
    lm_draft = lm_head_full[token_map]
    sums: dict[str, list[float]] = {}
    rows_by: dict[str, list[int]] = {}
    for (kind_name, i), target in zip(picked, targets):
        tokens = feats.tokens[i]
        rows, mask = window_rows(feats, i, window)
        emb = embed[tokens[rows + 1]][None]
        fused = feats.layers[i][rows].float()[None]
        t = len(rows)
        outs = head.unroll(emb, fused, cos[:t], sin[:t], steps)
        at = torch.arange(t)[mask]
        s_sum = sums.setdefault(kind_name, [0.0] * steps)
        s_rows = rows_by.setdefault(kind_name, [0] * steps)
        for s, o in enumerate(outs):
            drafted = token_map[head.logits(o[0][mask], lambda x: F.linear(x, lm_draft)).argmax(-1)]
            ok = at >= s  # step s has no draft at a window's first s rows
            s_sum[s] += float(((drafted == target) & ok).sum())
            s_rows[s] += int(ok.sum())
    return {k: [v / max(1, r) for v, r in zip(sums[k], rows_by[k])] for k in sums}, rows_by


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--data", default="data/qwen2.5-coder-1.5b-gguf")
    ap.add_argument("--features", default="runs/eagle_history_features", help="feature store (reused)")
    ap.add_argument("--val", type=float, default=0.05, help="the --val every round trained with")
    ap.add_argument("--per-kind", type=int, default=80)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=3, help="unrolled draft steps scored")
    ap.add_argument("--window", type=int, default=384)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = models.load(args.target, FP32, "cpu")
    seqs = data.read(args.data)
    picked = sample(seqs, args.val, args.per_kind, args.seed)
    chosen = [seqs[i] for i in picked]
    fingerprint = checkpoint.fingerprint(loaded.model)
    shipped = checkpoint.checkpoint_dir(None, "eagle", fingerprint).resolve()
    layer_ids = tuple(json.loads((shipped / "config.json").read_text())["layers"])
    source = features.Source(models.load(args.target, GGUF, "cpu").model, GGUF, kernels.DENSE_ROWS)
    t0 = time.perf_counter()
    feats = source.features(args.features, chosen, fingerprint, layer_ids)
    feature_s = time.perf_counter() - t0
    embed = loaded.model.embedding.weight().detach().float().cpu()
    lm_head = loaded.model.output_weight().detach().float().cpu()
    cos, sin = rope_tables(loaded.model.hf, args.window)
    kinds = [(kind_of(s.category), j) for j, s in enumerate(chosen)]
    shipped = shipped.relative_to(ROOT)
    targets = greedy_tokens(feats, [j for _, j in kinds], lm_head, args.window)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for commit, date, subject in versions(shipped):
            tensors, config = checkpoint.load(
                str(checkout(commit, shipped, Path(tmp) / commit)), "eagle", loaded
            )
            head = head_from_config(config)
            head.load_state_dict({k: v.float() for k, v in tensors.items() if k != "token_map"})
            head.eval()
            by_kind, rows = score(
                head,
                tensors["token_map"].long(),
                feats,
                kinds,
                targets,
                embed,
                lm_head,
                cos,
                sin,
                args.window,
                args.steps,
            )
            run = {
                "commit": commit,
                "date": date,
                "subject": subject[:300],
                "top1_by_step": by_kind,
                "rows": rows,
                "trained": config.get("train", {}),
            }
            runs.append(run)
            print(
                commit,
                date,
                {k: [round(x, 3) for x in v] for k, v in by_kind.items()},
                file=sys.stderr,
                flush=True,
            )
    out = {
        "what": "each shipped version of the EAGLE head, teacher-forced on the same held-out sequences",
        "target": args.target,
        "features": "gguf, 64-row calls",
        "sequences": {k: sum(1 for kk, _ in kinds if kk == k) for k in KINDS},
        "feature_seconds": round(feature_s, 1),
        "positions": sum(len(feats.hidden[j]) for j in range(len(chosen))),
        "cpu": kernels.machine(),
        "command": " ".join(sys.argv),
        "runs": runs,
    }
    out["fit"] = fit(runs)
    Path(args.out).write_text(json.dumps(out, indent=1))


def fit(runs: list[dict], goals=(0.5, 0.6, 0.7)) -> dict:
    """Per kind, least squares of position 1's agreement on log2 of the training response tokens, and
    the tokens at which the line reaches each goal (an extrapolation: steps grew with the data)."""
    out = {}
    for kind in runs[-1]["top1_by_step"]:
        xs = [math.log2(r["trained"]["response_tokens"]) for r in runs]
        ys = [r["top1_by_step"][kind][0] for r in runs]
        slope, intercept = statistics.linear_regression(xs, ys)
        at = {str(g): (round(2 ** ((g - intercept) / slope)) if slope > 0 else None) for g in goals}
        mean = statistics.fmean(ys)
        out[kind] = {"per_doubling": round(slope, 4), "at_mean_tokens": round(mean, 4), "tokens_to_reach": at}
    return out


if __name__ == "__main__":
    main()
