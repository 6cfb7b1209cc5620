"""Long prompts: peak memory, time to first token and decode speed, ours against llama.cpp, each engine
in a process of its own.

    python scripts/long_prompt_memory.py [--target smollm2-135m] [--tokens 874,2521,5384]
                                         [--max-new-tokens 64] [--threads 2] [--engines ours,llamacpp-bin]
                                         [--repeats 1] [--kv-dtype auto|fp32|fp16|int8] [--out F.json]

The prompts are Python's own sources (the standard library's modules, joined in a fixed order), cut to
each length in the target's tokens: text no held-out set contains. `ours` is the Python API as a user
runs it (`specdecode.LLM`, `--dtype gguf`, plain decoding, streaming one request: TTFT is the first
delta, decode the rest); `llamacpp-bin` is llama.cpp b11434's `llama-completion`
(scripts/build_llamacpp.sh) on the same text with a context of prompt + new tokens, timed by its own
counters, its peak RSS by GNU time (/usr/bin/time). Each (engine, length) runs in a fresh process,
so its peak RSS is that prompt's alone. Greedy, EOS ignored. The CPU and the kernels' ISA are
recorded; run it with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from anatomy import cpu_name  # noqa: E402
from peers_apart import llamacpp_bins  # noqa: E402

SOURCES = ["argparse", "collections/__init__", "json/decoder", "json/encoder", "inspect", "typing", "pathlib"]


def python_source() -> str:
    lib = Path(sysconfig.get_paths()["stdlib"])
    return "\n\n".join((lib / f"{name}.py").read_text() for name in SOURCES)


def prompt_ids(tokenizer, n: int) -> list[int]:
    ids = tokenizer(python_source())["input_ids"]
    if len(ids) < n:
        raise SystemExit(f"the sources hold {len(ids)} tokens, fewer than {n}")
    return ids[:n]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def ours(a) -> dict:
    import specdecode

    llm = specdecode.LLM(a.target, drafter="none", k=1, dtype="gguf", threads=a.threads, kv_dtype=a.kv_dtype)
    ids = prompt_ids(llm.target.tokenizer, a.n)
    params = specdecode.SamplingParams(temperature=0, max_tokens=a.max_new_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    first = None
    tokens = 0
    for delta in llm.stream(ids, params):
        tokens += len(delta.token_ids)
        if first is None and tokens:
            first = time.perf_counter()
    end = time.perf_counter()
    return {"ttft_s": first - t0, "decode_tok_s": (tokens - 1) / (end - first), "tokens": tokens}


def llamacpp_bin(a) -> dict:
    from specdecode.backends import models

    bins = llamacpp_bins()
    tok = models.load_tokenizer(a.target)
    text = tok.decode(prompt_ids(tok, a.n))
    context = -(-(a.n + a.max_new_tokens + 16) // 256) * 256
    # its own peak, by GNU time: a child's ru_maxrss counts the forked worker's pages before its exec
    cmd = [
        "/usr/bin/time",
        "-f",
        "peak_rss_kb=%M",
        str(bins / "llama-completion"),
        "-m",
        str(models.resolve(a.target)),
    ]
    cmd += ["-p", text, "-no-cnv"]
    cmd += [
        "--no-warmup",
        "-t",
        str(a.threads),
        "--temp",
        "0",
        "-n",
        str(a.max_new_tokens),
        "-c",
        str(context),
    ]
    cmd += ["--ignore-eos"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log = out.stdout + out.stderr
    if out.returncode:
        raise SystemExit(f"{cmd[0]} failed: {log[-1500:]}")
    pe = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", log)
    ev = re.search(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", log)
    return {
        "peak_rss_mb": int(re.search(r"peak_rss_kb=(\d+)", log).group(1)) / 1024,
        "ttft_s": float(pe.group(1)) / 1e3,
        "decode_tok_s": int(ev.group(2)) / (float(ev.group(1)) / 1e3),
        "prompt_tokens_llamacpp": int(pe.group(2)),
        "context": context,
    }


def worker(a) -> None:
    import torch

    torch.set_num_threads(a.threads)
    result = ours(a) | {"peak_rss_mb": peak_rss_mb()} if a.worker == "ours" else llamacpp_bin(a)
    print(json.dumps(result), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--tokens", default="874,2521,5384")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--engines", default="ours,llamacpp-bin")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--kv-dtype", default="auto", help="ours: the KV cache's precision (auto, fp32, fp16, int8)"
    )
    p.add_argument("--out")
    p.add_argument("--worker")
    p.add_argument("--n", type=int)
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return 0
    runs: dict[str, dict[int, list[dict]]] = {}
    for _ in range(a.repeats):
        for n in [int(t) for t in a.tokens.split(",")]:
            for engine in a.engines.split(","):  # each in a fresh process: its peak is this prompt's
                cmd = [sys.executable, __file__, "--worker", engine, "--n", str(n), "--target", a.target]
                cmd += [
                    "--threads",
                    str(a.threads),
                    "--max-new-tokens",
                    str(a.max_new_tokens),
                    "--kv-dtype",
                    a.kv_dtype,
                ]
                out = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if out.returncode:
                    raise SystemExit(f"{engine} at {n} tokens failed:\n{out.stderr[-2000:]}")
                row = json.loads(out.stdout.strip().splitlines()[-1])
                runs.setdefault(engine, {}).setdefault(n, []).append(row)
                ttft, rate, rss = row["ttft_s"], row["decode_tok_s"], row["peak_rss_mb"]
                print(
                    f"{engine:>13} {n:>5}: TTFT {ttft:.2f} s, {rate:.1f} tok/s, peak RSS {rss:.0f} MB",
                    flush=True,
                )
    keys = ("ttft_s", "decode_tok_s", "peak_rss_mb")
    summary = {
        engine: {
            str(n): {key: statistics.median(r[key] for r in rows) for key in keys} for n, rows in by_n.items()
        }
        for engine, by_n in runs.items()
    }
    result = {"cpu": cpu_name(), "target": a.target, "threads": a.threads, "max_new_tokens": a.max_new_tokens}
    result |= {"kv_dtype": a.kv_dtype}
    result |= {"command": "python scripts/long_prompt_memory.py " + " ".join(argv or sys.argv[1:])}
    result |= {
        "summary": summary,
        "runs": {e: {str(n): rows for n, rows in r.items()} for e, r in runs.items()},
    }
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
