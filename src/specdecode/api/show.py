"""Show the speculation: which tokens of a completion were accepted drafts and which the target
produced itself (the recovered or bonus token of each step), so a reader sees where α is won and lost.

A token's text is what decoding it adds to the text before it (`pieces`); a token that ends inside
a multi-byte character adds nothing and the next one carries the character. Marks: ANSI colour on a
terminal, ⟦…⟧ around each run of accepted drafts elsewhere, <span>s in the HTML view.
"""

from __future__ import annotations

import html
from pathlib import Path

from specdecode.api.outputs import CompletionOutput, RequestOutput

DRAFT_COLOR = "\x1b[32m"  # accepted drafts: green
RESET = "\x1b[0m"
OPEN, CLOSE = "⟦", "⟧"  # plain markers around a run of accepted drafts


def pieces(tokenizer, completion: CompletionOutput) -> list[tuple[str, bool]]:
    """The completion as (text, from_draft) per token, cut to the completion's text (a stop string's
    tokens beyond it add nothing)."""
    out, shown = [], ""
    for i, drafted in enumerate(completion.from_draft):
        text = tokenizer.decode(completion.token_ids[: i + 1], skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete character: the next token completes it
            out.append(("", drafted))
            continue
        text = text[: len(completion.text)]
        out.append((text[len(shown) :], drafted))
        shown = text
    return out


def _runs(parts: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Adjacent pieces of the same origin joined."""
    runs: list[tuple[str, bool]] = []
    for text, drafted in parts:
        if runs and runs[-1][1] == drafted:
            runs[-1] = (runs[-1][0] + text, drafted)
        elif text:
            runs.append((text, drafted))
    return runs


def terminal(tokenizer, completion: CompletionOutput, color: bool) -> str:
    """The completion's text with its accepted drafts marked: green when `color`, else ⟦…⟧."""
    opened, closed = (DRAFT_COLOR, RESET) if color else (OPEN, CLOSE)
    return "".join(opened + t + closed if d else t for t, d in _runs(pieces(tokenizer, completion)))


def legend(color: bool) -> str:
    mark = f"{DRAFT_COLOR}green{RESET}" if color else f"{OPEN}…{CLOSE}"
    return f"{mark}: accepted draft tokens; the rest: the target's own tokens (one per verify step)"


_STYLE = """body{font-family:sans-serif;max-width:60em;margin:2em auto}
pre{white-space:pre-wrap;font-size:1.05em;line-height:1.5;border:1px solid #ccc;padding:1em}
.d{background:#c8f0c8}.t{background:#fff}.stats{color:#555}"""


def html_view(tokenizer, outputs: list[RequestOutput], title: str) -> str:
    """A self-contained HTML page: each request's prompt, its completion with accepted drafts
    highlighted (each token's origin in its tooltip) and its speculation stats."""
    sections = []
    for out in outputs:
        spans = "".join(
            f'<span class="{"d" if d else "t"}" title="{"accepted draft" if d else "target"}">'
            f"{html.escape(t)}</span>"
            for t, d in _runs(pieces(tokenizer, out.outputs[0]))
        )
        m = out.metrics
        prompt = out.prompt if out.prompt is not None else tokenizer.decode(out.prompt_token_ids)
        sections.append(
            f"<h2>Request {html.escape(out.request_id)}</h2><p><b>Prompt:</b> {html.escape(prompt)}</p>"
            f"<pre>{spans}</pre><p class='stats'>α {m.acceptance_rate:.2f} ({m.accepted}/{m.drafted} drafts "
            f"accepted), τ {m.mean_accepted_length:.2f}, {m.target_forwards} target forwards for "
            f"{m.new_tokens} tokens</p>"
        )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p><span class='d'>highlighted</span>: accepted draft tokens; the rest: the target's own.</p>"
        + "".join(sections)
        + "</body></html>\n"
    )


def write_html(path: str | Path, tokenizer, outputs: list[RequestOutput], title: str) -> None:
    Path(path).write_text(html_view(tokenizer, outputs, title), encoding="utf-8")
