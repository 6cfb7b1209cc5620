"""Views of a monitor Snapshot: one JSON object, or a rich table for the live terminal view."""

from __future__ import annotations

import time

from specdecode.monitor.tracker import ALL, Snapshot


def to_json(snap: Snapshot, source: str) -> dict:
    def group(view) -> dict:
        return {
            "total": view.total.to_json(),
            "window": view.window.to_json() if view.window else None,
            "baseline_alpha": None if view.baseline_alpha is None else round(view.baseline_alpha, 4),
            "drift_alert": view.drift_alert,
        }

    out = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(snap.time)),
        "source": source,
        "prefix": snap.prefix,
        "window_s": round(snap.window_s, 3),
        "window_scrapes": snap.scrapes,
        "resets": snap.resets,
        **group(snap.groups[ALL]),
    }
    others = {name: group(view) for name, view in snap.groups.items() if name != ALL}
    if others:
        out["groups"] = others
    return out


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def render(snap: Snapshot, source: str, error: str | None = None):
    """A rich Table: one row per group (all, then by label), window and total α, τ and positions."""
    from rich.table import Table

    title = f"specdecode monitor · {source} · {snap.prefix or 'no spec_decode metrics'}"
    caption = (
        f"window {snap.window_s:.0f} s over {snap.scrapes} scrapes (α by position: window, else total) · "
        f"counter resets {snap.resets}" + (f" · [red]{error}[/red]" if error else "")
    )
    table = Table(title=title, caption=caption)
    for header in (
        "group",
        "α win",
        "τ win",
        "α total",
        "τ total",
        "drafts",
        "α by position",
        "base α",
        "drift",
    ):
        table.add_column(
            header,
            justify="left" if header in ("group", "α by position") else "right",
            no_wrap=header != "α by position",
        )
    for name, view in snap.groups.items():
        counts = view.window or view.total
        positions = " ".join(f"{x:.2f}" for x in counts.by_position[:8])
        table.add_row(
            name,
            _fmt(view.window.alpha if view.window else None),
            _fmt(view.window.tau if view.window else None, 2),
            _fmt(view.total.alpha),
            _fmt(view.total.tau, 2),
            f"{view.total.drafts:.0f}",
            positions,
            _fmt(view.baseline_alpha),
            "[bold red]ALERT[/bold red]" if view.drift_alert else "ok",
        )
    return table
