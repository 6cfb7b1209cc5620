"""k = 1..K on a real vLLM with one exported drafter, the same traffic each time, against the k that
`specdecode advise --from-metrics` picks from the counters of the run at the largest k.

For each k (in the order given): export (fp32), start vLLM (pinned), send the prompts greedy from
`--clients` clients, time it (output tokens / wall seconds), save the /metrics scrape, stop vLLM.
Then advise reads the scrape of the largest k (totals) and its pick is compared with the sweep's best.

  python3 scripts/vllm_k_sweep.py --drafter eagle --ks 1,2,3,4,5,6 --out docs/results/X.json

(--ks in the order given; --advise-from reads another run's scrape, e.g. an earlier k = 6 run.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_e2e import ROOT, _chat, _export, load_prompts, vllm_local  # noqa: E402


def one_k(args, prompts, k: int, work: Path) -> dict:
    out = work / f"k{k}"
    _export(args.drafter, k, out, args.port)
    env = vllm_local.cpu_env(args.threads, args.cpus, kv_cache_gib=2)
    extra = (
        "--generation-config",
        "vllm",
        "--max-num-seqs",
        str(max(args.clients, 1)),
        *args.vllm_args.split(),
    )
    with vllm_local.serving(
        out / "serve.sh", args.port, work / f"k{k}.log", extra_args=extra, env=env, taskset=args.taskset
    ) as url:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        with httpx.Client(timeout=600) as client, ThreadPoolExecutor(args.clients) as pool:
            _chat(client, url, model, prompts[0].prompt, 8)  # warm-up
            t0 = time.perf_counter()
            answers = list(pool.map(lambda p: _chat(client, url, model, p.prompt, args.max_tokens), prompts))
            wall = time.perf_counter() - t0
        scrape = httpx.get(url + "/metrics").text
    (work / f"k{k}.metrics.txt").write_text(scrape)
    tokens = sum(a["usage"]["completion_tokens"] for a in answers if "usage" in a)
    return {
        "k": k,
        "errors": sum("error" in a for a in answers),
        "completion_tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 2),
        "metrics_file": str(work / f"k{k}.metrics.txt"),
    }


def advise(scrape: Path, drafter: str, k_max: int, clients: int) -> dict:
    report = scrape.with_suffix(".advice.json")
    argv = [sys.executable, "-m", "specdecode", "advise", "--from-metrics", str(scrape), "--window", "0"]
    argv += ["--drafter", drafter, "--k-max", str(k_max), "--max-batch", str(max(clients, 1))]
    argv += ["--dtype", "fp32", "--threads", "1", "--out", str(scrape.with_suffix(".config.json"))]
    argv += ["--report", str(report)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode:
        return {"error": done.stderr[-2000:]}
    return {"stdout": done.stdout, **json.loads(report.read_text())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", default="eagle")
    p.add_argument("--ks", default="1,2,3,4,5,6")
    p.add_argument("--prompts", default="heldout:4")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cpus", default="1")
    p.add_argument("--taskset", default="1")
    p.add_argument("--port", type=int, default=8124)
    p.add_argument(
        "--advise-from", help="the scrape advise reads (default: this sweep's run at the largest k)"
    )
    p.add_argument("--k-max", type=int, default=None, help="advise's largest k (default: the largest swept)")
    p.add_argument("--vllm-args", default="", help="more vllm serve arguments, e.g. -O0 (no torch.compile)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    prompts = load_prompts(args.prompts)
    ks = [int(k) for k in args.ks.split(",")]
    work = Path(tempfile.mkdtemp(prefix="vllm_sweep_"))
    runs = []
    for k in ks:
        try:
            runs.append(one_k(args, prompts, k, work))
        except Exception as e:
            runs.append({"k": k, "error": f"{type(e).__name__}: {e}"[-2000:]})
        print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    ok = [r for r in runs if "tokens_per_s" in r]
    best = max(ok, key=lambda r: r["tokens_per_s"]) if ok else None
    scrape = Path(args.advise_from) if args.advise_from else work / f"k{max(ks)}.metrics.txt"
    advice = advise(scrape, args.drafter, args.k_max or max(ks), args.clients) if scrape.is_file() else None
    picked = None
    if advice and "k" in advice and best:
        k_served = advice["k"]
        if args.clients > 1:  # the schedule's k at this batch size
            k_served = next(k for lo, hi, k in advice["k_by_batch_size"] if args.clients <= hi)
        match = next((r for r in ok if r["k"] == k_served), None)
        picked = {
            "k": k_served,
            "tokens_per_s": match and match["tokens_per_s"],
            "of_best": match and round(match["tokens_per_s"] / best["tokens_per_s"], 3),
        }
    result = {
        "drafter": args.drafter,
        "prompts": args.prompts,
        "n_prompts": len(prompts),
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "vllm_threads": args.threads,
        "taskset": args.taskset,
        "vllm_args": args.vllm_args,
        "runs": sorted(runs, key=lambda r: r["k"]),
        "best": best,
        "advice": advice,
        "advised": picked,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"best": best, "advised": picked}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
