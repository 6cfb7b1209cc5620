"""Our decoding against llama.cpp on the same GGUF file, each engine in a process of its own.

    python scripts/peers_apart.py [--prompts heldout:1] [--engines none,ngram,llamacpp] [--threads 2]
                                  [--max-new-tokens 96] [--repeats 3] [--dtype gguf] [--out F.json]
                                  [--target qwen2.5-coder-1.5b] [--draft qwen2.5-coder-0.5b] [--ignore-eos]

A peer inside our process competes with torch's thread pool (llama.cpp measured 9.46 ms a token
there against 8.1 ms alone), so each engine runs in a worker process: it loads, warms up on the first
prompt, then decodes every prompt greedily and prints one JSON line per prompt. Engines take turns
in every repeat (the order rotates), so a slow phase of the machine hits them alike. Reported per
engine (medians over repeats of the sums over prompts): decode tokens/s after the first token, and
end-to-end tokens/s with the time to first token; ours also the share of outputs identical to our
plain decoding; and the decode rate per group of prompts, code / SQL / API (categories code, coding,
code-edit, sql, function-calling, json-extract) and general chat (the rest), also as a multiple of
llama.cpp's (and in the JSON per category). Engines: a drafter spec of ours run by the engine users
run (the Python API, `specdecode.LLM`, one request at a time; `none` is plain decoding; `draft` means
`draft:<--draft>`), `llamacpp` (llama-cpp-python), or llama.cpp's own
binaries at b11434
(scripts/build_llamacpp.sh): `llamacpp-bin` (llama-completion) and `llamacpp-spec`
(llama-speculative-simple with the --draft model, at most 3 drafted), timed by their own counters.
Each engine's peak RSS is its worker's (llama.cpp's binaries': by GNU time). The CPU is named in the
output; run it with nothing else running.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from anatomy import cpu_name  # noqa: E402


def worker(engine: str, a) -> None:
    """Prints {"id", "tokens", "ttft_s", "wall_s"} per prompt, after a warm-up on the first."""
    import torch

    torch.set_num_threads(a.threads)
    from specdecode.backends import models
    from specdecode.backends.precision import Precision
    from specdecode.core.sampling import Warp
    from specdecode.corpora import load_prompts
    from specdecode.decoding.generation import encode_prompt

    if engine.startswith("llamacpp-"):
        return llamacpp_bin(engine, a)
    if engine == "llamacpp":
        from specdecode.bench import llamacpp

        target = models.load(a.target, Precision.parse(a.dtype))
        run = llamacpp.runner(models.resolve(a.target), None, target.eos_ids, target.tokenizer)

        def decode(ids, n):
            r = run(ids, n, Warp(), 0)
            return r.token_ids, r.stats

    else:  # the engine users run (the Python API, specdecode.LLM), one request at a time
        import specdecode

        spec = f"draft:{a.draft}" if engine == "draft" else engine
        llm = specdecode.LLM(a.target, drafter=spec, k=a.k, dtype=a.dtype, threads=a.threads, max_batch=1)
        target = llm.target

        def decode(ids, n):
            params = specdecode.SamplingParams(temperature=0, max_tokens=n, ignore_eos=a.ignore_eos)
            out = llm.generate([ids], params)[0]
            return out.token_ids, out.metrics

    items = [(p.id, encode_prompt(target.tokenizer, p.prompt, None)) for p in load_prompts(a.prompts)]
    decode(items[0][1], 16)  # warm-up: first calls pay one-off set-up
    for pid, ids in items:
        tokens, stats = decode(ids, a.max_new_tokens)
        line = {"id": pid, "tokens": tokens, "ttft_s": stats.ttft_s, "wall_s": stats.wall_s}
        print(json.dumps(line), flush=True)
    print_peak_rss()


def print_peak_rss() -> None:
    """The worker's peak RSS in MB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_rss_mb": peak / 1024}), flush=True)


def llamacpp_bins() -> Path:
    """llama.cpp b11434's binaries (scripts/build_llamacpp.sh builds them once, then names them)."""
    build = Path(__file__).parent / "build_llamacpp.sh"
    out = subprocess.run(["bash", str(build)], capture_output=True, text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1])


