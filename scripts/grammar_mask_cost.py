"""Per-token cost of a structured-generation library's token mask on the CPU, for choosing one.

For each library that imports (llguidance, xgrammar, outlines-core), each JSON schema below is compiled
for the tokenizer of the target (default: SmolLM2-135M, 49,152 tokens), then a valid answer is walked
token by token: at each position the library computes the mask of allowed next tokens and consumes
the answer's token. Reported: compile seconds, mean and p90 microseconds per mask, and the mask's
share of a decode step (--step-ms, 7 ms: the default target's one-token step on a Zen 4 core pair).

    python3 scripts/grammar_mask_cost.py --out docs/results/grammar_mask_cost_smollm2_zen4.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from specdecode.backends.models import load_tokenizer

CASES = [
    (
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["name", "age", "tags"],
            "additionalProperties": False,
        },
        {"name": "Ada Lovelace", "age": 36, "tags": ["mathematician", "writer", "analyst"]},
    ),
    (
        {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "hourly": {"type": "boolean"},
            },
            "required": ["city", "unit", "days", "hourly"],
            "additionalProperties": False,
        },
        {"city": "Paris", "unit": "celsius", "days": 7, "hourly": False},
    ),
    ({"type": "object"}, {"answer": "free-form JSON", "items": [1, 2.5, None, True], "nested": {"a": "b"}}),
]


def _answer_tokens(tokenizer, answer) -> list[int]:
    """The answer as compact JSON (what the server's JSON grammars allow: no free whitespace)."""
    return tokenizer(json.dumps(answer, separators=(",", ":")), add_special_tokens=False)["input_ids"]


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.tok = llguidance.hf.from_tokenizer(tokenizer)
        self.mask = llguidance.torch.allocate_token_bitmask(1, self.tok.vocab_size)

    def compile(self, schema):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        return self.llg.LLMatcher(self.tok, grammar)

    def fill(self, m):
        self.llg.torch.fill_next_token_bitmask(m, self.mask, 0)

    def consume(self, m, token):
        assert m.consume_token(token), m.get_error()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer):
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
        self.compiler = xgrammar.GrammarCompiler(info)
        self.mask = xgrammar.allocate_token_bitmask(1, info.vocab_size)

    def compile(self, schema):
        return self.xgr.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema)))

    def fill(self, m):
        m.fill_next_token_bitmask(self.mask)

    def consume(self, m, token):
        assert m.accept_token(token)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer):
        import outlines_core
        from outlines_core.json_schema import build_regex_from_schema

        self.oc, self.regex = outlines_core, build_regex_from_schema
        byte_of = {c: b for b, c in _bytes_to_unicode().items()}
        vocab: dict[bytes, list[int]] = {}
        eos = tokenizer.eos_token_id
        special = set(tokenizer.all_special_ids)
        for token, i in tokenizer.get_vocab().items():
            if i in special:
                continue
            raw = bytes(byte_of[c] for c in token) if all(c in byte_of for c in token) else token.encode()
            vocab.setdefault(raw, []).append(i)
        self.vocab = outlines_core.Vocabulary(eos, vocab)
        self.mask = torch.zeros((len(tokenizer) + 31) // 32, dtype=torch.int32)

    def compile(self, schema):
        index = self.oc.Index(self.regex(json.dumps(schema), ""), self.vocab)
        return self.oc.Guide(index)

    def fill(self, guide):
        guide.write_mask_into(self.mask.data_ptr(), self.mask.numel(), self.mask.element_size())

    def consume(self, guide, token):
        guide.advance(token)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte's printable stand-in in byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def measure(lib, tokenizer, repeats: int) -> dict:
    compile_s, masks_us = [], []
    for schema, answer in CASES:
        tokens = _answer_tokens(tokenizer, answer)
        for _ in range(repeats):
            t0 = time.perf_counter()
            matcher = lib.compile(schema)
            compile_s.append(time.perf_counter() - t0)
            for token in tokens:
                t0 = time.perf_counter()
                lib.fill(matcher)
                masks_us.append((time.perf_counter() - t0) * 1e6)
                lib.consume(matcher, token)
    masks_us.sort()
    return {
        "compile_s_mean": statistics.fmean(compile_s),
        "mask_us_mean": statistics.fmean(masks_us),
        "mask_us_median": statistics.median(masks_us),
        "mask_us_p90": masks_us[int(0.9 * (len(masks_us) - 1))],
        "masks": len(masks_us),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="model whose tokenizer is used (default: SmolLM2-135M)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=7.0, help="a decode step, for the mask's share")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(args.target)
    results = {}
    for cls in (Llguidance, Xgrammar, OutlinesCore):
        try:
            lib = cls(tokenizer)
        except Exception as e:  # noqa: BLE001 (a library that does not install or load here is reported)
            results[cls.name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            continue
        r = measure(lib, tokenizer, args.repeats)
        r["share_of_step"] = r["mask_us_mean"] / (args.step_ms * 1e3)
        results[cls.name] = r
        print(cls.name, json.dumps(r), flush=True)
    out = {
        "what": "per-token JSON-schema mask cost on the CPU (one thread), SmolLM2 tokenizer",
        "machine": f"{platform.processor() or platform.machine()}, shared by other jobs",
        "vocab": len(tokenizer),
        "step_ms": args.step_ms,
        "results": results,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
