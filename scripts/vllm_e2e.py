"""Every exported drafter served by a real vLLM, its acceptance compared with our engine's.

For each drafter: `specdecode export vllm` (fp32, so both engines run the same weights), start vLLM
from $VLLM_VENV (scripts/install_vllm.sh), send the prompts as greedy chat requests, read the
acceptance counters with `specdecode monitor --once --json` and the per-request step arrays of
`--per-request-spec-decode-metrics detailed`, stop vLLM. Our engine decodes the same prompts with the
same drafter and fixed k (greedy). Both sides report acceptance at position i two ways:

    per draft    accepted at i / drafts                 (vLLM's counters, the monitor's figure)
    per drafted  accepted at i / drafts that reached i  (unbiased for variable-length drafts)

The two sides run as separate processes so they can overlap (acceptance does not depend on speed):

  python3 scripts/vllm_e2e.py vllm --out /tmp/e2e_vllm.json      # needs the vLLM environment
  python3 scripts/vllm_e2e.py ours --out /tmp/e2e_ours.json
  python3 scripts/vllm_e2e.py merge /tmp/e2e_vllm.json /tmp/e2e_ours.json --out docs/results/X.json
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from specdecode.corpora import load_prompts  # noqa: E402
from specdecode.export import vllm_local  # noqa: E402

DRAFTERS = "ngram,suffix,draft,eagle,medusa"


def figures(drafts: int, draft_tokens: int, drafted: list[int], accepted: list[int]) -> dict:
    """Counts -> both acceptance figures per position, α and τ."""
    acc = sum(accepted)
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": acc,
        "drafted_by_pos": drafted,
        "accepted_by_pos": accepted,
        "alpha": round(acc / draft_tokens, 4) if draft_tokens else None,
        "tau": round(1 + acc / drafts, 4) if drafts else None,
        "mean_draft_length": round(draft_tokens / drafts, 3) if drafts else None,
        "per_draft": [round(x / drafts, 4) if drafts else None for x in accepted],
        "per_drafted": [round(x / n, 4) if n else None for x, n in zip(accepted, drafted)],
    }


def from_steps(steps: list[tuple[int, int]], k: int) -> dict:
    """(drafted, accepted) per verify step (vLLM's per-request arrays) -> figures."""
    drafted, accepted = [0] * k, [0] * k
    for d, a in steps:
        for i in range(min(d, k)):
            drafted[i] += 1
        for i in range(min(a, k)):
            accepted[i] += 1
    return figures(sum(d > 0 for d, _ in steps), sum(d for d, _ in steps), drafted, accepted)


def _export(
    drafter: str,
    k: int,
    out: Path,
    port: int,
    dtype: str = "float32",
    per_request: str = "detailed",
    target: str | None = None,
) -> None:
    argv = [sys.executable, "-m", "specdecode", "export", "vllm", "--drafter", drafter, "--k", str(k)]
    argv += ["--target", target] if target else []
    argv += ["--out", str(out), "--serve-dtype", dtype, "--port", str(port), "--max-model-len", "4096"]
    argv += ["--per-request-metrics", per_request]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)


def _chat(client: httpx.Client, url: str, model: str, prompt: str, max_tokens: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0}
    r = client.post(url + "/v1/chat/completions", json={**body, "max_tokens": max_tokens, "seed": 0})
    if r.status_code != 200:
        return {"error": f"HTTP {r.status_code}: {r.text[:300]}"}
    out = r.json()
    spec = (out.get("metrics") or {}).get("speculative_decoding") or {}
    steps = list(zip(spec.get("per_step_drafted") or [], spec.get("per_step_accepted") or []))
    return {"text": out["choices"][0]["message"]["content"], "steps": steps, "usage": out["usage"]}


