"""`specdecode monitor SOURCE`: scrape a Prometheus endpoint every --interval seconds and show α, τ
and per-position acceptance over a sliding --window, with the drift alert."""

from __future__ import annotations

import argparse
import json
import time

from specdecode.decoding.taskstate import DRIFT_DROP
from specdecode.errors import UserError
from specdecode.monitor import prom
from specdecode.monitor.tracker import Snapshot, Tracker
from specdecode.monitor.view import render, to_json


def add_parser(sub) -> None:
    m = sub.add_parser(
        "monitor", help="α, τ and per-position acceptance of a vLLM or specdecode server's /metrics"
    )
    m.add_argument(
        "source", help="http://host:port/metrics (or host:port), a file:// URL or a file of metrics text"
    )
    m.add_argument("--interval", type=float, default=5.0, help="seconds between scrapes")
    m.add_argument("--window", type=float, default=60.0, help="sliding window in seconds")
    m.add_argument(
        "--json", action="store_true", help="print one JSON object per scrape instead of the live view"
    )
    m.add_argument("--once", action="store_true", help="scrape once and report the counters' totals")
    m.add_argument("--count", type=int, default=None, help="stop after this many scrapes")
    m.add_argument(
        "--by", help="also report per value of this label (specdecode: task, drafter; vLLM: engine)"
    )
    m.add_argument(
        "--drift-drop",
        type=float,
        default=DRIFT_DROP,
        help="alert when windowed α falls this fraction below the baseline",
    )
    m.add_argument(
        "--baseline-alpha", type=float, default=None, help="baseline α (default: the first full window's)"
    )
    m.add_argument(
        "--min-draft-tokens", type=float, default=50, help="windows with fewer draft tokens raise no alert"
    )
    m.add_argument("--timeout", type=float, default=5.0, help="seconds per scrape")
    m.set_defaults(run=run)


def scrape(tracker: Tracker, source: str, timeout: float) -> Snapshot:
    text = prom.fetch(source, timeout)
    try:
        samples = prom.parse(text)
    except ValueError as e:
        raise UserError(f"{source} is not Prometheus text: {e}") from None
    return tracker.update(time.time(), samples)


def _check(args) -> int | None:
    if not args.interval > 0 or not args.window > 0 or not args.timeout > 0:
        raise UserError("--interval, --window and --timeout must be positive")
    if not 0 < args.drift_drop < 1:
        raise UserError(f"--drift-drop must be between 0 and 1, got {args.drift_drop}")
    if args.count is not None and args.count < 1:
        raise UserError(f"--count must be >= 1, got {args.count}")
    return 1 if args.once else args.count


def run(args: argparse.Namespace) -> None:
    count = _check(args)
    tracker = Tracker(args.window, args.drift_drop, args.baseline_alpha, args.min_draft_tokens, args.by)
    first = scrape(tracker, args.source, args.timeout)  # an unreachable source is a user error up front
    if first.prefix is None and count == 1:
        raise UserError(
            f"no spec_decode counters at {args.source} (vllm:spec_decode_* or specdecode:spec_decode_*); "
            "is speculative decoding enabled?"
        )
    if args.json:
        _print_json(tracker, args, first, count)
    else:
        _live(tracker, args, first, count)


def _scrapes(tracker: Tracker, args, count: int | None):
    """Later scrapes on a fixed schedule -> (snapshot or None, error or None); errors do not stop it."""
    start, n = time.monotonic(), 1
    while count is None or n < count:
        time.sleep(max(0.0, start + n * args.interval - time.monotonic()))
        n += 1
        try:
            yield scrape(tracker, args.source, args.timeout), None
        except UserError as e:
            yield None, str(e)


def _print_json(tracker, args, first, count) -> None:
    print(json.dumps(to_json(first, args.source)), flush=True)
    for snap, error in _scrapes(tracker, args, count):
        obj = (
            to_json(snap, args.source)
            if snap
            else {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "error": error}
        )
        print(json.dumps(obj), flush=True)


def _live(tracker, args, first, count) -> None:
    from rich.console import Console
    from rich.live import Live

    if count == 1:
        Console().print(render(first, args.source))
        return
    last = first
    with Live(render(first, args.source), refresh_per_second=4) as live:
        for snap, error in _scrapes(tracker, args, count):
            last = snap or last
            live.update(render(last, args.source, error))
