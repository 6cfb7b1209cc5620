"""Our decoding against llama.cpp on the same GGUF file, each engine in a process of its own.

    python scripts/peers_apart.py [--prompts heldout:1] [--engines none,ngram,llamacpp] [--threads 2]
                                  [--max-new-tokens 96] [--repeats 3] [--dtype gguf] [--out F.json]

A peer inside our process competes with torch's thread pool (llama.cpp measured 9.46 ms a token
there against 8.1 ms alone), so each engine runs in a worker process: it loads, warms up on the first
prompt, then decodes every prompt greedily and prints one JSON line per prompt. Engines take turns
in every repeat (the order rotates), so a slow phase of the machine hits them alike. Reported per
engine (medians over repeats of the sums over prompts): decode tokens/s after the first token, and
end-to-end tokens/s with the time to first token; ours also the share of outputs identical to our
plain decoding. Engines: a drafter spec of ours (`none` is plain decoding) or `llamacpp` (needs
llama-cpp-python). The CPU is named in the output; run it with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from anatomy import cpu_name  # noqa: E402


def worker(engine: str, prompts: str, threads: int, max_new: int, dtype: str) -> None:
    """Prints {"id", "tokens", "ttft_s", "wall_s"} per prompt, after a warm-up on the first."""
    import torch

    torch.set_num_threads(threads)
    from specdecode import drafters
    from specdecode.backends import models
    from specdecode.core.generation import encode_prompt, generate
    from specdecode.core.sampling import SamplingParams
    from specdecode.corpora import load_prompts

    target = models.load(None, dtype)
    items = [(p.id, encode_prompt(target.tokenizer, p.prompt, None)) for p in load_prompts(prompts)]
    if engine == "llamacpp":
        from specdecode.bench import llamacpp

        run = llamacpp.runner(models.resolve(None), None, target.eos_ids, target.tokenizer)

        def decode(ids, n):
            return run(ids, n, SamplingParams(), 0)
    else:
        drafter = drafters.build(engine, drafters.DrafterContext(target, dtype))

        def decode(ids, n):
            return generate(target, drafter, ids, k=4, max_new_tokens=n)

    decode(items[0][1], 16)  # warm-up: first calls pay one-off set-up
    for pid, ids in items:
        r = decode(ids, max_new)
        line = {"id": pid, "tokens": r.token_ids, "ttft_s": r.stats.ttft_s, "wall_s": r.stats.wall_s}
        print(json.dumps(line), flush=True)


def run_engine(engine: str, a) -> list[dict]:
    cmd = [sys.executable, __file__, "--worker", engine, "--prompts", a.prompts, "--threads", str(a.threads)]
    cmd += ["--max-new-tokens", str(a.max_new_tokens), "--dtype", a.dtype]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"worker {engine} failed:\n{out.stderr[-2000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def summary(runs: list[list[dict]], plain: list[list[dict]] | None) -> dict:
    """Medians over repeats of the sums over prompts."""
    decode, e2e, ttft = [], [], []
    for rows in runs:
        tokens = sum(len(r["tokens"]) for r in rows)
        wall, first = sum(r["wall_s"] for r in rows), sum(r["ttft_s"] for r in rows)
        decode.append((tokens - len(rows)) / (wall - first))
        e2e.append(tokens / wall)
        ttft.append(first / len(rows))
    out = {
        "decode_tok_s": statistics.median(decode),
        "end_to_end_tok_s": statistics.median(e2e),
        "mean_ttft_ms": 1e3 * statistics.median(ttft),
        "decode_tok_s_runs": decode,
    }
    if plain:
        want = {r["id"]: r["tokens"] for r in plain[0]}
        out["identical_to_plain"] = sum(r["tokens"] == want[r["id"]] for r in runs[0]) / len(runs[0])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", default="heldout:1")
    p.add_argument("--engines", default="none,ngram,llamacpp")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="gguf")
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker, a.prompts, a.threads, a.max_new_tokens, a.dtype)
        return 0
    engines = a.engines.split(",")
    runs: dict[str, list] = {e: [] for e in engines}
    for r in range(a.repeats):
        for e in engines[r % len(engines) :] + engines[: r % len(engines)]:
            runs[e].append(run_engine(e, a))
            print(f"repeat {r + 1}: {e} done", file=sys.stderr)
    plain = runs.get("none")
    results = {e: summary(v, plain if e != "llamacpp" else None) for e, v in runs.items()}
    base = results.get("llamacpp", {}).get("decode_tok_s")
    lines = [
        f"CPU: {cpu_name()['name']}, {a.threads} threads, {a.prompts}, {a.max_new_tokens} tokens, greedy"
    ]
    for e, s in results.items():
        ratio = f", {s['decode_tok_s'] / base:.2f}x llama.cpp decode" if base else ""
        same = f", identical to plain {s['identical_to_plain']:.0%}" if "identical_to_plain" in s else ""
        lines.append(
            f"{e:>12}: decode {s['decode_tok_s']:.1f} tok/s, end to end {s['end_to_end_tok_s']:.1f} tok/s,"
            f" TTFT {s['mean_ttft_ms']:.0f} ms{ratio}{same}"
        )
    print("\n".join(lines))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        report = {"cpu": cpu_name(), "args": {k: v for k, v in vars(a).items() if k != "out"}}
        a.out.write_text(json.dumps(report | {"results": results}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
