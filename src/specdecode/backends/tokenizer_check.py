"""Tokenizer comparison between a target and a drafter.

Identical tokenizers (same token <-> id, same special tokens, same encoding of a probe set) let a
draft model propose target ids directly. Differing ones are drafted across vocabularies
(drafters/cross_vocab.py); for those the report says how much the vocabularies overlap (share of one
side's tokens whose text is also a token of the other side: what token-level intersection drafting
can propose) and how well text survives the trip through the other tokenizer (what string-level
re-tokenization relies on).
"""

from __future__ import annotations

import json
import re
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
    overlap_a: float = 1.0  # share of A's ordinary tokens whose text is a token of B
    overlap_b: float = 1.0  # share of B's ordinary tokens whose text is a token of A
    boundary_agreement: float = 1.0  # probe token boundaries shared by both / boundaries of either
    round_trips: float = 1.0  # share of probes that A encodes alike before and after a trip through B

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
        if not self.compatible:
            lines += [
                f"overlap: {self.overlap_a:.1%} of {name_a}'s tokens exist in {name_b}, "
                f"{self.overlap_b:.1%} of {name_b}'s in {name_a}",
                f"probes: {self.boundary_agreement:.1%} of token boundaries agree; "
                f"{self.round_trips:.0%} re-tokenize to {name_a}'s own tokens after a trip through {name_b}",
                "cross-vocabulary drafting: supported (string-level re-tokenization for greedy, "
                "token-level intersection for sampling)",
            ]
        return "\n".join(lines)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the printable character that stands for each byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tok) -> dict[int, bytes]:
    """id -> the bytes an ordinary (non-special) token stands for in text: byte-level pieces (GPT-2
    style) are mapped back to bytes, SentencePiece's '▁' is a space and <0xNN> a byte."""
    decoder = json.dumps(json.loads(tok.backend_tokenizer.to_str()).get("decoder"))
    byte_level = '"ByteLevel"' in decoder
    byte_of = _byte_decoder()
    special = set(tok.all_special_ids)
    added = tok.added_tokens_decoder  # {id: AddedToken}
    out = {}
    for piece, i in tok.get_vocab().items():
        if i in special or (i in added and added[i].special):
            continue
        if i in added:
            out[i] = added[i].content.encode()
        elif byte_level and all(c in byte_of for c in piece):
            out[i] = bytes(byte_of[c] for c in piece)
        elif m := _BYTE_FALLBACK.fullmatch(piece):
            out[i] = bytes([int(m[1], 16)])
        else:
            out[i] = piece.replace("▁", " ").encode()
    return out


def _ends(tok, text: str) -> set[int]:
    """Character offsets where tok's tokens of `text` end."""
    return {
        end for _, end in tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    }


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
    report = TokenizerReport(len(vocab_a), len(vocab_b), shared, differing, specials, probes)
    if not report.compatible:
        bytes_a, bytes_b = token_bytes(tok_a), token_bytes(tok_b)
        set_a, set_b = set(bytes_a.values()), set(bytes_b.values())
        report.overlap_a = sum(b in set_b for b in bytes_a.values()) / max(len(bytes_a), 1)
        report.overlap_b = sum(b in set_a for b in bytes_b.values()) / max(len(bytes_b), 1)
        both = either = trips = 0
        for text in PROBES:
            ends_a, ends_b = _ends(tok_a, text), _ends(tok_b, text)
            both, either = both + len(ends_a & ends_b), either + len(ends_a | ends_b)
            via_b = tok_b.decode(tok_b(text, add_special_tokens=False)["input_ids"])
            trips += (
                tok_a(via_b, add_special_tokens=False)["input_ids"]
                == tok_a(text, add_special_tokens=False)["input_ids"]
            )
        report.boundary_agreement = both / max(either, 1)
        report.round_trips = trips / len(PROBES)
    return report
