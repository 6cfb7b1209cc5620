"""What `specdecode serve` holds in memory under concurrent long prompts, against `specdecode memory`'s
estimate of it (decoding/memory.serve_estimate).

    python scripts/serve_memory.py [--target qwen2.5-coder-1.5b] [--clients 16] [--prompt-tokens 1024]
                                   [--max-tokens 32] [--slots 16] [--kv-dtype auto] [--kv-memory GIB]
                                   [--huge-tokens 32768] [--timeout S] [--threads 2] [--port 8123]
                                   [--out F.json]

A fresh `serve --dtype gguf --drafter none` (one per run: a first write backs the KV pool's pages) gets
`--clients` streaming completions at once, each a prompt of `--prompt-tokens` token ids cut from Python's
own sources at its own offset (no prefix shared: every request writes its own blocks), greedy, EOS
ignored, `--max-tokens` each. With `--huge-tokens N`, one more request of N prompt tokens arrives
beside them: answered (its tokens) or refused with a 400 naming the memory, and the server must stay
up. The server's resident memory (VmRSS of /proc) is sampled every 0.2 s; reported: its peak (VmHWM,
load included) and its peak after loading, every stream's outcome, the preemptions the server counted
(`specdecode:num_preemptions_total`), and the estimate for the same requests with its error. The
estimate assumes every request resident at full length at once; when they do not overlap that much,
`estimate_at_backed_kv` puts the KV memory the server did write (`specdecode:kv_cache_backed_bytes`)
in place of its KV term, which checks the rest of the estimate. The CPU
is named; run it with nothing else running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from anatomy import cpu_name  # noqa: E402
from load_server import launched, stream  # noqa: E402
from long_prompt_memory import python_source  # noqa: E402


def status_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM of process `pid`, in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}


def metric_sum(lines: list[str], name: str) -> float:
    """The sum of the samples of metric `name` (over its labels) in /metrics' text lines."""
    return sum(float(m.split()[-1]) for m in lines if m.startswith(name))


def serve_pid(port: int) -> int:
    """The pid of the process listening on `port` (the server launched() started)."""
    import subprocess

    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
    return int(out.split("pid=")[1].split(",")[0])


async def run(url: str, model: str, prompts: list[list[int]], huge: list[int] | None, a) -> list[dict]:
    body = {"model": model, "temperature": 0, "max_tokens": a.max_tokens, "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as client:
        jobs = [stream(client, url, {**body, "prompt": p}) for p in prompts]
        if huge is not None:
            jobs.append(stream(client, url, {**body, "prompt": huge, "max_tokens": 8}))
        return await asyncio.gather(*jobs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--slots", type=int, default=16, help="serve --max-batch")
    p.add_argument("--kv-dtype", default="auto")
    p.add_argument("--kv-memory", type=float, help="serve --kv-memory (GiB)")
    p.add_argument("--huge-tokens", type=int, help="one more request of this many prompt tokens")
    p.add_argument("--timeout", type=float, help="serve --timeout (default: serve's, no limit)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)

    from specdecode.backends import models
    from specdecode.decoding import memory

    tokenizer_bytes = memory.tokenizer_resident(a.target)  # before anything else grows this process
    tokenizer = models.load_tokenizer(a.target)
    ids = tokenizer(python_source())["input_ids"]
    step = max(1, (len(ids) - a.prompt_tokens) // max(1, a.clients))
    if len(ids) < a.prompt_tokens:
        raise SystemExit(f"the sources hold {len(ids)} tokens, fewer than {a.prompt_tokens}")
    prompts = [ids[i * step : i * step + a.prompt_tokens] for i in range(a.clients)]
    huge = None
    if a.huge_tokens:
        huge = (ids * (a.huge_tokens // len(ids) + 1))[: a.huge_tokens]
    argv_serve = [sys.executable, "-m", "specdecode", "serve", "--target", a.target, "--dtype", "gguf"]
    argv_serve += ["--drafter", "none", "--port", str(a.port), "--max-batch", str(a.slots)]
    argv_serve += ["--kv-dtype", a.kv_dtype, "--threads", str(a.threads)]
    if a.timeout is not None:
        argv_serve += ["--timeout", str(a.timeout)]
    if a.kv_memory:
        argv_serve += ["--kv-memory", str(a.kv_memory)]
    samples: list[float] = []
    log = Path(f"/tmp/serve_memory_{a.port}.log")
    with launched(argv_serve, a.port, log) as url:
        pid = serve_pid(a.port)
        loaded = status_mb(pid)
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append(status_mb(pid)["VmRSS"])
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        t0 = time.perf_counter()
        results = asyncio.run(run(url, model, prompts, huge, a))
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        final = status_mb(pid)
        alive = httpx.get(url + "/v1/models").status_code == 200
        metrics = httpx.get(url + "/metrics").text.splitlines()
        preempted = metric_sum(metrics, "specdecode:num_preemptions_total")
        backed = metric_sum(metrics, "specdecode:kv_cache_backed_bytes")
    e = memory.serve_estimate(
        models.load_config(a.target),
        models.resolve(a.target),
        requests=a.clients,
        tokens=a.prompt_tokens + a.max_tokens,
        slots=a.slots,
        kv_dtype=a.kv_dtype,
        kv_memory=None if a.kv_memory is None else int(a.kv_memory * (1 << 30)),
        tokenizer_bytes=tokenizer_bytes,
    )
    streams = results[: a.clients]
    report = {
        "cpu": cpu_name(),
        "command": "python3 scripts/serve_memory.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "clients": a.clients,
        "prompt_tokens": a.prompt_tokens,
        "max_tokens": a.max_tokens,
        "streams_complete": sum("text" in r for r in streams),
        "stream_errors": [r["error"] for r in streams if "error" in r],
        "huge": None if huge is None else results[-1].get("error", "answered"),
        "server_alive_after": alive,
        "preemptions": int(preempted),
        "wall_s": round(wall, 1),
        "rss_loaded_mb": round(loaded["VmRSS"]),
        "rss_peak_after_load_mb": round(max(samples + [final["VmRSS"]])),
        "rss_peak_mb": round(final["VmHWM"]),
        "estimate_mb": {
            k: round(getattr(e, k) / 2**20) for k in ("runtime", "weights", "kv_cache", "activations")
        }
        | {"total": round(e.total / 2**20), "waiting": e.waiting},
    }
    report["estimate_error"] = round(report["estimate_mb"]["total"] / report["rss_peak_after_load_mb"] - 1, 3)
    # the estimate's own parts around the KV memory the server did write (its high-water mark, from
    # /metrics): how far the model of the process is off, apart from how many requests overlapped
    report["kv_backed_mb"] = round(backed / 2**20)
    at_backed = report["estimate_mb"]["total"] - report["estimate_mb"]["kv_cache"] + report["kv_backed_mb"]
    report["estimate_at_backed_kv_mb"] = at_backed
    report["estimate_at_backed_kv_error"] = round(at_backed / report["rss_peak_after_load_mb"] - 1, 3)
    print(json.dumps(report, indent=1))
    if a.out:
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["streams_complete"] == a.clients and alive else 1


if __name__ == "__main__":
    sys.exit(main())
