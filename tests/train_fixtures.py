"""Shared by the training tests: a tiny self-distillation data set and trained tiny drafters."""

from __future__ import annotations

from specdecode.corpora import Prompt

PROMPTS = [
    "The quick brown fox",
    "def fibonacci(n):",
    "Hello, world! How are",
    "SELECT id, name FROM",
    "One two three four",
    "The cat sat on the",
    "Speculative decoding drafts",
    "for i in range(10):",
]


def make_data(target, directory, max_new_tokens: int = 40, batch: int = 1, shard_size: int = 256):
    from specdecode.train import data

    prompts = [(Prompt(text, str(i), "c"), None) for i, text in enumerate(PROMPTS)]
    data.generate_data(
        target,
        prompts,
        directory,
        drafter="ngram",
        max_new_tokens=max_new_tokens,
        batch=batch,
        shard_size=shard_size,
    )
    return directory
