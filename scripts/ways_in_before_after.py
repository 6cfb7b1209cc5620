"""The Python API before and after a change, each build in its own process, interleaved: wall time
of `LLM.generate` over a prompt set (all prompts at once), plain, with a drafter, and routed by a
config (routes per task), with a hash of the token lists so that equal outputs show.

    python3 scripts/ways_in_before_after.py --builds before=/path/to/old/src,after=src \
        --prompts mixed:2 --repeats 3 --out docs/results/FILE.json

Each run: one process per (build, case), the model loaded once, one warm-up call, then the timed
call. Builds alternate within each repeat; the figure that counts is the ratio within a repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import hashlib, json, sys, time
from specdecode import LLM, SamplingParams
from specdecode.corpora import load_prompts
case, model, prompts_spec, tokens, config = sys.argv[1:6]
prompts = [p.prompt for p in load_prompts(prompts_spec)]
kw = {"config": config} if case == "routed" else {}
drafter = {"plain": "none", "routed": "ngram"}.get(case) or case.split("=")[-1]
llm = LLM(model if model != "default" else None, drafter, dtype="gguf", **kw)
params = SamplingParams(temperature=0, max_tokens=int(tokens), ignore_eos=True)
llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
t0 = time.perf_counter()
outs = llm.generate(prompts, params)
wall = time.perf_counter() - t0
ids = [o.token_ids for o in outs]
print(json.dumps({"wall_s": wall, "tokens": sum(map(len, ids)),
                  "hash": hashlib.sha1(str(ids).encode()).hexdigest()[:12]}))
"""

CONFIG = {
    "version": 1,
    "default": {"drafter": "ngram", "k": 4, "adaptive": False},
    "routing": {"creative": {"drafter": "none", "k": 1, "adaptive": False}},
    "candidates": ["none", "ngram"],
}


def run(src: str, case: str, args, config: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    cmd = [sys.executable, "-c", CHILD, case, args.model, args.prompts, str(args.max_new_tokens), config]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", required=True, help="NAME=SRC_DIR,NAME=SRC_DIR")
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", default="mixed:2")
    ap.add_argument("--cases", default="plain,drafter=ngram,routed")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    builds = dict(b.split("=", 1) for b in args.builds.split(","))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(CONFIG, f)
    rows = []
    for repeat in range(args.repeats):
        for case in args.cases.split(","):
            for name, src in builds.items() if repeat % 2 == 0 else reversed(builds.items()):
                t0 = time.time()
                r = run(src, case, args, f.name)
                rows.append({"repeat": repeat, "case": case, "build": name, **r, "began": t0})
                print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for case in args.cases.split(","):
        walls = {
            n: statistics.median(r["wall_s"] for r in rows if r["case"] == case and r["build"] == n)
            for n in builds
        }
        hashes = {
            n: sorted({r["hash"] for r in rows if r["case"] == case and r["build"] == n}) for n in builds
        }
        summary[case] = {"median_wall_s": walls, "hashes": hashes}
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""
    )
    fam = [
        ln.split(":", 1)[1].strip()
        for ln in open("/proc/cpuinfo")
        if ln.startswith(("cpu family", "model\t"))
    ][:2]
    result = {
        "command": " ".join(sys.argv),
        "cpu": f"{cpu} (family {fam[0]}, model {fam[1]})" if len(fam) == 2 else cpu,
        "threads": os.cpu_count(),
        "python": platform.python_version(),
        "config": CONFIG,
        "builds": builds,
        "summary": summary,
        "rows": rows,
    }
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
