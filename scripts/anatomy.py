"""The anatomy of one target forward: T(n) for n = 1..16 rows at a few context lengths, split into
the matmuls, attention and the rest, against the machine's measured streaming bandwidth.

    python scripts/anatomy.py [--target M] [--dtype gguf] [--threads 2] [--contexts 64,200,1000]
                              [--rows 16] [--repeats 9] [--torch-int4] [--out docs/results/F.json]

What it reports (JSON, and a Markdown table beside it):
- T(n) ms and r(n) = T(n) / T(1): one forward of n new tokens after `context` cached ones (a chain
  verification's shape), sizes interleaved across repeats, medians; where the layers run as one
  native call (backends/stack.py), also T per-op: the same forward through one call per op;
- matmul ms: the same layers' linears (and the LM head) alone on rows of the same shapes, and the LM
  head on its own; attention ms: the fused attention kernel alone on the same caches; rest = T - both;
- the bytes one forward reads from its weights, the streaming read bandwidth measured here (a sum
  over a 1 GiB buffer on the same threads), the implied floor (bytes / bandwidth) and T(1) / floor;
- the multiply-adds per cycle per core the matmuls reach (at the CPU's nominal clock);
- with --torch-int4, torch's own int4 weight-only kernel (aten._weight_int4pack_mm_for_cpu, group 32,
  bf16 activations) on the same layer shapes, for comparison.
Run it alone: anything else running measures the scheduler. The CPU is named in the output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch


def cpu_name() -> dict:
    """The CPU and the ISA the kernels are built for (kernels.machine)."""
    from specdecode.backends import kernels

    return kernels.machine()


def write_report(out, report: dict, script: str, argv: list[str] | None, threads: int) -> None:
    """A script's report as JSON at `out`, with its provenance: the command that made it (script's
    name and its arguments, argv None: the process's), the CPU and the threads."""
    out.parent.mkdir(parents=True, exist_ok=True)
    command = f"python3 scripts/{script} " + " ".join(sys.argv[1:] if argv is None else argv)
    report["provenance"] = {"command": command.strip(), "cpu": cpu_name(), "threads": threads}
    out.write_text(json.dumps(report, indent=1) + "\n")


def median_ms(fn, repeats: int) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(samples)


def bandwidth_gbs(threads: int, gib: float = 1.0) -> float:
    """Streaming read bandwidth: a float32 sum over a buffer far larger than the caches."""
    buf = torch.ones(int(gib * 2**30 / 4))
    ms = median_ms(lambda: buf.sum(), 5)
    return buf.numel() * 4 / (ms / 1e3) / 1e9


def linears(model) -> list:
    """Every linear of one forward, in order, with its input width: [(callable, in_features)]."""
    out = []
    for layer in model.layers:
        inner = layer.o.out_features
        width = layer.gate_up.out_features // 2
        out += [(layer.qkv, model.config.hidden_size), (layer.o, inner)]
        out += [(layer.gate_up, model.config.hidden_size), (layer.down, width)]
    return out


def weight_bytes(model) -> int:
    """Bytes the linears and the LM head hold (what one forward streams from memory)."""
    seen, total = set(), 0
    for obj in [f for f, _ in linears(model)] + [model.lm_head]:
        for t in _tensors(obj):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def _tensors(obj):
    for value in vars(obj).values():
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, list | tuple):
            for v in value:
                if isinstance(v, torch.Tensor):
                    yield v
                elif hasattr(v, "__dict__"):
                    yield from _tensors(v)
        elif hasattr(value, "__dict__") and not callable(value):
            yield from _tensors(value)


def macs(model) -> int:
    """Multiply-adds of one row through the linears and the LM head."""
    return sum(f.out_features * k for f, k in linears(model)) + model.lm_head.out_features * (
        model.config.hidden_size
    )


def anatomy(model, contexts: list[int], rows: int, repeats: int, seed: int = 0) -> list[dict]:
    """One entry per (context, n): T, matmul, lm_head, attention, rest in ms."""
    gen = torch.Generator().manual_seed(seed)
    results = [row for ctx in contexts for row in _one_context(model, ctx, rows, repeats, gen)]
    model.reset()
    return results


def _one_context(model, ctx: int, rows: int, repeats: int, gen: torch.Generator) -> list[dict]:
    pairs, hidden = linears(model), model.config.hidden_size
    model.reset()
    model.forward(torch.randint(model.vocab_size, (ctx,), generator=gen), num_logits=1)
    base = model.length
    step = torch.randint(model.vocab_size, (rows,), generator=gen)
    xs = {n: {k: torch.randn(n, k, generator=gen) for _, k in pairs} for n in range(1, rows + 1)}
    heads = {n: torch.randn(n, hidden, generator=gen) for n in range(1, rows + 1)}

    def forward(n):
        model.extend(step[:n])
        model.truncate(base)

    def matmuls(n):
        for f, k in pairs:
            f(xs[n][k])
        model.lm_head(heads[n])

    def per_op(n):  # the same forward through fused_layers' per-op calls instead of the native stack
        model.stack, stack = None, model.stack
        try:
            forward(n)
        finally:
            model.stack = stack

    parts = {
        "T": forward,
        **({"T_per_op": per_op} if model.stack is not None else {}),
        "matmul": matmuls,
        "lm_head": lambda n: model.lm_head(heads[n]),
        "attention": lambda n: attention_only(model, n, gen),
    }
    for n in range(1, rows + 1):  # warm-up
        forward(n)
    samples = {n: {key: [] for key in parts} for n in range(1, rows + 1)}
    for _ in range(repeats):  # sizes interleaved: a slow phase of a shared machine hits all alike
        for n in range(1, rows + 1):
            for key, fn in parts.items():
                t0 = time.perf_counter()
                fn(n)
                samples[n][key].append(1e3 * (time.perf_counter() - t0))
    out = []
    for n in range(1, rows + 1):
        row = {"context": ctx, "n": n} | {k: statistics.median(v) for k, v in samples[n].items()}
        row["rest"] = row["T"] - row["matmul"] - row["attention"]
        out.append(row)
    return out


