"""Training data by self-distillation: the target's own responses to a prompt set.

A data directory holds `sequences.jsonl`, one {"id", "category", "prompt_ids", "response_ids",
"source"} per line ("target": generated here; "given": a user's `response` tokenized as it is), and
`meta.json` naming the target. Only token ids are stored: hidden states and target distributions
are recomputed at training time by one teacher-forced forward per sequence (features.py), which keeps
the data small and valid for any head. Responses are generated with speculative decoding (n-gram
drafter by default); in fp32 greedy that is token-identical to plain decoding, only faster; with
batch > 1 several prompts decode together in the batched decoding core (batch_decoder.py).
Lines are appended as they finish, so a killed run resumes where it stopped (ids already present
are skipped).
"""

from __future__ import annotations

import itertools
import json
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from specdecode.corpora import Prompt, load_prompts
from specdecode.errors import UserError


@dataclass
class Sequence:
    id: str
    category: str
    prompt_ids: list[int]
    response_ids: list[int]
    source: str = "target"

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids


def _given_responses(spec: str) -> dict[str, str]:
    """For a JSONL prompt file: prompt id -> its optional `response` (same ids as corpora.read_jsonl)."""
    path = Path(spec)
    if not path.is_file():
        return {}
    out = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            obj = json.loads(line)
            if isinstance(obj.get("response"), str):
                out[str(obj.get("id", lineno))] = obj["response"]
    return out


def collect_prompts(specs: str, exclude: str = "") -> list[tuple[Prompt, str | None]]:
    """'mtbench,humaneval,file.jsonl' minus the prompts of `exclude` (e.g. the benchmark's
    'mtbench:1') -> (prompt, given response or None), categories interleaved round-robin so that a
    run stopped early still covers every category."""
    dropped = {p.id for s in exclude.split(",") if s for p in load_prompts(s)}
    by_cat: dict[str, list[tuple[Prompt, str | None]]] = {}
    seen = set()
    for spec in (s for s in specs.split(",") if s):
        given = _given_responses(spec)
        for p in load_prompts(spec):
            key = f"{spec}/{p.id}" if given else p.id
            if p.id not in dropped and key not in seen:
                seen.add(key)
                by_cat.setdefault(p.category, []).append((Prompt(p.prompt, key, p.category, p.task), given.get(p.id)))
    if not seen:
        raise UserError(f"no prompts left in {specs!r} after excluding {exclude!r}")
    queues = list(by_cat.values())
    order = []
    for i in range(max(map(len, queues))):
        order += [q[i] for q in queues if i < len(q)]
    return order


