"""The same traffic against `specdecode serve` and vLLM CPU on the same model: throughput, TTFT, ITL.

For each server (ours and vLLM, each without and with speculation) it starts the server pinned to
`--taskset` CPUs, then for each client count runs `--seconds` of load: every client sends greedy
streamed chat requests (the prompt set in turn, `--max-tokens` each) back to back; requests still
running at the end are awaited and counted. Reported per run: requests, errors, output tokens per
second (tokens counted with the target's tokenizer, the same for both servers), TTFT and ITL (per
request: (last chunk - first chunk) / (tokens - 1)) at p50 and p99. Streaming is measured with
scripts/load_server.py's `stream`. `--passes P` replays instead of timing: the clients send every
prompt once (untimed: the prefix cache and a suffix drafter's tree learn the set), then P rounds of
the set in a fixed order, timed; both sides of a comparison do the same work. One command re-runs
the whole table:

  python3 scripts/peer_load.py --out docs/results/peer_load_<cpu>.json

vLLM comes from $VLLM_VENV (scripts/install_vllm.sh) with the export's serve.sh (bf16 by default,
as the export writes it); ours runs its defaults (the GGUF target, int8 activations); `llamacpp` is
b11434's own `llama-server` (scripts/build_llamacpp.sh) on the same GGUF files, `llamacpp:draft:<model>`
with that draft (`-md`, draft-simple, at most k drafted), as many parallel slots as the most clients.
`--target` names the model for all three (default: the default model), e.g. the 1.5B with its 0.5B
sibling: --target qwen2.5-coder-1.5b --servers ours:none,ours:draft:qwen2.5-coder-0.5b,...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from anatomy import cpu_name  # noqa: E402
from load_server import launched, pct, stream  # noqa: E402
from vllm_e2e import ROOT, _export, load_prompts, vllm_local  # noqa: E402


@contextlib.contextmanager
def ours(
    drafter: str, k: int, port: int, taskset: str, threads: int, log: Path, max_batch: int, target: str = ""
):
    """`specdecode serve` on loopback until the block ends -> base URL (target: a model name or path,
    else the default)."""
    argv = [sys.executable, "-m", "specdecode", "serve", "--port", str(port), "--threads", str(threads)]
    argv += ["--drafter", drafter, "--k", str(k), "--max-batch", str(max_batch), "--queue", "256"]
    argv += ["--target", target] if target else []
    if taskset:
        argv = ["taskset", "-c", taskset, *argv]
    with launched(argv, port, log) as url:
        yield url


@contextlib.contextmanager
def llamacpp(drafter: str, k: int, port: int, taskset: str, threads: int, log: Path, slots: int, target):
    """llama.cpp b11434's llama-server on loopback until the block ends -> base URL."""
    import subprocess

    sys.path.insert(0, str(ROOT / "src"))
    from specdecode.backends import models

    built = subprocess.run(
        ["bash", str(HERE / "build_llamacpp.sh")], capture_output=True, text=True, check=True
    )
    bins = Path(built.stdout.strip().splitlines()[-1])  # the script prints where the binaries are
    argv = [str(bins / "llama-server"), "-m", str(models.resolve(target)), "--port", str(port)]
    argv += ["-t", str(threads), "-np", str(slots), "-c", str(4096 * slots), "--no-webui"]
    if drafter != "none":
        draft = drafter.split(":", 1)[1]
        argv += [
            "-md",
            str(models.resolve(draft)),
            "--spec-type",
            "draft-simple",
            "--spec-draft-n-max",
            str(k),
        ]
        argv += ["-td", str(threads)]
    if taskset:
        argv = ["taskset", "-c", taskset, *argv]
    with launched(argv, port, log) as url:
        yield url


