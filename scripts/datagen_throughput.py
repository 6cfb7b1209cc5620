"""Response tokens per second of `specdecode train data` at several batch sizes (issue 18), each batch
size on the same prompts into a fresh directory, one after another; prints and writes JSON.

    python3 scripts/datagen_throughput.py --out results.json [--batches 1,8,32] [--prompts reasoning:1]
        [--limit-minutes 3] [--threads 1] [--dtype gguf-exact] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return match.group(1) if match else platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--prompts", default="reasoning:1")
    ap.add_argument(
        "--limit-minutes", type=float, default=3.0, help="stop starting new prompts after this long"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="gguf-exact")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    results = {
        "cpu": cpu_model(),
        "threads": args.threads,
        "dtype": args.dtype,
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "batches": {},
    }
    for batch in [int(b) for b in args.batches.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [
                sys.executable,
                "-m",
                "specdecode",
                "train",
                "data",
                "--prompts",
                args.prompts,
                "--exclude",
                "",
                "--out",
                tmp,
                "--batch",
                str(batch),
                "--threads",
                str(args.threads),
                "--dtype",
                args.dtype,
                "--max-new-tokens",
                str(args.max_new_tokens),
                "--minutes",
                str(args.limit_minutes),
            ]
            t0 = time.perf_counter()  # includes loading the model (a few seconds)
            run = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if run.returncode != 0:
                raise SystemExit(f"batch {batch} failed:\n{run.stderr[-2000:]}")
            match = re.search(r"(\d+) sequences, (\d+) response tokens", run.stdout)
            seqs, tokens = int(match.group(1)), int(match.group(2))
        results["batches"][str(batch)] = {
            "prompts": seqs,
            "response_tokens": tokens,
            "wall_s": round(wall, 1),
            "tokens_per_s": round(tokens / wall, 1),
        }
        print(
            f"batch {batch}: {seqs} prompts, {tokens} response tokens in {wall:.0f} s: "
            f"{tokens / wall:.1f} tok/s",
            flush=True,
        )
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
