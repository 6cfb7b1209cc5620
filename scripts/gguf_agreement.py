"""Greedy outputs of the quantized dtypes against fp32 on the same GGUF file: how many are identical.

    python3 scripts/gguf_agreement.py [--target M] [--prompts heldout:1] [--max-new-tokens 96]
                                      [--dtypes gguf-exact,gguf] [--reference fp32]
                                      [--kv-dtypes auto,fp16,int8] [--threads 2] [--out F.json]

For each dtype (and fp32, the reference) the target is loaded through the Python API
(`specdecode.LLM(dtype=...)`, plain decoding: drafter `none`) and every prompt is completed greedily
alone (chat template applied, `--max-new-tokens` at most). Reported per dtype: how many outputs are
token-identical to fp32's ("11/11"), and per prompt the first position where the two differ (null:
identical). `gguf-exact` dequantizes the blocks to fp32's exact values, so it must agree everywhere;
`gguf` quantizes activations to 8 bits and parts from fp32 somewhere in most outputs. Speed is not
measured: the machine's load does not change the tokens. The CPU is named in the output (the 8-bit
kernels differ between AVX2 and AVX-512 VNNI machines, and so may `gguf`'s first divergences).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from anatomy import write_report  # noqa: E402


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first position where the two token lists differ (the shorter one's end counts); None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def outputs(
    target: str | None, dtype: str, texts: list[str], max_new: int, threads: int, kv_dtype: str = "auto"
) -> list[list[int]]:
    """Greedy token ids per prompt, one request at a time (a batch could round 8-bit rows differently)."""
    import specdecode

    llm = specdecode.LLM(target, "none", dtype=dtype, threads=threads, max_batch=1, kv_dtype=kv_dtype)
    params = specdecode.SamplingParams(temperature=0, max_tokens=max_new)
    return [llm.generate(text, params, chat=True)[0].token_ids for text in texts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None, help="default: the default target (SmolLM2-135M Q4_1 GGUF)")
    p.add_argument("--prompts", default="heldout:1")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--dtypes", default="gguf-exact,gguf", help="compared against the reference")
    p.add_argument("--reference", default="fp32", help="the dtype compared against (its KV cache: auto)")
    p.add_argument(
        "--kv-dtypes", default="auto", help="each dtype with each of these KV caches (auto, fp16, int8)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    from specdecode.corpora import load_prompts

    texts = [q.prompt for q in load_prompts(a.prompts)]
    reference = outputs(a.target, a.reference, texts, a.max_new_tokens, a.threads)
    report = {}
    for dtype in a.dtypes.split(","):
        for kv in a.kv_dtypes.split(","):
            got = outputs(a.target, dtype, texts, a.max_new_tokens, a.threads, kv)
            where = [first_divergence(ref, out) for ref, out in zip(reference, got)]
            same = sum(w is None for w in where)
            name = dtype if kv == "auto" else f"{dtype} kv {kv}"
            report[name] = {f"identical_to_{a.reference}": f"{same}/{len(texts)}", "first_divergence": where}
            print(f"{name}: {same}/{len(texts)} identical to {a.reference}; first divergence {where}")
    if a.out:
        write_report(a.out, report, "gguf_agreement.py", argv, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
