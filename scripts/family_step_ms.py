"""One plain decoding step of each model family on the fast forward, at SmolLM2-135M's size.

    python3 scripts/family_step_ms.py [--families llama,gemma3_text,qwen2,qwen3,mistral,phi3]
                                      [--threads 2] [--context 64] [--repeats 50] [--out F.json]

Each family's model is built from its transformers config with random weights (nothing to download)
at the default target's shapes: 576 hidden, 30 layers, 9 query and 3 key/value heads, 1,536 MLP
width, a 49,152-token vocabulary, fp32. FastLlama runs each through the same fused forward with the
family's switches (Qwen2's q/k/v biases, Qwen3's q/k norms, Phi-3's fused matrices, Gemma 3's norms,
scaled embedding and window layers). After `--context` random tokens, one step (one new token, then
the cache truncated back) is timed `--repeats` times per family, the families taking turns in every
round so a slow phase of the machine hits them alike; medians. Reported per family: ms per step and
the ratio to Llama's. The CPU is named in the output; run it with nothing else running.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from anatomy import write_report  # noqa: E402

SIZE = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 2048,
}
# each family's own settings that the fast forward needs (as tests/test_families.py builds them)
EXTRA = {
    "llama": {},
    "gemma3_text": {"head_dim": 64, "query_pre_attn_scalar": 64, "pad_token_id": None},
    "qwen2": {},
    "qwen3": {"head_dim": 64},
    "mistral": {"sliding_window": None},
    "phi3": {"pad_token_id": None},
}


def build(family: str, seed: int = 0):
    """A random-weight model of the family at SIZE, on FastLlama's fused forward."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specdecode.backends import models

    cfg = AutoConfig.for_model(family, **SIZE, **EXTRA[family])
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg).float().eval()
    return models.wrap(hf, "fast")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--families", default=",".join(EXTRA))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--context", type=int, default=64, help="cached tokens before the timed step")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    families = a.families.split(",")
    gen = torch.Generator().manual_seed(0)
    step, bases, built = {}, {}, {}
    for family in families:
        model = built[family] = build(family)
        if getattr(model, "kernels", None) is None:
            print(f"{family}: the fused kernels did not build; nothing to measure", file=sys.stderr)
            return 2
        model.reset()
        model.forward(torch.randint(model.vocab_size, (a.context,), generator=gen), num_logits=1)
        bases[family] = model.length
        step[family] = torch.randint(model.vocab_size, (1,), generator=gen)

    def one(family: str) -> float:
        model = built[family]
        t0 = time.perf_counter()
        model.extend(step[family])
        model.truncate(bases[family])
        return time.perf_counter() - t0

    for family in families:  # warm-up
        one(family)
    samples: dict[str, list[float]] = {f: [] for f in families}
    for r in range(a.repeats):  # families take turns, the order rotating
        for family in families[r % len(families) :] + families[: r % len(families)]:
            samples[family].append(one(family))
    ms = {f: 1e3 * statistics.median(v) for f, v in samples.items()}
    base = ms.get("llama")
    report = {
        f: {"ms_per_step": round(v, 2), "vs_llama": round(v / base, 2) if base else None}
        for f, v in ms.items()
    }
    for f, row in report.items():
        print(f"{f:>12}: {row['ms_per_step']:.2f} ms per step, {row['vs_llama']} x llama")
    if a.out:
        write_report(a.out, report, "family_step_ms.py", argv, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
