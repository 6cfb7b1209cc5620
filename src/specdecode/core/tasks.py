"""Task labels for prompts: a cheap keyword/shape classifier, used when a request carries no label.

Labels: code, math, structured-json, sql, summarization, translation, qa, creative. Rules are
checked in order of specificity; the first that matches wins; a question falls back to qa and
anything else to creative.
"""

from __future__ import annotations

import re

TASKS = ("code", "math", "structured-json", "sql", "summarization", "translation", "qa", "creative")

_RULES: list[tuple[str, re.Pattern]] = [
    (
        "sql",
        re.compile(
            r"\b(sql|select\s+.+\s+from|insert\s+into|group\s+by|join\s+\w+\s+on|database\s+query)\b",
            re.I | re.S,
        ),
    ),
    (
        "structured-json",
        re.compile(r"\bjson\b|\byaml\b|\bfunction[- ]call|\btool[- ]call|^\s*[\[{]", re.I | re.M),
    ),
    (
        "code",
        re.compile(
            r"```|\bdef \w+\(|\bclass \w+[:(]"
            r"|\b(python|javascript|typescript|java|c\+\+|rust|golang|bash|regex|html|css)\b"
            r"|\b(function|implement|algorithm|compile|debug|refactor|unit test)\b",
            re.I,
        ),
    ),
    (
        "translation",
        re.compile(
            r"\btranslat\w*\b|\b(into|to) (french|german|spanish|chinese|japanese|italian|english)\b", re.I
        ),
    ),
    (
        "summarization",
        re.compile(r"\b(summari[sz]\w*|tl;?dr|condense|key points|in \w+ sentences|extract)\b", re.I),
    ),
    (
        "math",
        re.compile(
            r"\b(solve|calculate|compute|equation|integral|derivative|probability|how many|how much|percent"
            r"|sum of)\b"
            r"|\d+\s*[-+*/^=]\s*\d+|\bx\s*[=+]",
            re.I,
        ),
    ),
    (
        "creative",
        re.compile(
            r"\b(write|compose|draft|story|poem|haiku|essay|blog|song|imagine|pretend|role[- ]?play)\b", re.I
        ),
    ),
    (
        "qa",
        re.compile(
            r"\?\s*$|^(what|who|when|where|why|how|which|is|are|does|do|can|explain|describe)\b", re.I | re.M
        ),
    ),
]


def classify(prompt: str) -> str:
    """prompt text -> one of TASKS."""
    for label, pattern in _RULES:
        if pattern.search(prompt):
            return label
    return "creative"
