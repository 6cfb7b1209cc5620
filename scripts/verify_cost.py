"""T(1) and r(n) = T(n) / T(1) of the default target per dtype: what verifying n - 1 drafts costs.

    python3 scripts/verify_cost.py [--target M] [--dtypes fp32,gguf-exact,gguf] [--rows 8]
                                   [--threads 2] [--context 100] [--repeats 7] [--out F.json]

T(n) is one target forward of n new tokens after `--context` cached ones (a chain verification's
shape; n = 1 is a decoding step), the cache truncated back after each. Every dtype's model is loaded
in the same process; sizes and dtypes are interleaved in every round, so a slow phase of the machine
hits them alike; medians over `--repeats` rounds, raw (not smoothed to a non-decreasing curve as the
cost model's `costs.measure` does). Reported per dtype: T1_ms and r for n = 1..rows (r[0] = 1).
`scripts/anatomy.py` splits the same T(n) into matmuls, attention and the rest. The CPU is named in
the output; run it with nothing else running.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from anatomy import write_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None)
    p.add_argument("--dtypes", default="fp32,gguf-exact,gguf")
    p.add_argument("--rows", type=int, default=8, help="the largest n")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=100, help="cached tokens before each timed forward")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from specdecode.backends import models
    from specdecode.backends.precision import Precision

    dtypes = a.dtypes.split(",")
    gen = torch.Generator().manual_seed(0)
    built, bases = {}, {}
    for dtype in dtypes:
        model = built[dtype] = models.load(a.target, Precision.parse(dtype)).model
        model.reset()
        model.forward(torch.randint(model.vocab_size, (a.context,), generator=gen), num_logits=1)
        bases[dtype] = model.length
    step = torch.randint(built[dtypes[0]].vocab_size, (a.rows,), generator=gen)
    sizes = range(1, a.rows + 1)

    def forward(dtype: str, n: int) -> float:
        model = built[dtype]
        t0 = time.perf_counter()
        model.extend(step[:n])
        model.truncate(bases[dtype])
        return time.perf_counter() - t0

    for dtype in dtypes:  # warm-up: a new size's first call pays one-off set-up
        for n in sizes:
            forward(dtype, n)
    samples = {d: {n: [] for n in sizes} for d in dtypes}
    for _ in range(a.repeats):
        for dtype in dtypes:
            for n in sizes:
                samples[dtype][n].append(forward(dtype, n))
    report = {}
    for dtype in dtypes:
        t = {n: statistics.median(v) for n, v in samples[dtype].items()}
        report[dtype] = {"T1_ms": round(1e3 * t[1], 2), "r": [round(t[n] / t[1], 2) for n in sizes]}
        print(f"{dtype:>10}: T(1) {report[dtype]['T1_ms']:.2f} ms, r(n) {report[dtype]['r']}")
    if a.out:
        write_report(a.out, report, "verify_cost.py", argv, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