def read(data_dir: str | Path) -> list[Sequence]:
    path = Path(data_dir) / "sequences.jsonl"
    if not path.is_file():
        raise UserError(f"no training data in {data_dir}: run `specdecode train data --out {data_dir}` first")
    return [Sequence(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def generate_data(loaded, prompts: list[tuple[Prompt, str | None]], out: str | Path, *, drafter: str = "ngram",
                  context=None, k: int = 4, params=None, max_new_tokens: int = 256, minutes: float | None = None,
                  seed: int = 0, batch: int = 1, meta: dict | None = None) -> list[Sequence]:
    """Append the target's responses for every prompt not yet in out/sequences.jsonl; stop
    starting new ones after `minutes`. `drafter` is a drafter spec (context: how to build it);
    batch > 1 decodes that many prompts at once through the batched core (continuous batching,
    same greedy output, several times the tokens per CPU-second). Returns all sequences."""
    from tqdm import tqdm

    from specdecode.drafters import DrafterContext
    from specdecode.core.generation import encode_prompt
    from specdecode.core.sampling import SamplingParams

    if batch < 1:
        raise UserError(f"batch must be at least 1, got {batch}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").write_text(json.dumps(meta or {}, indent=1))
    done = {s.id for s in read(out)} if (out / "sequences.jsonl").exists() else set()
    todo = [(p, r) for p, r in prompts if p.id not in done]
    deadline = time.monotonic() + 60 * minutes if minutes else None
    tok, eos = loaded.tokenizer, loaded.eos_ids
    encoded = [(p, encode_prompt(tok, p.prompt, None), given) for p, given in todo]
    generated = [(p, ids) for p, ids, given in encoded if given is None]
    respond = _respond_one_by_one if batch == 1 else _respond_batched
    replies = respond(loaded, generated, drafter=drafter, context=context or DrafterContext(loaded), k=k,
                      params=params or SamplingParams(), max_new_tokens=max_new_tokens, seed=seed,
                      deadline=deadline, batch=batch)
    given_replies = ((p, ids, tok(given, add_special_tokens=False)["input_ids"] + sorted(eos)[:1], "given")
                     for p, ids, given in encoded if given is not None)
    new_tokens, t0 = 0, time.monotonic()
    with open(out / "sequences.jsonl", "a") as f, tqdm(total=len(todo), desc="train data", unit="prompt") as bar:
        for p, ids, response, source in itertools.chain(given_replies, ((p, ids, r, "target") for p, ids, r in replies)):
            f.write(json.dumps(Sequence(p.id, p.category, ids, response, source).__dict__) + "\n")
            f.flush()
            new_tokens += len(response)
            bar.update()
            bar.set_postfix(tokens=new_tokens, tok_s=f"{new_tokens / (time.monotonic() - t0):.1f}")
        if bar.n < len(todo):
            bar.write(f"time limit reached after {bar.n} of {len(todo)} prompts")
    return read(out)


def _seed(seed: int, prompt: Prompt) -> int:
    return seed + zlib.crc32(prompt.id.encode())


def _respond_one_by_one(loaded, prompts, *, drafter, context, k, params, max_new_tokens, seed, deadline, batch):
    """(prompt, ids) -> yields (prompt, ids, response ids) in order, one generate() each."""
    from specdecode import drafters
    from specdecode.core.generation import generate

    draft = drafters.build(drafter, context)
    for p, ids in prompts:
        if deadline and time.monotonic() > deadline:
            return
        result = generate(loaded, draft, ids, k=k, params=params, max_new_tokens=max_new_tokens, seed=_seed(seed, p))
        yield p, ids, result.token_ids


def _respond_batched(loaded, prompts, *, drafter, context, k, params, max_new_tokens, seed, deadline, batch):
    """The same, `batch` at a time through the batched decoding core; yields in order of completion."""
    import torch

    from specdecode import drafters
    from specdecode.core.batch_decoder import BatchDecoder, Sequence, per_sequence
    from specdecode.backends.batch_model import batched
    from specdecode.core.control import FixedK

    core = BatchDecoder(batched(loaded.model, batch))
    template = drafters.build(drafter, context)
    pending, running = list(reversed(prompts)), {}
    while pending or running:
        admitted = []
        while pending and len(admitted) < len(core.free) and not (deadline and time.monotonic() > deadline):
            p, ids = pending.pop()
            seq = Sequence(ids, per_sequence(template), FixedK(k), params, torch.Generator().manual_seed(_seed(seed, p)),
                           max_new_tokens, loaded.eos_ids)
            running[seq] = p
            admitted.append(seq)
        if admitted:
            core.start(admitted)
        if not running:
            return
        seqs = list(running)
        core.step(seqs)
        for seq in seqs:
            if seq.finished:
                core.release(seq)
                yield running.pop(seq), seq.prompt, seq.context[len(seq.prompt):]


def token_map(seqs: list[Sequence], vocab_size: int, size: int) -> "torch.Tensor":
    """The draft vocabulary: the `size` target tokens most frequent in the responses (then in the
    prompts), topped up with the lowest ids not yet in it (BPE ids roughly follow merge order, i.e.
    frequency in the tokenizer's corpus). Returns [size] target ids, sorted ascending."""
    import torch

    size = min(size, vocab_size)
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for s in seqs:
        counts.index_add_(0, torch.tensor(s.response_ids, dtype=torch.long), torch.ones(len(s.response_ids), dtype=torch.float64))
        counts.index_add_(0, torch.tensor(s.prompt_ids, dtype=torch.long), torch.full((len(s.prompt_ids),), 1e-3, dtype=torch.float64))
    score = counts - torch.arange(vocab_size, dtype=torch.float64) * 1e-9  # ties: lower id first
    return score.topk(size).indices.sort().values