async def load(
    url: str, prompts: list[str], clients: int, seconds: float, max_tokens: int, count, passes: int = 0
) -> dict:
    """`clients` loops of streamed greedy chat requests for `seconds` (or, with `passes`, every prompt
    once untimed and then `passes` times in a fixed order, shared out among the clients) -> the run's
    figures."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=clients + 4)) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]

        def body(prompt: str) -> dict:
            msgs = [{"role": "user", "content": prompt}]
            return {
                "model": model,
                "messages": msgs,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
            }

        results, deadline = [], time.monotonic() + seconds
        if passes:  # the whole set once, untimed (prefix cache, suffix tree), then `passes` timed rounds
            warm = [await stream(client, url, body(text), "/v1/chat/completions") for text in prompts]
            if any("error" in r for r in warm):
                raise RuntimeError(f"warm-up pass failed: {[r['error'] for r in warm if 'error' in r][:2]}")
        else:
            await stream(client, url, body(prompts[0]), "/v1/chat/completions")  # warm-up

        async def worker(i: int):
            n = i
            while (n < passes * len(prompts)) if passes else (time.monotonic() < deadline):
                results.append(
                    await stream(client, url, body(prompts[n % len(prompts)]), "/v1/chat/completions")
                )
                n += clients

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(clients)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r and r["stamps"]]
    tokens = [count(r["text"]) for r in ok]
    itl = [(r["stamps"][-1] - r["stamps"][0]) / (n - 1) for r, n in zip(ok, tokens) if n > 1]
    ttft = [r["stamps"][0] for r in ok]
    ms = lambda x: None if x is None else round(1000 * x, 1)  # noqa: E731
    decode = [
        (n - 1) / (r["stamps"][-1] - r["stamps"][0])
        for r, n in zip(ok, tokens)
        if n > 1 and r["stamps"][-1] > r["stamps"][0]
    ]
    return {
        "clients": clients,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "error_samples": [r["error"] for r in results if "error" in r][:3],
        "wall_s": round(wall, 1),
        "output_tokens": sum(tokens),
        "tokens_per_s": round(sum(tokens) / wall, 1),
        "ttft_ms": {"p50": ms(pct(ttft, 50)), "p99": ms(pct(ttft, 99))},
        "itl_ms": {"p50": ms(pct(itl, 50)), "p99": ms(pct(itl, 99))},
        "decode_tokens_per_s_p50": round(pct(decode, 50), 1) if decode else None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--servers", default="ours:none,vllm:none,ours:eagle,vllm:eagle", help="ENGINE:DRAFTER,..."
    )
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--target", default=None, help="the model every server runs (default: the default model)")
    p.add_argument("--clients", default="1,8,32")
    p.add_argument("--seconds", type=float, default=20.0, help="load per client count (bounded)")
    p.add_argument(
        "--passes",
        type=int,
        default=0,
        help="replay: every prompt once untimed, then PASSES timed rounds of the set in a fixed order",
    )
    p.add_argument("--prompts", default="heldout:2")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--taskset", default="1", help="CPUs of the server under test ('' for none)")
    p.add_argument("--threads", type=int, default=1, help="the server's CPU threads")
    p.add_argument("--vllm-dtype", default="bfloat16")
    p.add_argument("--port", type=int, default=8125)
    p.add_argument(
        "--start-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for a server (vLLM compiles first)",
    )
    p.add_argument("--out", required=True)
    args = p.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from specdecode.backends import models

    tokenizer = models.load_tokenizer(args.target)
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    prompts = [p.prompt for p in load_prompts(args.prompts)]
    work = Path(tempfile.mkdtemp(prefix="peer_load_"))
    rows = []
    for server in args.servers.split(","):
        engine, drafter = server.split(":", 1)
        log = work / f"{engine}_{drafter}.log"
        started = time.monotonic()
        try:
            if engine == "ours":
                ctx = ours(drafter, args.k, args.port, args.taskset, args.threads, log, 32, args.target or "")
            elif engine == "llamacpp":
                slots = max(int(c) for c in args.clients.split(","))
                ctx = llamacpp(
                    drafter, args.k, args.port, args.taskset, args.threads, log, slots, args.target
                )
            else:
                out = work / f"vllm_{drafter}"
                _export(
                    drafter,
                    args.k,
                    out,
                    args.port,
                    dtype=args.vllm_dtype,
                    per_request="none",
                    target=args.target,
                )
                env = vllm_local.cpu_env(args.threads, args.taskset or "auto", kv_cache_gib=2)
                ctx = vllm_local.serving(
                    out / "serve.sh",
                    args.port,
                    log,
                    extra_args=("--generation-config", "vllm"),
                    env=env,
                    taskset=args.taskset,
                    timeout_s=args.start_timeout,
                )
            with ctx as url:
                start_s = round(time.monotonic() - started, 1)
                for clients in [int(c) for c in args.clients.split(",")]:
                    row = asyncio.run(
                        load(url, prompts, clients, args.seconds, args.max_tokens, count, args.passes)
                    )
                    rows.append(
                        {
                            "engine": engine,
                            "drafter": drafter,
                            "k": args.k if drafter != "none" else 0,
                            "start_s": start_s,
                            **row,
                        }
                    )
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        except Exception as e:  # one server failing must not lose the others' rows
            rows.append({"engine": engine, "drafter": drafter, "error": f"{type(e).__name__}: {e}"[-1500:]})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result = {
        "cpu": cpu_name(),
        "cpus": os.cpu_count(),
        "taskset": args.taskset,
        "threads": args.threads,
        "target": args.target,
        "prompts": args.prompts,
        "n_prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "seconds_per_run": None if args.passes else args.seconds,
        "timed_passes": args.passes or None,
        "vllm_dtype": args.vllm_dtype,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