def attention_only(model, n: int, gen: torch.Generator) -> None:
    """The fused attention kernel of every layer for n new rows after the cached context."""
    ops = model.kernels
    width = (model.heads + 2 * model.kv_heads) * model.head_dim
    qkv = torch.randn(n, width, generator=gen)
    start = model.length
    cos, sin = model.cos[start : start + n].contiguous(), model.sin[start : start + n].contiguous()
    from specdecode.backends import stack as native_stack

    where = (
        torch.zeros(1, dtype=torch.long),
        torch.tensor([start]),
        torch.tensor([n]),
        native_stack.ONE_BLOCK,
    )
    for i in range(len(model.layers)):
        ops.attention(
            qkv,
            model.k_cache[i],
            model.v_cache[i],
            cos,
            sin,
            None,
            *where,
            model.heads,
            model.kv_heads,
            model.qk_scale or 0.0,
        )


def torch_int4(model, rows: list[int], repeats: int) -> dict[int, float] | None:
    """ms of the layers' matmuls (no LM head) through aten._weight_int4pack_mm_for_cpu, group 32."""
    try:
        mats = []
        for f, k in linears(model):
            w = torch.randn(f.out_features, k) * 0.02
            q = torch.clamp(torch.round(w / 0.002) + 8, 0, 15).to(torch.int32)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            groups = k // 32
            sz = torch.stack(
                [torch.full((groups, f.out_features), 0.002), torch.zeros(groups, f.out_features)], -1
            )
            mats.append((packed, sz.to(torch.bfloat16), k))
        return {n: median_ms(partial(_int4_pass, mats, n), repeats) for n in rows}
    except (RuntimeError, AttributeError) as e:
        print(f"torch int4 kernel unavailable: {e}", file=sys.stderr)
        return None


def _int4_pass(mats, n: int) -> None:
    for packed, scales, k in mats:
        torch.ops.aten._weight_int4pack_mm_for_cpu(torch.ones(n, k, dtype=torch.bfloat16), packed, 32, scales)


def report(model, results: list[dict], threads: int, cpu: dict, bandwidth: float) -> dict:
    nbytes = weight_bytes(model)
    floor_ms = nbytes / (bandwidth * 1e9) * 1e3
    per_row = macs(model)
    by_ctx: dict[int, dict] = {}
    for r in results:
        one = next(x for x in results if x["context"] == r["context"] and x["n"] == 1)
        r["r"] = r["T"] / one["T"]
        clock = cpu["mhz"] * 1e6 or float("nan")
        r["macs_per_cycle_per_core"] = per_row * r["n"] / (r["matmul"] / 1e3) / clock / threads
        by_ctx.setdefault(r["context"], {})[r["n"]] = r
    return {
        "cpu": cpu,
        "threads": threads,
        "weight_bytes": nbytes,
        "bandwidth_gbs": bandwidth,
        "floor_ms": floor_ms,
        "macs_per_row": per_row,
        "t1_over_floor": {ctx: rows[1]["T"] / floor_ms for ctx, rows in by_ctx.items()},
        "rows": results,
    }


def markdown(rep: dict) -> str:
    cpu = rep["cpu"]
    lines = [
        f"CPU: {cpu['name']} ({', '.join(cpu['isa'])}), {rep['threads']} threads. "
        f"Weights read per forward {rep['weight_bytes'] / 1e6:.1f} MB; streaming read "
        f"{rep['bandwidth_gbs']:.1f} GB/s; floor {rep['floor_ms']:.2f} ms.",
        "",
        "| context | n | T ms | r(n) | T per-op ms | matmul ms | LM head ms | attention ms | rest ms"
        " | MAC/cycle/core |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["rows"]:
        per_op = f"{r['T_per_op']:.2f}" if "T_per_op" in r else "–"
        lines.append(
            f"| {r['context']} | {r['n']} | {r['T']:.2f} | {r['r']:.2f} | {per_op} | {r['matmul']:.2f}"
            f" | {r['lm_head']:.2f} | {r['attention']:.2f} | {r['rest']:.2f}"
            f" | {r['macs_per_cycle_per_core']:.1f} |"
        )
    if rep.get("torch_int4_ms"):
        lines += ["", "torch int4 (aten._weight_int4pack_mm_for_cpu, layers without LM head), ms by rows: "]
        lines[-1] += ", ".join(f"{n}: {ms:.2f}" for n, ms in rep["torch_int4_ms"].items())
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None)
    p.add_argument("--dtype", default="gguf")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--contexts", default="64,200,1000")
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--torch-int4", action="store_true")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from specdecode.backends import models
    from specdecode.backends.precision import Precision

    model = models.load(a.target, Precision.parse(a.dtype)).model
    if getattr(model, "kernels", None) is None:
        print("anatomy: the fused kernels did not build; nothing to measure", file=sys.stderr)
        return 2
    cpu = cpu_name()
    bw = bandwidth_gbs(a.threads)
    results = anatomy(model, [int(c) for c in a.contexts.split(",")], a.rows, a.repeats)
    rep = report(model, results, a.threads, cpu, bw) | {"target": a.target or "default", "dtype": a.dtype}
    if a.torch_int4:
        rep["torch_int4_ms"] = torch_int4(model, [1, 2, 4, 8, 16], a.repeats)
    text = markdown(rep)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(rep, indent=1) + "\n")
        a.out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