def llamacpp_bin(engine: str, a) -> None:
    """llama.cpp b11434's own binary on each prompt (our chat template's text, greedy), timed by its
    counters: prompt eval = time to first token, eval = decoding (speculative-simple: its decode line)."""
    import re

    from specdecode.backends import models
    from specdecode.corpora import load_prompts
    from specdecode.decoding.generation import encode_prompt

    bins = llamacpp_bins()
    tok = models.load_tokenizer(a.target)
    common = ["-t", str(a.threads), "--temp", "0", "-n", str(a.max_new_tokens), "-c", "4096"]
    if a.ignore_eos:
        common.append("--ignore-eos")
    target = str(models.resolve(a.target))
    peak = 0.0
    for p in load_prompts(a.prompts):
        text = tok.decode(encode_prompt(tok, p.prompt, None))
        if engine == "llamacpp-spec":
            cmd = [
                str(bins / "llama-speculative-simple"),
                "-m",
                target,
                "-md",
                str(models.resolve(a.draft)),
                "--spec-type",
                "draft-simple",
                "--spec-draft-n-max",
                "3",
                "-p",
                text,
                *common,
            ]
        else:
            cmd = [
                str(bins / "llama-completion"),
                "-m",
                target,
                "-p",
                text,
                "-no-cnv",
                "--no-warmup",
                *common,
            ]
        # its own peak by GNU time: a child's ru_maxrss counts the forked worker's pages before its exec
        out = subprocess.run(
            ["/usr/bin/time", "-f", "peak_rss_kb=%M", *cmd], capture_output=True, text=True, check=False
        )
        log = out.stdout + out.stderr
        peak = max(peak, int(re.search(r"peak_rss_kb=(\d+)", log).group(1)) / 1024)
        if out.returncode:
            raise SystemExit(f"{cmd[0]} failed: {log[-1500:]}")
        pe = re.search(r"prompt eval time =\s*([\d.]+) ms", log)
        encoded = re.search(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", log)  # speculative-simple's prompt
        ev = re.search(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs", log)
        spec = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
        if spec:  # speculative-simple: its decode line (after the prompt)
            n, decode_s = int(spec.group(1)), float(spec.group(2))
        else:
            n, decode_s = int(ev.group(2)) + 1, float(ev.group(1)) / 1e3
        ttft = float(encoded.group(1)) if encoded else float(pe.group(1)) / 1e3 if pe else 0.0
        print(
            json.dumps({"id": p.id, "tokens": [0] * n, "ttft_s": ttft, "wall_s": ttft + decode_s}), flush=True
        )
    print(json.dumps({"peak_rss_mb": peak}), flush=True)


def run_engine(engine: str, a) -> tuple[list[dict], float]:
    """-> (the worker's lines, its peak RSS in MB: the process and the binaries it ran)."""
    cmd = [sys.executable, __file__, "--worker", engine, "--prompts", a.prompts, "--threads", str(a.threads)]
    cmd += ["--max-new-tokens", str(a.max_new_tokens), "--dtype", a.dtype, "--k", str(a.k)]
    cmd += [*(["--target", a.target] if a.target else []), *(["--draft", a.draft] if a.draft else [])]
    cmd += ["--ignore-eos"] if a.ignore_eos else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"worker {engine} failed:\n{out.stderr[-2000:]}")
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [x for x in lines if "id" in x], max(x.get("peak_rss_mb", 0.0) for x in lines)


# The two kinds of prompt: code (and code edits), SQL and API calls (function calls, their
# arguments extracted as JSON); everything else counts as general chat.
CODE_SQL_API = {"code", "coding", "code-edit", "sql", "function-calling", "json-extract"}


def group_of(category: str) -> str:
    return "code_sql_api" if category in CODE_SQL_API else "chat"


def decode_rate(rows: list[dict]) -> float:
    """Decoded tokens (after each prompt's first) per second of decoding, over these prompts."""
    tokens = sum(len(r["tokens"]) - 1 for r in rows)
    return tokens / sum(r["wall_s"] - r["ttft_s"] for r in rows)


def by(runs: list[list[dict]], label: dict[str, str]) -> dict[str, float]:
    """Median over repeats of the decode rate of each label's prompts (label: prompt id -> label)."""
    return {
        g: statistics.median(decode_rate([r for r in rows if label[r["id"]] == g]) for rows in runs)
        for g in sorted(set(label.values()))
    }


def summary(runs: list[list[dict]], plain: list[list[dict]] | None, categories: dict[str, str]) -> dict:
    """Medians over repeats of the sums over prompts; categories: prompt id -> its category."""
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
        "decode_tok_s_by_group": by(runs, {i: group_of(c) for i, c in categories.items()}),
        "decode_tok_s_by_category": by(runs, categories),
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
    p.add_argument("--target", help="model name or path (default: the default target)")
    p.add_argument("--draft", help="draft model for the `draft` and `llamacpp-spec` engines")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        worker(a.worker, a)
        return 0
    engines = a.engines.split(",")
    runs: dict[str, list] = {e: [] for e in engines}
    rss: dict[str, float] = {}
    for r in range(a.repeats):
        for e in engines[r % len(engines) :] + engines[: r % len(engines)]:
            lines, peak = run_engine(e, a)
            runs[e].append(lines)
            rss[e] = max(rss.get(e, 0.0), peak)
            print(f"repeat {r + 1}: {e} done", file=sys.stderr)
    plain = runs.get("none")
    from specdecode.corpora import load_prompts

    categories = {p.id: p.category for p in load_prompts(a.prompts)}
    results = {
        e: summary(v, plain if not e.startswith("llamacpp") else None, categories) for e, v in runs.items()
    }
    for e in results:
        results[e]["peak_rss_mb"] = rss[e]
    peer = next((results[e] for e in ("llamacpp-bin", "llamacpp") if e in results), None)
    base = peer and peer["decode_tok_s"]
    lines = [
        f"CPU: {cpu_name()['name']}, {a.threads} threads, {a.target or 'default target'}, {a.prompts}, "
        f"{a.max_new_tokens} tokens, greedy"
    ]
    for e, s in results.items():
        ratio = f", {s['decode_tok_s'] / base:.2f}x llama.cpp decode" if base else ""
        same = f", identical to plain {s['identical_to_plain']:.0%}" if "identical_to_plain" in s else ""
        same += f", peak RSS {s['peak_rss_mb']:.0f} MB"
        if peer:
            peer_groups = peer["decode_tok_s_by_group"]
            same += "".join(f", {g} {v / peer_groups[g]:.2f}x" for g, v in s["decode_tok_s_by_group"].items())
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
