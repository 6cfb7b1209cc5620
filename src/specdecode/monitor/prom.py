"""Prometheus text exposition format: parse samples, fetch a scrape from a URL or a file.

Only what a scraper needs: `name{label="value",...} value [timestamp]` lines; comments (`# HELP`,
`# TYPE`) and blank lines are skipped. Label values may hold the escapes \\\\, \\" and \\n.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from specdecode.errors import UserError

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]  # sorted (key, value) pairs
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


def _labels(text: str, start: int, lineno: int) -> tuple[dict[str, str], int]:
    """text[start] == '{' -> (labels, index after the closing '}')."""
    labels, i = {}, start + 1
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if i < len(text) and text[i] == "}":
            return labels, i + 1
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= len(text) or text[eq + 1] != '"':
            raise ValueError(f"line {lineno}: malformed labels")
        key, i, value = text[i:eq].strip(), eq + 2, []
        while i < len(text) and text[i] != '"':
            if text[i] == "\\" and i + 1 < len(text):
                value.append(_ESCAPES.get(text[i + 1], text[i + 1]))
                i += 2
            else:
                value.append(text[i])
                i += 1
        if i >= len(text):
            raise ValueError(f"line {lineno}: unterminated label value")
        labels[key] = "".join(value)
        i += 1


def parse(text: str) -> list[Sample]:
    """Exposition text -> samples in order. Raises ValueError on a malformed sample line."""
    samples = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name, (labels, end) = line[:brace], _labels(line, brace, lineno)
            rest = line[end:].split()
        else:
            name, *rest = line.split()
            labels = {}
        if not rest:
            raise ValueError(f"line {lineno}: no value for {name}")
        try:
            value = float(rest[0])
        except ValueError:
            raise ValueError(f"line {lineno}: bad value {rest[0]!r} for {name}") from None
        samples.append(Sample(name, tuple(sorted(labels.items())), value))
    return samples


def locate(source: str) -> str:
    """Where `fetch` reads a source: an http(s) URL (a bare host:port gets http:// and /metrics) or a
    file path (a file:// URL loses its scheme); callers that treat a live server and a saved scrape
    differently (advice.read) ask this rather than guess."""
    if source.startswith("file://"):
        return source[len("file://") :]
    if not source.startswith(("http://", "https://")) and not Path(source).exists():
        if ":" in source and "/" not in source:  # host:port
            return f"http://{source}/metrics"
    return source


def is_live(source: str) -> bool:
    """A running server's endpoint (scraped over HTTP), not a saved scrape file."""
    return locate(source).startswith(("http://", "https://"))


def fetch(source: str, timeout: float = 5.0) -> str:
    """An http(s) URL (a bare host:port gets http:// and /metrics), a file:// URL or a file path -> text."""
    source = locate(source)
    if source.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(source, timeout=timeout) as response:
                return response.read().decode("utf-8", errors="replace")
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise UserError(f"cannot scrape {source}: {getattr(e, 'reason', e)}") from None
    path = Path(source).expanduser()
    if not path.is_file():
        raise UserError(f"no such metrics file or URL: {source}")
    return path.read_text(errors="replace")