def _monitor(url: str) -> dict:
    argv = [sys.executable, "-m", "specdecode", "monitor", url + "/metrics", "--once", "--json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    if done.returncode:
        return {"error": done.stderr.strip()[-500:]}
    return json.loads(done.stdout.splitlines()[0])


def run_vllm(args, prompts) -> dict:
    work = Path(tempfile.mkdtemp(prefix="vllm_e2e_"))
    results = {}
    for drafter in args.drafters.split(","):
        out, started = work / drafter, time.monotonic()
        _export(drafter, args.k, out, args.port, target=args.target)
        env = vllm_local.cpu_env(args.threads, args.cpus, kv_cache_gib=2)
        extra = ("--generation-config", "vllm", "--max-num-seqs", str(args.concurrency))
        row = {"drafter": drafter, "k": args.k}
        try:
            with vllm_local.serving(
                out / "serve.sh",
                args.port,
                work / f"{drafter}.log",
                extra_args=extra,
                env=env,
                taskset=args.taskset,
            ) as url:
                row["start_s"] = round(time.monotonic() - started, 1)
                model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
                with httpx.Client(timeout=600) as client, ThreadPoolExecutor(args.concurrency) as pool:
                    answers = list(
                        pool.map(lambda p, m=model: _chat(client, url, m, p.prompt, args.max_tokens), prompts)
                    )
                row["monitor"] = _monitor(url)
                if args.save_metrics:
                    Path(args.save_metrics, f"{drafter}.metrics.txt").write_text(
                        httpx.get(url + "/metrics").text
                    )
        except Exception as e:  # one drafter failing must not lose the others' results
            row["error"] = f"{type(e).__name__}: {e}"[-3000:]
            results[drafter] = row
            print(f"{drafter}: {row['error'][:400]}", file=sys.stderr)
            continue
        errors = [a["error"] for a in answers if "error" in a]
        row["errors"] = errors[:5]
        row["served"] = len(answers) - len(errors)
        row["texts"] = [a.get("text") for a in answers]
        row["completion_tokens"] = sum(a["usage"]["completion_tokens"] for a in answers if "usage" in a)
        row["acceptance"] = from_steps([s for a in answers for s in a.get("steps", [])], args.k)
        results[drafter] = row
        monitor = row["monitor"].get("total") or {}
        seen = monitor.get("acceptance_by_position")
        print(
            f"{drafter}: served {row['served']}/{len(prompts)}, monitor {seen}", file=sys.stderr, flush=True
        )
    return results


def run_ours(args, prompts) -> dict:
    import torch

    from specdecode import drafters
    from specdecode.backends import models
    from specdecode.backends.precision import FP32
    from specdecode.core.metrics import Stats
    from specdecode.core.sampling import Warp
    from specdecode.decoding.control import FixedK
    from specdecode.decoding.generation import generate

    torch.set_num_threads(args.threads)
    target = models.load(args.target, FP32, "cpu", "auto")
    ctx = drafters.DrafterContext(target, FP32, "cpu", "auto")
    results = {}
    for spec in args.drafters.split(","):
        drafter, total, texts, started = drafters.build(spec, ctx), Stats(), [], time.monotonic()
        for p in prompts:
            r = generate(
                target,
                drafter,
                p.prompt,
                k=FixedK(args.k),
                params=Warp(),
                max_new_tokens=args.max_tokens,
                chat=True,
            )
            texts.append(r.text)
            total = total.merge(r.stats)
        pad = lambda xs: (list(xs) + [0] * args.k)[: args.k]  # noqa: E731
        acceptance = figures(
            total.drafts, total.drafted, pad(total.drafted_by_pos), pad(total.accepted_by_pos)
        )
        results[spec] = {
            "drafter": spec,
            "k": args.k,
            "texts": texts,
            "acceptance": acceptance,
            "completion_tokens": total.new_tokens,
            "seconds": round(time.monotonic() - started, 1),
        }
        print(f"ours {spec}: {acceptance['per_draft']}", file=sys.stderr, flush=True)
    return results


def merge(vllm_file: str, ours_file: str) -> dict:
    """Both sides per drafter: figures, the differences per position, and how many texts agree."""
    theirs, ours = (json.loads(Path(f).read_text())["results"] for f in (vllm_file, ours_file))
    rows = {}
    for name in theirs:
        v, o = theirs[name], ours.get(name)
        row = {"vllm": {k: x for k, x in v.items() if k != "texts"}, "ours": None}
        if o and "acceptance" in v:
            row["ours"] = {k: x for k, x in o.items() if k != "texts"}
            for fig in ("per_draft", "per_drafted"):
                row[f"diff_{fig}"] = [
                    None if a is None or b is None else round(a - b, 4)
                    for a, b in zip(v["acceptance"][fig], o["acceptance"][fig])
                ]
            row["same_text"] = sum(a == b for a, b in zip(v["texts"], o["texts"]))
        rows[name] = row
    return {"side": "merged", "results": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("side", choices=["vllm", "ours", "merge"])
    p.add_argument("inputs", nargs="*", help="merge: the vllm and ours result files")
    p.add_argument("--drafters", default=DRAFTERS)
    p.add_argument("--target", default=None, help="the target model (default: the default model)")
    p.add_argument("--prompts", default="heldout:8", help="prompt set (heldout:8 is 32 prompts)")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8, help="vLLM: requests in flight")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cpus", default="1", help="vLLM: VLLM_CPU_OMP_THREADS_BIND")
    p.add_argument("--taskset", default="1", help="vLLM: taskset -c CPUS ('' for none)")
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--save-metrics", help="vllm: write each drafter's /metrics text into this directory")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    prompts = load_prompts(args.prompts)
    if args.side == "vllm":
        result = {"side": "vllm", "results": run_vllm(args, prompts)}
    elif args.side == "ours":
        result = {"side": "ours", "results": run_ours(args, prompts)}
    else:
        result = merge(*args.inputs)
    result.update(prompts=args.prompts, n_prompts=len(prompts), k=args.k, max_tokens=args.max_tokens)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
