"""PNG plots of a `specdecode bench` report (matplotlib, headless): α by task, speedup vs k per
drafter, α vs temperature, ideal vs measured speedup, and overall speedup against plain decoding
and the Hugging Face peers.
"""

from __future__ import annotations

import re
from pathlib import Path

_K_LABEL = re.compile(r"^(?P<spec>.+)@k(?P<k>\d+)$")


def _overall(report: dict) -> list[dict]:
    return [r for r in report["rows"] if r["category"] == "ALL"]


def alpha_by_task(report: dict, ax) -> bool:
    rows = [r for r in report["rows"] if r["acceptance_rate"] is not None and r.get("speculates", True)]
    categories = list(dict.fromkeys(r["category"] for r in rows))
    series = list(dict.fromkeys((r["dtype"], r["drafter"]) for r in rows))
    if not rows:
        return False
    width = 0.8 / len(series)
    for j, (dtype, label) in enumerate(series):
        by_cat = {
            r["category"]: r["acceptance_rate"] for r in rows if (r["dtype"], r["drafter"]) == (dtype, label)
        }
        ax.bar(
            [i + j * width for i in range(len(categories))],
            [by_cat.get(c, 0) for c in categories],
            width,
            label=f"{dtype} {label}",
        )
    ax.set_xticks(
        [i + width * (len(series) - 1) / 2 for i in range(len(categories))], categories, rotation=30
    )
    ax.set(ylabel="acceptance rate α", title="α by task")
    ax.legend(fontsize="small")
    return True


def speedup_vs_k(report: dict, ax) -> bool:
    lines: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in _overall(report):
        m = _K_LABEL.match(r["drafter"])
        if m:
            lines.setdefault((r["dtype"], m["spec"]), []).append((int(m["k"]), r["speedup_vs_none"]))
    lines = {key: sorted(points) for key, points in lines.items() if len(points) > 1}
    if not lines:
        return False
    for (dtype, spec), points in lines.items():
        ax.plot([k for k, _ in points], [s for _, s in points], marker="o", label=f"{dtype} {spec}")
        adaptive = [r for r in _overall(report) if r["dtype"] == dtype and r["drafter"] == f"{spec}+adaptive"]
        if adaptive:
            ax.axhline(adaptive[0]["speedup_vs_none"], linestyle="--", label=f"{dtype} {spec}+adaptive")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xlabel="k (drafts per step)", ylabel="speedup vs plain (same dtype)", title="speedup vs k")
    ax.legend(fontsize="small")
    return True


def alpha_vs_temperature(report: dict, ax) -> bool:
    sweep = report.get("alpha_vs_temperature") or {}
    if not sweep:
        return False
    for dtype, by_label in sweep.items():
        for label, by_t in by_label.items():
            temps = sorted(by_t, key=float)
            ax.plot(
                [float(t) for t in temps],
                [by_t[t]["ALL"] for t in temps],
                marker="o",
                label=f"{dtype} {label}",
            )
    ax.set(xlabel="temperature", ylabel="acceptance rate α", title="α vs temperature")
    ax.legend(fontsize="small")
    return True


def ideal_vs_measured(report: dict, ax) -> bool:
    rows = [r for r in _overall(report) if r.get("ideal_speedup")]
    if not rows:
        return False
    names = [f"{r['dtype']} {r['drafter']}" for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["ideal_speedup"] for r in rows], 0.4, label="ideal E/(k·c + r)")
    ax.bar([x + 0.2 for x in xs], [r["speedup_vs_none"] for r in rows], 0.4, label="measured")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(list(xs), names, rotation=30, ha="right")
    ax.set(ylabel="speedup vs plain (same dtype)", title="ideal vs measured speedup")
    ax.legend(fontsize="small")
    return True


def overall(report: dict, ax) -> bool:
    rows = _overall(report)
    names = [f"{r['dtype']} {r['drafter']}" for r in rows]
    colors = ["tab:orange" if r["peer"] else "tab:blue" for r in rows]
    ax.bar(range(len(rows)), [r["speedup_vs_best_plain"] for r in rows], color=colors)
    for x, r in enumerate(rows):
        ax.text(
            x,
            r["speedup_vs_best_plain"],
            f"{r['identical_to_none'] * 100:.0f}%",
            ha="center",
            va="bottom",
            fontsize="x-small",
        )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(rows)), names, rotation=30, ha="right")
    ax.set(
        ylabel="speedup vs fastest plain decoding",
        title="overall (orange: Hugging Face; label: identical-output share)",
    )
    return True


PLOTS = {
    "alpha_by_task": alpha_by_task,
    "speedup_vs_k": speedup_vs_k,
    "alpha_vs_temperature": alpha_vs_temperature,
    "ideal_vs_measured": ideal_vs_measured,
    "speedup_overall": overall,
}


def write(report: dict, directory: str | Path) -> list[Path]:
    """Every plot the report has data for, as DIR/<name>.png -> the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, draw in PLOTS.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if draw(report, ax):
            fig.tight_layout()
            fig.savefig(directory / f"{name}.png", dpi=110)
            written.append(directory / f"{name}.png")
        plt.close(fig)
    return written
