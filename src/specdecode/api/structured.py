"""StructuredOutputs: a grammar the output must follow, named as vLLM names it
(vllm.sampling_params.StructuredOutputsParams): exactly one of `json` (a JSON schema), `json_object`,
`regex` or `grammar` (a Lark grammar in llguidance's dialect, start rule `start`).

`from_response_format` reads the same object a client sends to the server as `response_format`
(docs/server.md), so `specdecode audit --response-format` and the server take one shape. Compiling
needs the target's tokenizer (decoding/grammar.py): `Compiler` does it once per target and format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdecode.errors import UserError

if TYPE_CHECKING:
    from specdecode.decoding.grammar import Grammars


# response_format types -> the field each one needs beside "type"
FIELDS = {
    "text": None,
    "json_object": None,
    "json_schema": "json_schema",
    "regex": "pattern",
    "grammar": "grammar",
}


@dataclass(frozen=True)
class StructuredOutputs:
    json: dict | None = None  # a JSON schema the output validates against
    json_object: bool = False  # any JSON object
    regex: str | None = None  # the output matches this regular expression whole
    grammar: str | None = None  # a Lark grammar (llguidance's dialect) whose start rule is `start`

    def __post_init__(self):
        given = [
            name
            for name, value in (("json", self.json), ("regex", self.regex), ("grammar", self.grammar))
            if value is not None
        ] + (["json_object"] if self.json_object else [])
        if len(given) != 1:
            raise UserError(
                "structured outputs: give exactly one of json, json_object, regex, grammar"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.json is not None and not isinstance(self.json, dict):
            raise UserError(f"structured outputs: json must be a JSON schema object, got {self.json!r:.60}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise UserError(f"structured outputs: {name} must be a non-empty string")

    @classmethod
    def from_response_format(cls, fmt: dict | str) -> StructuredOutputs | None:
        """OpenAI's response_format (a dict, or its JSON text): {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"schema": {...}}}, and our extensions
        {"type": "regex", "pattern": P}, {"type": "grammar", "grammar": G}; {"type": "text"}: None."""
        if isinstance(fmt, str):
            try:
                fmt = json.loads(fmt)
            except json.JSONDecodeError as e:
                raise UserError(f"response_format is not valid JSON: {e}") from None
        if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
            raise UserError('response_format must be an object with a "type", e.g. {"type": "json_object"}')
        kind = fmt["type"]
        if kind not in FIELDS:
            raise UserError(f"response_format type {kind!r} is not one of {', '.join(FIELDS)}")
        if extra := set(fmt) - {"type", FIELDS[kind]}:
            raise UserError(f"response_format type {kind!r} takes no {', '.join(sorted(extra))}")
        if FIELDS[kind] is not None and FIELDS[kind] not in fmt:
            raise UserError(f"response_format type {kind!r} needs {FIELDS[kind]!r}")
        if kind == "text":
            return None
        if kind == "json_object":
            return cls(json_object=True)
        if kind == "json_schema":
            schema = fmt["json_schema"].get("schema") if isinstance(fmt["json_schema"], dict) else None
            if not isinstance(schema, dict):
                raise UserError('response_format json_schema needs {"schema": {...}}')
            return cls(json=schema)
        if kind == "regex":
            return cls(regex=fmt["pattern"])
        return cls(grammar=fmt["grammar"])

    def to_response_format(self) -> dict:
        """The response_format a client sends to the server for this format."""
        if self.json_object:
            return {"type": "json_object"}
        if self.json is not None:
            return {"type": "json_schema", "json_schema": {"name": "response", "schema": self.json}}
        if self.regex is not None:
            return {"type": "regex", "pattern": self.regex}
        return {"type": "grammar", "grammar": self.grammar}

    def compile(self, grammars: Grammars) -> str:
        """The grammar llguidance runs, for the target's tokenizer; an invalid one is a UserError."""
        if self.json_object:
            return grammars.json_object()
        if self.json is not None:
            return grammars.json_schema(self.json)
        if self.regex is not None:
            return grammars.regex(self.regex)
        return grammars.lark(self.grammar)

    def key(self) -> str:
        """Equal formats, equal keys (a schema dict makes the dataclass unhashable)."""
        return json.dumps([self.json, self.json_object, self.regex, self.grammar], sort_keys=True)


def check_ignore_eos(ignore_eos: bool, field: str) -> None:
    """The one rule, for the API's structured_outputs and the server's response_format (`field`): a
    grammar ends the output where it completes, so ignore_eos cannot go with it (a UserError)."""
    if ignore_eos:
        raise UserError(f"ignore_eos cannot be used with {field}: the output ends where it completes")


class Compiler:
    """Structured outputs -> the grammar text the engine runs, for one target. llguidance's view of the
    tokenizer takes seconds to build for a large vocabulary: `grammars` (the engine's, made on first
    use) is asked once; each distinct format is compiled once (LLM.with_drafter's copies share this)."""

    def __init__(self, grammars: Callable[[], Grammars]):
        self.grammars = grammars
        self.compiled: dict[str, str] = {}  # StructuredOutputs.key() -> llguidance grammar

    def compile(self, fmt: StructuredOutputs) -> str:
        key = fmt.key()
        if key not in self.compiled:
            self.compiled[key] = fmt.compile(self.grammars())
        return self.compiled[key]
