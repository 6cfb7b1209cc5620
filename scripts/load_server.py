"""Load a running `specdecode serve`: N concurrent streaming greedy requests, report tokens/s and ITL.

  python3 scripts/load_server.py --url http://127.0.0.1:8000 --concurrency 1,8 --requests 8 --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import openai

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a hash map is in two sentences.",
    "List three uses of the SQL GROUP BY clause.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "Write a haiku about the sea.",
    "What is the capital of France, and why is it famous?",
    "Give a JSON object with fields name, age and city for a fictional person.",
    "Translate 'good morning, how are you?' into French and Spanish.",
]


async def one(client, model, prompt, max_tokens, spec):
    t0 = time.perf_counter()
    stamps, tokens = [], 0
    stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                             stream=True, stream_options={"include_usage": True},
                                             extra_body={"speculative": spec})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            stamps.append(time.perf_counter() - t0)
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return tokens, stamps


async def run(url, model, concurrency, requests, max_tokens, spec):
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
        sem = asyncio.Semaphore(concurrency)

        async def limited(i):
            async with sem:
                return await one(client, model, PROMPTS[i % len(PROMPTS)], max_tokens, spec)

        t0 = time.perf_counter()
        results = await asyncio.gather(*(limited(i) for i in range(requests)))
        wall = time.perf_counter() - t0
    tokens = sum(t for t, _ in results)
    gaps = [b - a for _, s in results for a, b in zip(s, s[1:])]
    p = lambda q: statistics.quantiles(gaps, n=100)[q - 1] * 1000 if len(gaps) > 1 else 0.0  # noqa: E731
    return tokens, wall, p(50), p(99)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--speculative", default="on,off")
    args = ap.parse_args()
    for spec in args.speculative.split(","):
        for c in (int(x) for x in args.concurrency.split(",")):
            tokens, wall, p50, p99 = asyncio.run(run(args.url, args.model, c, args.requests, args.max_tokens,
                                                     {"enabled": spec == "on"}))
            print(f"speculation {spec:3} concurrency {c:2}: {tokens} tokens in {wall:.2f}s = {tokens / wall:.1f} tok/s, "
                  f"ITL p50 {p50:.1f} ms p99 {p99:.1f} ms (between streamed chunks)")


if __name__ == "__main__":
    main()
