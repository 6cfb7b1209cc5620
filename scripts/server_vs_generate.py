"""One streaming client on `specdecode serve` against `specdecode generate`, on the same prompts.

    python scripts/server_vs_generate.py [--prompts heldout:2] [--max-tokens 64] [--rounds 3]
                                         [--drafter ngram] [--k 4] [--threads 2] [--port 8151]
                                         [--target qwen2.5-coder-1.5b]
                                         [--out F.json]

Each round runs both sides, in turns (the order alternates between rounds, so a slow phase of the
machine hits them alike):
- generate: a worker process of its own loads the LLM API (what `specdecode generate` runs), warms up
  on the longest prompt (warm_up_prompt), then completes every prompt alone, greedily (chat template,
  `--max-tokens`);
- serve: a fresh `specdecode serve` (scripts/peer_load.py's `ours`, defaults but the drafter, k and
  threads) gets the same warm-up request, then one streaming client (scripts/load_server.py's `stream`)
  sends every prompt in turn as a greedy chat completion.
The warm-up asks for `--max-tokens` on the longest prompt so that both sides have grown their KV caches
to what the run needs before it is timed (a running server has; a fresh one would otherwise move its
slots' caches into larger tensors during the first timed requests, ~0.1 s for 8 slots at 512 positions).
Reported per side (medians over rounds of the sums over prompts): decode tokens/s after the first
token ((tokens - 1) / (last token - first token), per prompt, summed) and end-to-end tokens/s (with
the time to first token; the server's measured at the client, from sending to [DONE]); the ratio
serve / generate of each, and whether every server text equals generate's (greedy: it must). Token
counts are generate's (the texts are equal). The CPU is named in the output; run it with nothing else
running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))
from anatomy import cpu_name  # noqa: E402
from load_server import stream  # noqa: E402
from peer_load import ours  # noqa: E402


def warm_up_prompt(prompts: list) -> str:
    """The longest prompt, so the caches grow before the timed requests, with other first tokens, so no
    timed request finds its blocks in the server's prefix cache."""
    return "(warm-up) " + max(prompts, key=lambda p: len(p.prompt)).prompt


def worker(a) -> None:
    """Prints {"id", "text", "tokens", "ttft_s", "wall_s"} per prompt, after a warm-up (warm_up_prompt)."""
    from specdecode.api import LLM, SamplingParams
    from specdecode.corpora import load_prompts

    llm = LLM(a.target or None, a.drafter, k=a.k, threads=a.threads)
    prompts = load_prompts(a.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens)
    llm.generate(warm_up_prompt(prompts), params, chat=None)  # warm-up
    for p in prompts:
        out = llm.generate(p.prompt, params, chat=None)[0]
        done = out.outputs[0]
        line = {"id": p.id, "text": done.text, "tokens": len(done.token_ids)}
        print(json.dumps(line | {"ttft_s": out.metrics.ttft_s, "wall_s": out.metrics.wall_s}), flush=True)


def run_generate(a) -> list[dict]:
    cmd = [sys.executable, __file__, "--worker", "--prompts", a.prompts, "--max-tokens", str(a.max_tokens)]
    cmd += ["--drafter", a.drafter, "--k", str(a.k), "--threads", str(a.threads), "--target", a.target]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"generate worker failed:\n{out.stderr[-2000:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


async def client(url: str, prompts: list, max_tokens: int) -> list[dict]:
    """One client, one request at a time -> {"id", "text", "ttft_s", "last_s", "wall_s"} per prompt."""
    async with httpx.AsyncClient(timeout=600) as http:
        model = (await http.get(url + "/v1/models")).json()["data"][0]["id"]

        def body(prompt: str, n: int) -> dict:
            msgs = [{"role": "user", "content": prompt}]
            return {"model": model, "messages": msgs, "max_tokens": n, "temperature": 0, "stream": True}

        await stream(http, url, body(warm_up_prompt(prompts), max_tokens), "/v1/chat/completions")  # warm-up
        rows = []
        for p in prompts:
            r = await stream(http, url, body(p.prompt, max_tokens), "/v1/chat/completions")
            if "error" in r:
                raise SystemExit(f"server request {p.id} failed: {r['error']}")
            wall = time.perf_counter() - r["start"]
            rows.append(
                {
                    "id": p.id,
                    "text": r["text"],
                    "ttft_s": r["stamps"][0],
                    "last_s": r["stamps"][-1],
                    "wall_s": wall,
                }
            )
        return rows


