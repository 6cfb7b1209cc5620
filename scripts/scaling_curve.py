"""Held-out acceptance against training tokens (issue 18's data-scaling curve) from `specdecode bench`
reports: each trained drafter row (category ALL) becomes one point, its x the response tokens of the
data it was trained on (the checkpoint's config.json `train.response_tokens`, or `--tokens LABEL=N`
for checkpoints written before that field existed). A point's series is its drafter label without the
checkpoint path, or `--series LABEL=NAME` where the data's mix differs (a curve per mix).

    python3 scripts/scaling_curve.py REPORT.json [REPORT.json ...] --out curve.json [--plot curve.png]
        [--tokens eagle=121507 --tokens eagle:/runs/eagle_364k=364434]
        [--series eagle:/runs/chat="eagle + chat"]
        [--k 3]   (reports run over several k label rows `drafter@kN`: keep one k)
        [--add-to OLD_CURVE.json]   (keep its points: a curve grows while old checkpoints are deleted)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[1] / "src" / "specdecode" / "shipped"


def series(label: str) -> str:
    """The drafter label without its checkpoint path: `eagle:b=2:nodes=6:/runs/x` -> `eagle:b=2:nodes=6`."""
    parts = label.split(":")
    return ":".join(p for p in parts if not ("/" in p or Path(p).is_dir()))


def checkpoint_dir(label: str) -> Path | None:
    """`eagle` -> the shipped checkpoint, `eagle:b=2:/runs/x` -> /runs/x; None for untrained drafters."""
    kind, _, rest = label.partition(":")
    path = rest.rsplit(":", 1)[-1] if rest else ""
    if "/" in path:  # a checkpoint that is not on this machine has no config to read
        return Path(path) if Path(path).is_dir() else None
    if path and Path(path).is_dir():
        return Path(path)
    return SHIPPED / kind if (SHIPPED / kind / "config.json").is_file() else None


def points(
    reports: list[dict], overrides: dict[str, int], names: dict[str, str] | None = None, k: int | None = None
) -> list[dict]:
    """k: from a bench run over several k (labels `drafter@kN`), keep the rows of this k only."""
    out = []
    for report in reports:
        for row in report["rows"]:
            label, _, row_k = row["drafter"].partition("@k")
            if row["category"] != "ALL" or label == "none" or row["acceptance_rate"] is None:
                continue
            if k is not None and row_k and int(row_k) != k:
                continue
            directory = checkpoint_dir(label)
            config = json.loads((directory / "config.json").read_text()) if directory else {}
            tokens = overrides.get(label, config.get("train", {}).get("response_tokens"))
            if tokens is None:
                continue
            out.append(
                {
                    "drafter": label,
                    "k": int(row_k) if row_k else None,
                    "series": (names or {}).get(label, series(label)),
                    "train_tokens": int(tokens),
                    "train": config.get("train"),
                    "dtype": row["dtype"],
                    "alpha_by_position": row["acceptance_by_position"],
                    "alpha": row["acceptance_rate"],
                    "tau": row["mean_accepted_length"],
                    "speedup_vs_none": row["speedup_vs_none"],
                    "identical_to_none": row["identical_to_none"],
                }
            )
    return sorted(out, key=lambda p: (p["series"], p["train_tokens"]))


def plot(curve: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 5))
    for name in dict.fromkeys(p["series"] for p in curve):
        pts = [p for p in curve if p["series"] == name]
        xs = [p["train_tokens"] for p in pts]
        left.plot(
            xs, [p["alpha_by_position"][0] if p["alpha_by_position"] else 0 for p in pts], "o-", label=name
        )
        right.plot(xs, [p["tau"] for p in pts], "o-", label=name)
    for ax, ylabel in ((left, "held-out α at position 1"), (right, "τ (tokens per verify step)")):
        ax.set(xscale="log", xlabel="training response tokens", ylabel=ylabel)
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
    handles, labels = left.get_legend_handles_labels()  # one legend below both panels
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 * (len(labels) + 1) / 2, 1, 1))
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot")
    ap.add_argument(
        "--tokens", action="append", default=[], help="LABEL=N: training tokens of a drafter label"
    )
    ap.add_argument(
        "--series", action="append", default=[], help="LABEL=NAME: the curve a drafter label belongs to"
    )
    ap.add_argument("--k", type=int, default=None, help="from reports run over several k: this k's rows only")
    ap.add_argument(
        "--add-to",
        default=None,
        metavar="CURVE.json",
        help="keep an earlier curve's points (their checkpoints may be gone) and add these reports'",
    )
    args = ap.parse_args()
    overrides = {}
    for item in args.tokens:
        label, sep, n = item.rpartition("=")
        if not sep or not n.isdigit():
            raise SystemExit(f"--tokens needs LABEL=N, got {item!r}")
        overrides[label] = int(n)
    names = {}
    for item in args.series:
        label, sep, name = item.rpartition("=")
        if not sep or not label or not name:
            raise SystemExit(f"--series needs LABEL=NAME, got {item!r}")
        names[label] = name
    curve = points([json.loads(Path(r).read_text()) for r in args.reports], overrides, names, args.k)
    earlier = json.loads(Path(args.add_to).read_text()) if args.add_to else {"points": [], "reports": []}
    curve = sorted(earlier["points"] + curve, key=lambda p: (p["series"], p["train_tokens"]))
    if not curve:
        raise SystemExit("no trained drafter rows with known training tokens in these reports")
    Path(args.out).write_text(
        json.dumps({"points": curve, "reports": earlier["reports"] + args.reports}, indent=1)
    )
    if args.plot:
        plot(curve, args.plot)
    for p in curve:
        print(
            f"{p['drafter']:40s} {p['train_tokens']:>9,d} tokens  "
            f"α1 {p['alpha_by_position'][:1]}  τ {p['tau']:.2f}"
        )


if __name__ == "__main__":
    main()
