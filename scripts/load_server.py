"""A bounded load test of a running `specdecode serve` on loopback (issue 19).

N concurrent streaming clients send mixed traffic for a fixed time: short and long prompts, greedy
and seeded sampled requests, several max_tokens and stop strings, speculation on and off. Before the
load, every distinct greedy request is sent once alone; under load each greedy answer must equal it.
Reports errors (HTTP status, error events, missing [DONE]), greedy mismatches, TTFT and the gap
between chunks (p50/p95/p99) and throughput; exits 1 on any error or mismatch.

Two scenarios of issue 19's goals ride along:
- `--long-prompt-tokens N`: after `--long-after` seconds of load one more request arrives with a
  fresh prompt of about N tokens; the report gives the running streams' gaps between chunks that
  overlap its prefill (from its arrival to its first token) against their median gap.
- `--chat-turns R`: after the load, R two-turn chats, each with its own long history (~1,500
  tokens), alone: the TTFT of the first turn (cold) and of the second (history + answer + a new
  question, whose prefix the prefix cache holds); medians and their ratio.

`--admission N` runs issue 38's scenario instead of the mix: N clients stream short greedy requests
(128 tokens, ignore_eos) back to back; after `--admission-warmup` seconds a fresh prompt of
`--admission-tokens` tokens (default 4,000) arrives; once it has its first token the clients stop.
Reported: the running streams' gap between chunks, median over the run and p99 while the prompt was
admitted (its arrival to its first token), and their ratio (goal <= 3); also the median of the gaps
before it arrived (plain decode steps: a long admission weighs on the median over the run) and the
p99 while admitted over that. Start a fresh server for each run: the first long prompt is the one
whose KV blocks are first written (their pages first backed). With `serve --trace-steps N` the
report puts the server's own step times beside them (GET /stats/steps: interval between step starts,
each step's whole time, its forward and the rest, p50/p99, over the trace and while admitted, and the
slowest steps while admitted).

  python3 scripts/load_server.py --url http://127.0.0.1:8000 --clients 16 --seconds 120 [--out r.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

import httpx


@contextlib.contextmanager
def launched(argv: list[str], port: int, log: Path):
    """`argv` (a `specdecode serve` command line) running in its own session, output to `log`, until the
    block ends -> its base URL once /v1/models answers; stopped with SIGTERM, then SIGKILL."""
    import os
    import signal
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"specdecode serve did not start; see {log}")
            time.sleep(2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


SHORT = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash map is in two sentences.",
    "List three uses of the SQL GROUP BY clause.",
    "Write a haiku about the sea.",
    "Give a JSON object with fields name, age and city for a fictional person.",
    "Translate 'good morning, how are you?' into French and Spanish.",
]
LONG = (
    "Here are meeting notes. "
    + " ".join(f"Item {i}: the team discussed topic {i % 7} and agreed on step {i}." for i in range(120))
    + "\nSummarize the notes in three bullets."
)


def requests(rng: random.Random, long_share: float = 0.15) -> dict:
    """One request body of the mix (model filled in by the caller)."""
    prompt = LONG if rng.random() < long_share else rng.choice(SHORT)
    body = {"prompt": prompt, "max_tokens": rng.choice([16, 32, 64]), "stream": True}
    if rng.random() < 0.3:
        body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(1000))
    else:
        body["temperature"] = 0
    if rng.random() < 0.2:
        body["stop"] = ["\n\n"]
    body["speculative"] = rng.choice([{"enabled": True}, {"enabled": False}, {"drafter": "ngram", "k": 6}])
    return body


def key(body: dict) -> str | None:
    """Greedy requests with the same prompt, length and stops must give the same text."""
    if body.get("temperature", 1) != 0:
        return None
    return json.dumps([body["prompt"], body["max_tokens"], body.get("stop")])


def filler(tokens: int, tag: str) -> str:
    """A prompt of about `tokens` tokens (~16 per sentence in SmolLM2's tokenizer, which splits digits)
    that no other prompt starts like."""
    rng = random.Random(tag)
    return f"[{tag}] " + " ".join(
        f"Record {i}: sensor {rng.randrange(100)} read {rng.randrange(1000)} units."
        for i in range(tokens // 16)
    )


async def stream(client: httpx.AsyncClient, url: str, body: dict, path: str = "/v1/completions") -> dict:
    """One streamed request -> {"text", "stamps" (s after sending, per non-empty chunk), "start"
    (perf_counter at sending), "wall" (Unix time at sending)} or {"error"}."""
    t0, wall = time.perf_counter(), time.time()
    stamps, parts, error, done = [], [], None, False
    try:
        async with client.stream("POST", url + path, json=body) as r:
            if r.status_code != 200:
                return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                event = json.loads(line[6:])
                if "error" in event:
                    error = event["error"]["message"]
                elif event["choices"]:
                    choice = event["choices"][0]
                    text = choice["text"] if "text" in choice else choice.get("delta", {}).get("content")
                    if text:
                        stamps.append(time.perf_counter() - t0)
                        parts.append(text)
    except httpx.HTTPError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    if error or not done:
        return {"error": error or "stream ended without [DONE]"}
    return {"text": "".join(parts), "stamps": stamps, "start": t0, "wall": wall}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


async def long_arrival(client, url: str, model: str, tokens: int, after: float, tag="long-arrival") -> dict:
    await asyncio.sleep(after)
    body = {
        "model": model,
        "prompt": filler(tokens, tag) + "\nWhich sensor read the most?",
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    return await stream(client, url, body)


def during(results: list[dict], start: float, end: float) -> list[float]:
    """Gaps between chunks of `results` that overlap the interval [start, end] (perf_counter s)."""
    gaps = []
    for r in results:
        times = [r["start"] + t for t in r["stamps"]]
        gaps += [b - a for a, b in zip(times, times[1:]) if b > start and a < end]
    return gaps


async def chat_ttft(client, url: str, model: str, repeats: int) -> dict:
    """Cold first turns and second turns over the same history, alone, `repeats` times each."""
    cold, warm = [], []
    for i in range(repeats):
        history = [
            {"role": "system", "content": filler(1500, f"chat-{i}")},
            {"role": "user", "content": "Which sensor read the most?"},
        ]
        body = {"model": model, "messages": history, "max_tokens": 16, "temperature": 0, "stream": True}
        first = await stream(client, url, body, "/v1/chat/completions")
        history += [
            {"role": "assistant", "content": first["text"]},
            {"role": "user", "content": "And the least?"},
        ]
        second = await stream(client, url, {**body, "messages": history}, "/v1/chat/completions")
        if "error" in first or "error" in second:
            return {"error": first.get("error") or second.get("error")}
        cold.append(first["stamps"][0])
        warm.append(second["stamps"][0])
    return {
        "repeats": repeats,
        "cold_ttft_s": statistics.median(cold),
        "second_turn_ttft_s": statistics.median(warm),
        "second_over_cold": round(statistics.median(warm) / statistics.median(cold), 3),
        "cold_all": cold,
        "second_all": warm,
    }


async def admission(
    client, url: str, model: str, streams: int, tokens: int, warmup: float, seed: int
) -> dict:
    """`streams` clients stream short requests back to back; after `warmup` s a fresh `tokens`-token
    prompt arrives; the clients stop once it has its first token -> the streams' chunk gaps."""
    stop, results = asyncio.Event(), []

    async def client_loop(i: int):
        local = random.Random(seed * 1000 + i)
        while not stop.is_set():
            body = {"model": model, "prompt": local.choice(SHORT), "max_tokens": 128, "temperature": 0}
            results.append(await stream(client, url, {**body, "stream": True, "ignore_eos": True}))

    tasks = [asyncio.create_task(client_loop(i)) for i in range(streams)]
    long = await long_arrival(client, url, model, tokens, warmup, tag=f"admission-{streams}-{seed}")
    stop.set()
    await asyncio.gather(*tasks)
    errors = [r["error"] for r in results if "error" in r] + ([long["error"]] if "error" in long else [])
    ok = [r for r in results if "error" not in r]
    gaps = [b - a for r in ok for a, b in zip(r["stamps"], r["stamps"][1:])]
    report = {"streams": streams, "prompt_tokens": tokens, "requests": len(results), "errors": len(errors)}
    report["error_samples"] = errors[:5]
    if "error" in long or not long["stamps"] or not gaps:
        return report
    admitted = during(ok, long["start"], long["start"] + long["stamps"][0])
    stamps = [[r["start"] + t for t in r["stamps"]] for r in ok]
    before = [b - a for t in stamps for a, b in zip(t, t[1:]) if b <= long["start"]] or gaps  # plain steps
    median, plain = statistics.median(gaps), statistics.median(before)
    return {
        **report,
        "ttft_s": round(long["stamps"][0], 2),
        "gap_median_s": round(median, 4),
        "gap_p99_s": round(pct(gaps, 99), 4),
        "gaps_while_admitted": len(admitted),
        "gap_p99_while_admitted_s": round(pct(admitted, 99), 4) if admitted else None,
        "gap_max_while_admitted_s": round(max(admitted), 4) if admitted else None,
        "p99_over_median_while_admitted": round(pct(admitted, 99) / median, 2) if admitted else None,
        "p99_over_median_overall": round(pct(gaps, 99) / median, 2),
        "gap_median_before_admission_s": round(plain, 4),
        "p99_while_admitted_over_median_before": round(pct(admitted, 99) / plain, 2) if admitted else None,
        "server_steps": await server_steps(client, url, long["wall"], long["wall"] + long["stamps"][0]),
    }


async def server_steps(client, url: str, start: float, end: float) -> dict | None:
    """The server's own step trace (`serve --trace-steps N`, GET /stats/steps) beside the client's gaps:
    p50/p99 of the interval between step starts (the shortest gap a stream can see), of the steps' whole
    time, forward and the rest, over the trace and while the prompt was admitted ([start, end], Unix
    time) -> None when the server keeps no trace."""
    r = await client.get(url + "/stats/steps")
    if r.status_code != 200:
        return None
    steps = r.json()["steps"]

    def summary(records: list[dict]) -> dict:
        starts = [s["t"] for s in records]
        out = {"steps": len(records)}
        for name, values in (
            ("interval", [b - a for a, b in zip(starts, starts[1:])]),
            ("step", [s["step_s"] for s in records]),
            ("forward", [s["forward_s"] for s in records]),
            ("python", [s["python_s"] for s in records]),
        ):
            for q in (50, 99):
                v = pct(values, q)
                out[f"{name}_p{q}_s"] = None if v is None else round(v, 4)
        return out

    return {
        "traced": summary(steps),
        "while_admitted": summary([s for s in steps if start <= s["t"] <= end]),
        "slowest_while_admitted": sorted(
            (s for s in steps if start <= s["t"] <= end), key=lambda s: -s["step_s"]
        )[:5],
    }


async def main(args) -> int:
    rng = random.Random(args.seed)
    if args.admission:
        async with httpx.AsyncClient(
            timeout=args.timeout, limits=httpx.Limits(max_connections=args.admission + 4)
        ) as client:
            model = (await client.get(args.url + "/v1/models")).json()["data"][0]["id"]
            report = await admission(
                client,
                args.url,
                model,
                args.admission,
                args.admission_tokens,
                args.admission_warmup,
                args.seed,
            )
        print(json.dumps(report, indent=1))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
        return 1 if report["errors"] else 0
    limits = httpx.Limits(max_connections=args.clients + 4)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as client:
        model = (await client.get(args.url + "/v1/models")).json()["data"][0]["id"]
        mix = [{**requests(rng, args.long_share), "model": model} for _ in range(200)]
        reference = {}
        for body in mix:  # each distinct greedy request once, alone
            k = key(body)
            if k is not None and k not in reference:
                result = await stream(client, args.url, {**body, "speculative": {"enabled": False}})
                if "error" in result:
                    print(f"reference request failed: {result['error']}", file=sys.stderr)
                    return 1
                reference[k] = result["text"]
        results, deadline = [], time.monotonic() + args.seconds

        async def worker(i: int):
            local = random.Random(args.seed * 1000 + i)
            while time.monotonic() < deadline:
                body = local.choice(mix)
                result = await stream(client, args.url, body)
                result["key"] = key(body)
                results.append(result)

        t0 = time.perf_counter()
        long_task = (
            asyncio.create_task(
                long_arrival(client, args.url, model, args.long_prompt_tokens, args.long_after)
            )
            if args.long_prompt_tokens
            else None
        )
        await asyncio.gather(*(worker(i) for i in range(args.clients)))
        wall = time.perf_counter() - t0
        long = await long_task if long_task else None
        chat = await chat_ttft(client, args.url, model, args.chat_turns) if args.chat_turns else None
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    mismatches = sum(1 for r in ok if r["key"] is not None and r["text"] != reference[r["key"]])
    ttft = [r["stamps"][0] for r in ok if r["stamps"]]
    gaps = [b - a for r in ok for a, b in zip(r["stamps"], r["stamps"][1:])]
    report = {
        "clients": args.clients,
        "seconds": round(wall, 1),
        "requests": len(results),
        "errors": len(errors),
        "error_samples": errors[:5],
        "greedy_checked": sum(1 for r in ok if r["key"] is not None),
        "greedy_mismatches": mismatches,
        "chunks_per_s": round(sum(len(r["stamps"]) for r in ok) / wall, 1),
        "ttft_s": {q: pct(ttft, q) for q in (50, 95, 99)},
        "chunk_gap_s": {q: pct(gaps, q) for q in (50, 95, 99)},
        "p99_gap_over_median": round(pct(gaps, 99) / statistics.median(gaps), 2) if gaps else None,
    }
    if long is not None:
        errors += [long["error"]] if "error" in long else []
        if "error" not in long and long["stamps"]:
            overlap = during(ok, long["start"], long["start"] + long["stamps"][0])
            median = statistics.median(gaps)
            report["long_prompt"] = {
                "tokens": args.long_prompt_tokens,
                "ttft_s": long["stamps"][0],
                "gaps_during_prefill": len(overlap),
                "max_gap_s": max(overlap, default=None),
                "p99_gap_s": pct(overlap, 99),
                "max_gap_over_median": round(max(overlap) / median, 2) if overlap else None,
            }
    if chat is not None:
        errors += [chat["error"]] if "error" in chat else []
        report["chat_second_turn"] = chat
    report["errors"] = len(errors)
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if errors or mismatches else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=60.0, help="how long the load runs (bounded)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument(
        "--long-share", type=float, default=0.15, help="share of the mix with the ~1,300-token prompt"
    )
    p.add_argument(
        "--long-prompt-tokens", type=int, default=0, help="one request with a prompt this long arrives"
    )
    p.add_argument("--long-after", type=float, default=10.0, help="seconds into the load when it arrives")
    p.add_argument("--chat-turns", type=int, default=0, help="two-turn chats timed alone after the load")
    p.add_argument("--admission", type=int, default=0, help="streams beside which a long prompt is admitted")
    p.add_argument("--admission-tokens", type=int, default=4000, help="that prompt's length (about)")
    p.add_argument("--admission-warmup", type=float, default=15.0, help="seconds of streaming before it")
    sys.exit(asyncio.run(main(p.parse_args())))
