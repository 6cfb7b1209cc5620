"""Tokenizer compatibility between a target and a drafter: same vocabulary (token <-> id), same
special tokens, and the same encoding of a probe set of strings. A draft model whose tokenizer
differs would be verified against the wrong tokens: that is an error, never silent garbage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PROBES = [
    "Hello, world! How are you today?",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. 1234567890 3.14159",
    '{"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}',
    "SELECT id, name FROM users WHERE age >= 21 ORDER BY name;",
    "Une phrase en français, ein deutscher Satz, 日本語の文, emoji 🚀✨.",
    "   leading spaces\ttabs\n\nnewlines   ",
]


@dataclass
class TokenizerReport:
    vocab_size_a: int
    vocab_size_b: int
    shared_tokens: int  # same token string with the same id
    differing: list[str] = field(default_factory=list)  # examples of ids that map differently
    special_differences: list[str] = field(default_factory=list)
    probe_mismatches: list[str] = field(default_factory=list)

    @property
    def compatible(self) -> bool:
        return not (self.differing or self.special_differences or self.probe_mismatches)

    def summary(self, name_a: str = "A", name_b: str = "B") -> str:
        lines = [
            f"vocabulary: {name_a} {self.vocab_size_a} tokens, {name_b} {self.vocab_size_b} tokens, "
            f"{self.shared_tokens} identical (same string, same id)",
        ]
        for title, items in (
            ("tokens that differ", self.differing),
            ("special tokens that differ", self.special_differences),
            ("probe strings encoded differently", self.probe_mismatches),
        ):
            if items:
                lines.append(f"{title}: " + "; ".join(items[:10]) + (" ..." if len(items) > 10 else ""))
        lines.append("compatible: yes" if self.compatible else "compatible: NO")
        return "\n".join(lines)


def compare(tok_a, tok_b) -> TokenizerReport:
    vocab_a, vocab_b = tok_a.get_vocab(), tok_b.get_vocab()
    by_id_a = {i: t for t, i in vocab_a.items()}
    by_id_b = {i: t for t, i in vocab_b.items()}
    shared = sum(1 for t, i in vocab_a.items() if vocab_b.get(t) == i)
    differing = [
        f"id {i}: {by_id_a.get(i)!r} vs {by_id_b.get(i)!r}"
        for i in sorted(set(by_id_a) | set(by_id_b))
        if by_id_a.get(i) != by_id_b.get(i)
    ]
    specials = []
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(tok_a, attr, None), getattr(tok_b, attr, None)
        if a is not None and b is not None and a != b:
            specials.append(f"{attr}: {a} vs {b}")
    probes = []
    for text in PROBES:
        ids_a = tok_a(text, add_special_tokens=False)["input_ids"]
        ids_b = tok_b(text, add_special_tokens=False)["input_ids"]
        if ids_a != ids_b:
            probes.append(f"{text[:30]!r}: {ids_a[:8]} vs {ids_b[:8]}")
    return TokenizerReport(len(vocab_a), len(vocab_b), shared, differing, specials, probes)
