"""`specdecode train prompts`: chat prompts written by the target itself (Magpie).

Magpie (Xu et al. 2024, "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned LLMs
with Nothing", arXiv 2406.08464): an instruction-tuned model given only its chat template up to the
point where a user's message begins writes a plausible user message, drawn from the distribution of
requests it was tuned on. For drafter training this gives what the packaged corpora lack: many
diverse, chat-like prompts on the target's own topics, without a dataset download.

Each prompt i is sampled with its own seed (seed, i), so a run that stops part-way resumes by
appending the prompts it does not have yet, and gives the file an uninterrupted run would. The
samples come from the engine (specdecode/engine), a few attempts at a time, and are kept in order.
A sample is kept when it ends the user turn by itself (not cut at max_tokens), has at least
`min_words` words and is not a duplicate of one already kept.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

from specdecode.errors import UserError

SENTINEL = "\x00specdecode-user-message\x00"
BATCH = 8  # attempts sampled together in the engine (each with its own seed: the same text as alone)


def query_prefix(tokenizer) -> list[int]:
    """The chat template's token ids up to where the user's message begins (its default system
    prompt included, as a user of the model would see it)."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("train prompts needs a chat model: the tokenizer has no chat template")
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False)
    head, found, _ = text.partition(SENTINEL)
    if not found:
        raise UserError("the chat template does not place the user's message in its text")
    return tokenizer(head, add_special_tokens=False)["input_ids"]


def _existing(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
            int(str(row["id"]).rpartition("-")[2])
            rows.append(row)
        except (ValueError, KeyError, TypeError):
            raise UserError(
                f"{path}:{lineno}: not a line written by `train prompts`; "
                "give a new --out file (nothing was changed)"
            ) from None
    return rows


def write_prompts(
    loaded,
    out: str | Path,
    count: int,
    *,
    seed: int = 0,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_tokens: int = 96,
    min_words: int = 4,
    max_attempts: int | None = None,
    prefix: str = "self",
) -> list[dict]:
    """Append prompts to the JSONL file `out` until it holds `count` ({"prompt", "id", "category":
    "self-instruct"} per line, ids PREFIX-ATTEMPT). Returns all rows of the file."""
    from tqdm import tqdm

    from specdecode import drafters
    from specdecode import engine as eng
    from specdecode.core.sampling import Warp
    from specdecode.engine.client import complete

    if count < 1:
        raise UserError(f"count must be at least 1, got {count}")
    params = Warp(temperature, top_p=top_p)
    if params.greedy:
        raise UserError("train prompts samples: the temperature must be above 0")
    out = Path(out)
    rows = _existing(out)
    seen = {r["prompt"] for r in rows}
    attempt = 1 + max((int(str(r["id"]).rpartition("-")[2]) for r in rows), default=-1)
    limit = attempt + (max_attempts or 20 * count)
    ids = query_prefix(loaded.tokenizer)
    plain = drafters.parse("none")
    engine = eng.build_engine(
        loaded,
        eng.default_routes(plain, 1, False),
        model_name="train prompts",
        max_batch=BATCH,
        load_control=False,
        chunked_prefill=False,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        out.open("a", encoding="utf-8") as f,
        tqdm(total=count, initial=min(len(rows), count), desc="train prompts", unit="prompt") as bar,
    ):
        while len(rows) < count and attempt < limit:
            window = range(attempt, min(attempt + BATCH, limit))  # sampled together, kept in order
            requests = [
                eng.Request(
                    ids,
                    params,
                    max_tokens,
                    seed=zlib.crc32(f"{seed}:{a}".encode()),
                    drafter=plain,
                    request_id=str(a),
                )
                for a in window
            ]
            samples = {int(r.request_id): got for r, got in complete(engine, requests, window=BATCH)}
            for a in window:
                if len(rows) >= count:
                    break
                attempt, text = a + 1, samples[a].text.strip()
                if (
                    samples[a].done.finish_reason == "stop"
                    and len(text.split()) >= min_words
                    and text not in seen
                ):
                    row = {"prompt": text, "id": f"{prefix}-{a}", "category": "self-instruct"}
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
                    f.flush()
                    rows.append(row)
                    seen.add(text)
                    bar.update()
    if len(rows) < count:
        print(f"stopped after {limit} samples with {len(rows)} prompts (most were cut or repeated)")
    return rows
