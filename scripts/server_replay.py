"""A prompt set replayed against `specdecode serve` by concurrent clients, with and without a drafter.

    python3 scripts/server_replay.py [--prompts agentic:3] [--passes 2] [--clients 8] [--max-tokens 96]
                                     [--drafter suffix] [--k 12] [--dtype fp32] [--threads 1]
                                     [--max-batch 8] [--port 8161] [--out F.json]

For speculation off (`--drafter none`) and then the drafter, a fresh server starts (the default
target, `--dtype`, `--threads`, `--max-batch`, otherwise its defaults), and `--clients` streaming
clients send the set `--passes` times over (greedy chat requests of at most `--max-tokens`, in a fixed
order shared out among the clients; a learning drafter such as suffix sees the set again on every
pass). Reported: requests, errors, and generated tokens per second over the run's wall time (tokens
counted with the target's tokenizer) for each side, and their ratio. The CPU is named in the output;
run it with nothing else running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from anatomy import write_report  # noqa: E402
from load_server import launched, stream  # noqa: E402


@contextlib.contextmanager
def serve(args, drafter: str, log: Path):
    """A fresh `specdecode serve` on loopback until the block ends -> its base URL."""
    argv = [sys.executable, "-m", "specdecode", "serve", "--port", str(args.port), "--dtype", args.dtype]
    argv += ["--threads", str(args.threads), "--max-batch", str(args.max_batch), "--drafter", drafter]
    argv += ["--k", str(args.k)]
    with launched(argv, args.port, log) as url:
        yield url


async def replay(url: str, prompts: list[str], args, count) -> dict:
    """Every prompt `passes` times, shared out among `clients` -> requests, errors, tokens, tok/s."""
    work = [text for _ in range(args.passes) for text in prompts]
    async with httpx.AsyncClient(
        timeout=600, limits=httpx.Limits(max_connections=args.clients + 4)
    ) as client:
        model = (await client.get(url + "/v1/models")).json()["data"][0]["id"]

        def body(text: str) -> dict:
            messages = [{"role": "user", "content": text}]
            return {
                "model": model,
                "messages": messages,
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": True,
            }

        results = []

        async def worker(i: int):
            for n in range(i, len(work), args.clients):
                results.append(await stream(client, url, body(work[n]), "/v1/chat/completions"))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(args.clients)))
        wall = time.perf_counter() - t0
    ok = [r for r in results if "error" not in r]
    tokens = sum(count(r["text"]) for r in ok)
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "wall_s": round(wall, 1),
        "tokens": tokens,
        "tok_s": round(tokens / wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", default="agentic:3")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--drafter", default="suffix")
    p.add_argument("--k", type=int, default=12)
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--port", type=int, default=8161)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "src"))
    from specdecode.backends import models
    from specdecode.corpora import load_prompts

    tokenizer = AutoTokenizer.from_pretrained(models.local_path(None))
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    prompts = [q.prompt for q in load_prompts(a.prompts)]
    work = Path(tempfile.mkdtemp(prefix="server_replay_"))
    runs = {}
    for drafter in ["none", a.drafter]:
        with serve(a, drafter, work / f"{drafter.replace(':', '_')}.log") as url:
            runs[drafter] = asyncio.run(replay(url, prompts, a, count))
        print(f"{drafter}: {runs[drafter]}")
    off, on = runs["none"], runs[a.drafter]
    report = {
        "clients": a.clients,
        "requests": on["requests"],
        "off_tok_s": off["tok_s"],
        f"{a.drafter.split(':')[0]}_tok_s": on["tok_s"],
        "ratio": round(on["tok_s"] / off["tok_s"], 2) if off["tok_s"] else None,
        "runs": runs,
    }
    print(f"{a.drafter} / off: {report['ratio']}")
    if a.out:
        write_report(a.out, report, "server_replay.py", argv, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
