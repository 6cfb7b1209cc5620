"""`specdecode advise --from-metrics SOURCE`: k, and k per batch size, for the drafter a running server
(vLLM or ours) serves, from its acceptance counters over a window and measured costs.

The counters give, per draft position i (0-based), A_i = drafts whose tokens 0..i were all accepted,
and the drafts D. The control model (decoding/control.py) wants conditional figures:

    acceptance a_i = P(i accepted | 0..i-1 accepted, i drafted),   supply s_i = P(i drafted | i-1 drafted)

With our server's drafted-per-position counter N_i (N_0 = D): s_i = N_i / N_{i-1} and
a_i = (A_i / A_{i-1}) / s_i (A_{-1} = D), exact when a draft's length does not depend on whether
its earlier tokens are accepted. With vLLM's counters alone N_i is unknown: a_i = A_i / A_{i-1} is
then supply x acceptance, which keeps E(k) (expected tokens per step) right and charges every step
the cost of a full k-token draft, so for variable-length drafters (suffix, ngram) the advice errs
towards a smaller k (tracker.py says where the monitor's per-position figure is biased).
Positions beyond the served k are extrapolated with the last measured a_i (control._at).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specdecode.decoding.control import best_k, predicted_speedup
from specdecode.errors import UserError
from specdecode.monitor import prom
from specdecode.monitor.tracker import Counts, Tracker


@dataclass(frozen=True)
class Profile:
    acceptance: list[float]  # a_i, conditional
    supply: list[float] | None  # s_i; None: not measured (vLLM), taken as 1 with a_i = supply x acceptance
    drafts: float
    served_k: int  # positions the counters cover

    def to_json(self) -> dict:
        r = lambda xs: None if xs is None else [round(x, 4) for x in xs]  # noqa: E731
        return {
            "acceptance": r(self.acceptance),
            "supply": r(self.supply),
            "drafts": self.drafts,
            "served_k": self.served_k,
        }


def profile(counts: Counts) -> Profile:
    """Counter totals (or a window's increases) -> conditional acceptance and supply per position."""
    size = max(counts.per_pos.keys() | counts.drafted_pos.keys(), default=-1) + 1
    if not counts.drafts or size == 0:
        raise UserError(
            "the counters hold no drafts yet: send traffic to the server first (or widen --window)"
        )
    accepted = [counts.per_pos.get(i, 0.0) for i in range(size)]
    drafted = [counts.drafted_pos.get(i, 0.0) for i in range(size)] if counts.drafted_pos else None
    acceptance, supply = [], [] if drafted else None
    prev_a, prev_n = counts.drafts, counts.drafts
    for i in range(size):
        s = 1.0
        if drafted:
            s = drafted[i] / prev_n if prev_n else 0.0
            supply.append(s)
            prev_n = drafted[i]
        ratio = accepted[i] / prev_a if prev_a else 0.0
        acceptance.append(min(1.0, ratio / s) if s else 0.0)
        prev_a = accepted[i]
    return Profile(acceptance, supply, counts.drafts, size)


def read(source: str, window_s: float, timeout: float = 5.0) -> tuple[Counts, float]:
    """The counters over `window_s` seconds (two scrapes), or their totals (window 0) -> (counts, span).
    A saved scrape file gives its totals at once, whatever the window: it does not change while we
    wait, so a window over it would only sleep and then hold no drafts."""
    live = prom.is_live(source)
    tracker = Tracker(window_s=max(window_s, 1.0), min_draft_tokens=0)

    def scrape():
        text = prom.fetch(source, timeout)
        try:
            return tracker.update(time.time(), prom.parse(text))
        except ValueError as e:
            raise UserError(f"{source} is not Prometheus text: {e}") from None

    first = scrape()
    if first.prefix is None:
        raise UserError(f"no spec_decode counters at {source}: is the server speculating?")
    totals = first.groups["all"].total
    if not live and not totals.drafts:  # profile's hint (send traffic, widen the window) is a live server's
        raise UserError(
            f"{source} holds no drafts in its spec_decode counters: save a scrape taken after the "
            "server has served speculative traffic"
        )
    if window_s <= 0 or not live:
        return totals, 0.0
    time.sleep(window_s)
    snap = scrape()
    return snap.groups["all"].window, snap.window_s


@dataclass(frozen=True)
class Advice:
    k: int  # at batch size 1 (0: do not speculate)
    speedup: float  # predicted, at k, batch size 1
    by_k: dict[int, float]  # predicted speedup per k at batch size 1
    schedule: list[tuple[int, int, int]]  # (first, last, k) by batch size, inclusive
    schedule_speedup: dict[int, float]  # measured batch size -> predicted speedup at its k

    def to_json(self) -> dict:
        return {
            "k": self.k,
            "predicted_speedup": round(self.speedup, 3),
            "predicted_speedup_by_k": {str(k): round(v, 3) for k, v in self.by_k.items()},
            "k_by_batch_size": [list(r) for r in self.schedule],
            "predicted_speedup_by_batch_size": {
                str(b): round(v, 3) for b, v in self.schedule_speedup.items()
            },
        }


def advise(prof: Profile, cost_at, batch_sizes: list[int], k_max: int) -> Advice:
    """cost_at(b) -> the CostModel of one request at batch size b (ratios to T(b, 1)); batch_sizes
    ascending, from 1: the measured sizes; each covers the sizes above the previous one. k never
    grows with the batch (verifying k tokens for b rows costs more relative to one token as b grows;
    a measurement on a busy machine that says otherwise is noise), so each size's best k is capped
    by the smaller sizes'."""
    one = cost_at(1)
    by_k = {k: predicted_speedup(prof.acceptance, one, k, prof.supply) for k in range(1, k_max + 1)}
    k, speed = best_k(prof.acceptance, one, k_max, prof.supply)
    rows, speeds, lo, cap = [], {}, 1, k_max
    for b in batch_sizes:
        cost = cost_at(b)
        kb, _ = best_k(prof.acceptance, cost, cap, prof.supply)
        cap, speeds[b] = kb, predicted_speedup(prof.acceptance, cost, kb, prof.supply)
        if rows and rows[-1][2] == kb:
            rows[-1] = (rows[-1][0], b, kb)
        else:
            rows.append((lo, b, kb))
        lo = b + 1
    return Advice(k, speed, by_k, rows, speeds)


def render(prof: Profile, counts: Counts, advice: Advice, span_s: float, source: str) -> str:
    window = (
        f"over {span_s:.0f} s" if span_s else "totals" if prom.is_live(source) else "saved scrape, totals"
    )
    lines = [
        f"{source} ({window}): {counts.drafts:.0f} drafts, α {counts.alpha:.3f}, τ {counts.tau:.2f}, "
        f"mean draft length {counts.mean_draft_length:.2f} of k={prof.served_k}",
        "position   " + " ".join(f"{i + 1:>6}" for i in range(prof.served_k)),
        "per draft  " + " ".join(f"{x:6.3f}" for x in counts.by_position),
        "a_i        " + " ".join(f"{x:6.3f}" for x in prof.acceptance),
    ]
    if prof.supply:
        lines.append("s_i        " + " ".join(f"{x:6.3f}" for x in prof.supply))
    lines.append("k          " + " ".join(f"{k:>6}" for k in advice.by_k))
    lines.append("speedup    " + " ".join(f"{v:6.3f}" for v in advice.by_k.values()))
    lines.append(f"advice: k={advice.k} (predicted {advice.speedup:.2f}x at batch size 1)")
    lines.append(
        "k by batch size: "
        + ", ".join(f"{lo}-{hi}: {k}" for lo, hi, k in advice.schedule)
        + " (num_speculative_tokens_per_batch_size)"
    )
    return "\n".join(lines)