def run_serve(a, prompts, log: Path) -> list[dict]:
    with ours(a.drafter, a.k, a.port, "", a.threads, log, a.max_batch, a.target) as url:
        return asyncio.run(client(url, prompts, a.max_tokens))


def figures(rows: list[dict], tokens: dict[str, int]) -> dict:
    """One side's round -> decode and end-to-end tokens/s (sums over prompts)."""
    n = sum(tokens[r["id"]] for r in rows)
    decode_s = sum(r.get("last_s", r["wall_s"]) - r["ttft_s"] for r in rows)
    return {
        "decode_tok_s": (n - len(rows)) / decode_s,
        "end_to_end_tok_s": n / sum(r["wall_s"] for r in rows),
        "mean_ttft_ms": 1e3 * sum(r["ttft_s"] for r in rows) / len(rows),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", default="heldout:2")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--drafter", default="ngram", help="both commands' default")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target", default="", help="a model name or path (default: the default target)")
    p.add_argument("--max-batch", type=int, default=8, help="the server's slots (its default)")
    p.add_argument("--port", type=int, default=8151)
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a)
        return 0
    from specdecode.corpora import load_prompts

    prompts = load_prompts(a.prompts)
    work = Path(tempfile.mkdtemp(prefix="server_vs_generate_"))
    rounds = []
    for r in range(a.rounds):
        sides = ["generate", "serve"] if r % 2 == 0 else ["serve", "generate"]
        got = {}
        for side in sides:
            got[side] = (
                run_generate(a) if side == "generate" else run_serve(a, prompts, work / f"serve{r}.log")
            )
            print(f"round {r + 1}: {side} done", file=sys.stderr, flush=True)
        tokens = {row["id"]: row["tokens"] for row in got["generate"]}
        texts = {row["id"]: row["text"] for row in got["generate"]}
        same = sum(row["text"] == texts[row["id"]] for row in got["serve"]) / len(got["serve"])
        rounds.append({side: figures(rows, tokens) for side, rows in got.items()} | {"identical": same})
    results = {}
    for side in ("generate", "serve"):
        results[side] = {key: statistics.median(rnd[side][key] for rnd in rounds) for key in rounds[0][side]}
    ratio = {
        key: statistics.median(rnd["serve"][key] / rnd["generate"][key] for rnd in rounds)
        for key in ("decode_tok_s", "end_to_end_tok_s")
    }
    identical = min(rnd["identical"] for rnd in rounds)
    cpu = cpu_name()
    print(f"CPU: {cpu['name']}, {a.threads} threads, {a.prompts}, {a.max_tokens} tokens, greedy, {a.drafter}")
    for side, s in results.items():
        print(
            f"{side:>9}: decode {s['decode_tok_s']:.1f} tok/s, end to end {s['end_to_end_tok_s']:.1f} tok/s,"
            f" TTFT {s['mean_ttft_ms']:.0f} ms"
        )
    print(
        f"serve / generate: decode {ratio['decode_tok_s']:.2f}x, end to end {ratio['end_to_end_tok_s']:.2f}x;"
        f" texts identical {identical:.0%}"
    )
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        args = {k: v for k, v in vars(a).items() if k not in ("out", "worker")}
        report = {"cpu": cpu, "args": args, "results": results, "ratio_serve_over_generate": ratio}
        report |= {"identical": identical, "rounds": rounds}
        a.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
