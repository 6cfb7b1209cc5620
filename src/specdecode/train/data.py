"""Training data by self-distillation: the target's own responses to a prompt set.

A data directory holds shards of sequences (shards.py: prompt and response token ids, uint16,
compressed, checksummed) and `meta.json` naming the target; older directories hold
`sequences.jsonl`, still read. Only token ids are stored: hidden states and target distributions are
recomputed at training time by one teacher-forced forward per sequence (features.py), which keeps the
data small and valid for any head. Responses are generated with speculative decoding (n-gram
drafter by default); in fp32 greedy that is token-identical to plain decoding, only faster; with
batch > 1 several prompts decode together in the engine (specdecode/engine), as the server's do.
Finished sequences are buffered and written as a shard every `shard_size` sequences, every
`flush_minutes` and when the run ends or is stopped (SIGTERM, Ctrl-C): a rerun resumes by skipping the
ids already in shards. A second turn (Prompt.parent, e.g. MT-bench's) is asked after its parent's
response, which the same run (or an earlier one) generated first.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from specdecode import shards
from specdecode.corpora import Prompt, jsonl_rows, load_prompts
from specdecode.errors import UserError

if TYPE_CHECKING:
    import torch
from specdecode.shards import Record


def _given_responses(spec: str) -> dict[str, str]:
    """For a JSONL prompt file: prompt id -> its optional `response` (same ids as corpora.read_jsonl)."""
    path = Path(spec)
    if not path.is_file():
        return {}
    return {
        str(obj.get("id", lineno)): obj["response"]
        for lineno, obj in jsonl_rows(path, "prompt file")
        if isinstance(obj.get("response"), str)
    }


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
                by_cat.setdefault(p.category, []).append(
                    (Prompt(p.prompt, key, p.category, p.task), given.get(p.id))
                )
    if not seen:
        raise UserError(f"no prompts left in {specs!r} after excluding {exclude!r}")
    queues = list(by_cat.values())
    order = []
    for i in range(max(map(len, queues))):
        order += [q[i] for q in queues if i < len(q)]
    return order


def part(prompts: list[tuple[Prompt, str | None]], spec: str) -> tuple[list[tuple[Prompt, str | None]], str]:
    """'I/N' -> the prompts worker I of N answers (a conversation stays with one worker: its first
    turn's id decides), and the tag its shards carry, so workers can share one data directory."""
    i, sep, n = spec.partition("/")
    if not (sep and i.isdigit() and n.isdigit() and int(i) < int(n)):
        raise UserError(f"--part expects I/N with 0 <= I < N (e.g. 0/2), got {spec!r}")
    i, n = int(i), int(n)
    mine = [(p, given) for p, given in prompts if zlib.crc32((p.parent or p.id).encode()) % n == i]
    return mine, f"p{i}of{n}"


def response_tokens(seqs: list[Record]) -> int:
    """Target response tokens in a training set (what the data-scaling curve counts)."""
    return sum(len(s.response_ids) for s in seqs)


def split(seqs: list[Record], fraction: float) -> tuple[list[int], list[int]]:
    """Indices of the training and held-out sequences: a sequence is held out when the hash of its id
    falls in the first `fraction` of the range, so a sequence stays on its side as the data grows
    (every point of a data-scaling curve is scored on the same held-out prompts it has)."""
    if not 0 <= fraction < 1:
        raise UserError(f"--val: expected a fraction in [0, 1), got {fraction}")
    held = [zlib.crc32(s.id.encode()) < fraction * 2**32 for s in seqs]
    train, val = [i for i, h in enumerate(held) if not h], [i for i, h in enumerate(held) if h]
    if fraction and (not val or not train):
        raise UserError(
            f"--val {fraction}: {len(val)} held-out and {len(train)} training sequences of "
            f"{len(seqs)} (a larger data set or another fraction is needed)"
        )
    return train, val


def read(data_dir: str | Path, target: dict | None = None) -> list[Record]:
    """Every sequence of a data directory: its shards, then a legacy sequences.jsonl."""
    path = Path(data_dir)
    legacy = path / "sequences.jsonl"
    if not shards.paths(path) and not legacy.is_file():
        raise UserError(f"no training data in {data_dir}: run `specdecode train data --out {data_dir}` first")
    seqs = shards.read_all(path, target)
    if legacy.is_file():
        seqs += [Record(**json.loads(line)) for line in legacy.read_text().splitlines() if line.strip()]
    return seqs


class ShardWriter:
    """Buffers finished sequences and writes them as a shard every `size` sequences or `minutes`."""

    def __init__(self, directory: Path, target: dict, size: int = 256, minutes: float = 10.0, tag: str = ""):
        self.directory, self.target, self.size, self.seconds, self.tag = (
            directory,
            target,
            size,
            60 * minutes,
            tag,
        )
        self.buffer: list[Record] = []
        self.last = time.monotonic()
        self.written = 0

    def add(self, seq: Record) -> None:
        self.buffer.append(seq)
        if len(self.buffer) >= self.size or time.monotonic() - self.last >= self.seconds:
            self.flush()

    def flush(self) -> None:
        if self.buffer:
            shards.write(shards.next_path(self.directory, self.tag), self.buffer, self.target)
            self.written += len(self.buffer)
            self.buffer = []
        self.last = time.monotonic()


def merge(
    sources: list[str | Path], out: str | Path, shard_size: int = 1024, max_tokens: int | None = None
) -> list[Record]:
    """Join data directories into `out` (new, or holding shards of the same target): sequences
    deduplicated by id (the first copy kept), written as shards of `shard_size`; with max_tokens, only
    the first sequences (in the sources' order, which interleaves the prompt sets) up to that many
    response tokens in `out`."""
    if max_tokens is not None and max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {max_tokens}")
    out = Path(out)
    targets = {
        json.dumps(shards.target_of(p), sort_keys=True) for d in [*sources, out] for p in shards.paths(d)
    }
    if len(targets) > 1:
        raise UserError(f"cannot merge responses of different targets: {sorted(targets)}")
    existing = read(out) if shards.paths(out) else []
    have, budget = {s.id for s in existing}, (max_tokens or 0) - response_tokens(existing)
    fresh = []
    for seq in (seq for source in sources for seq in read(source)):
        if max_tokens is not None and budget < len(seq.response_ids):
            break
        if seq.id not in have:
            have.add(seq.id)
            fresh.append(seq)
            budget -= len(seq.response_ids)
    if not targets:
        raise UserError(f"no shards in {', '.join(map(str, sources))}")
    out.mkdir(parents=True, exist_ok=True)
    target = json.loads(targets.pop())
    for i in range(0, len(fresh), shard_size):
        shards.write(shards.next_path(out), fresh[i : i + shard_size], target)
    meta = Path(sources[0]) / "meta.json"
    if meta.is_file() and not (out / "meta.json").exists():
        (out / "meta.json").write_text(meta.read_text())
    return read(out)


def generate_data(
    loaded,
    prompts: list[tuple[Prompt, str | None]],
    out: str | Path,
    *,
    drafter="ngram",
    context=None,
    k: int = 4,
    params=None,
    max_new_tokens: int = 256,
    minutes: float | None = None,
    seed: int = 0,
    batch: int = 1,
    meta: dict | None = None,
    shard_size: int = 256,
    flush_minutes: float = 10.0,
    max_prompt_tokens: int | None = None,
    tag: str = "",
) -> list[Record]:
    """Generate the target's responses for every prompt whose id is not yet in `out`, writing shards
    as it goes; stop starting new ones after `minutes`. `drafter` is a drafter spec, a Spec or its
    text (context: how to build it); batch > 1 decodes that many prompts at once through the engine
    (same greedy output, several times the tokens per CPU-second). Prompts longer than max_prompt_tokens are
    skipped. tag: this worker's shard-name tag (see part()). Returns all sequences of `out`."""
    from specdecode.backends import checkpoint
    from specdecode.core.sampling import Warp
    from specdecode.drafters import DrafterContext, parse

    if batch < 1:
        raise UserError(f"batch must be at least 1, got {batch}")
    if shard_size < 1:
        raise UserError(f"shard size must be at least 1, got {shard_size}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target = checkpoint.describe(loaded)
    done = (
        {s.id: s for s in read(out, target)}
        if shards.paths(out) or (out / "sequences.jsonl").exists()
        else {}
    )
    if not (out / "meta.json").exists():
        (out / "meta.json").write_text(json.dumps(meta or {}, indent=1))
    by_id = {p.id: p for p, _ in prompts}
    writer = ShardWriter(out, target, shard_size, flush_minutes, tag)
    deadline = time.monotonic() + 60 * minutes if minutes else None
    options = dict(
        drafter=parse(drafter),  # the batched engine routes by Spec
        context=context or DrafterContext(loaded),
        k=k,
        params=params or Warp(),
        max_new_tokens=max_new_tokens,
        seed=seed,
        deadline=deadline,
        batch=batch,
    )
    previous = signal.signal(signal.SIGTERM, _stop)
    skipped = 0
    try:
        # first the prompts that can be asked now, then second turns whose parent got its answer
        for ready in (lambda p: p.parent is None or p.parent in done, lambda p: p.parent in done):
            todo = [(p, given) for p, given in prompts if p.id not in done and ready(p)]
            encoded = [(p, _encode(loaded.tokenizer, p, by_id, done), given) for p, given in todo]
            long = [e for e in encoded if max_prompt_tokens and len(e[1]) > max_prompt_tokens]
            skipped += len(long)
            encoded = [e for e in encoded if e not in long]
            for seq in _responses(loaded, encoded, options):
                writer.add(seq)
                done[seq.id] = seq
    finally:
        writer.flush()
        signal.signal(signal.SIGTERM, previous)
    if skipped:
        print(f"skipped {skipped} prompts longer than {max_prompt_tokens} tokens")
    return read(out)


def _stop(signum, frame):
    raise KeyboardInterrupt(
        f"signal {signum}"
    )  # unwinds through generate_data's finally: the buffer is written


def _encode(tokenizer, prompt: Prompt, by_id: dict[str, Prompt], done: dict[str, Record]) -> list[int]:
    """Chat-formatted ids of a prompt; a second turn follows its parent's question and the target's own
    answer."""
    from specdecode.decoding.generation import encode_prompt

    if prompt.parent is None:
        return encode_prompt(tokenizer, prompt.prompt, None)
    answer = tokenizer.decode(done[prompt.parent].response_ids, skip_special_tokens=True)
    messages = [
        {"role": "user", "content": by_id[prompt.parent].prompt},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": prompt.prompt},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _responses(loaded, encoded, options):
    """(prompt, ids, given response or None) -> Sequences: given responses as they are, the rest generated."""
    from tqdm import tqdm

    tok, eos = loaded.tokenizer, loaded.eos_ids
    generated = [(p, ids) for p, ids, given in encoded if given is None]
    respond = _respond_one_by_one if options["batch"] == 1 else _respond_batched
    given = (
        (p, ids, tok(text, add_special_tokens=False)["input_ids"] + sorted(eos)[:1], "given")
        for p, ids, text in encoded
        if text is not None
    )
    replies = ((p, ids, r, "target") for p, ids, r in respond(loaded, generated, **options))
    new_tokens, t0 = 0, time.monotonic()
    with tqdm(total=len(encoded), desc="train data", unit="prompt") as bar:
        for p, ids, response, source in itertools.chain(given, replies):
            new_tokens += len(response)
            bar.update()
            bar.set_postfix(tokens=new_tokens, tok_s=f"{new_tokens / (time.monotonic() - t0):.1f}")
            yield Record(p.id, p.category, ids, response, source)
        if bar.n < len(encoded):
            bar.write(f"time limit reached after {bar.n} of {len(encoded)} prompts")


def _seed(seed: int, prompt: Prompt) -> int:
    return seed + zlib.crc32(prompt.id.encode())


def _respond_one_by_one(
    loaded, prompts, *, drafter, context, k, params, max_new_tokens, seed, deadline, batch
):
    """(prompt, ids) -> yields (prompt, ids, response ids) in order, one generate() each."""
    from specdecode import drafters
    from specdecode.decoding.generation import generate

    draft = drafters.build(drafter, context)
    for p, ids in prompts:
        if deadline and time.monotonic() > deadline:
            return
        result = generate(
            loaded, draft, ids, k=k, params=params, max_new_tokens=max_new_tokens, seed=_seed(seed, p)
        )
        yield p, ids, result.token_ids


def _respond_batched(loaded, prompts, *, drafter, context, k, params, max_new_tokens, seed, deadline, batch):
    """The same, `batch` at a time through the engine (specdecode/engine); yields in order of completion."""
    from specdecode import engine as eng

    engine = eng.build_engine(
        loaded,
        eng.default_routes(drafter, k, False),
        model_name="train data",
        max_batch=batch,
        load_control=False,
        precision=context.precision,
        device=context.device,
        backend=context.backend,
        drafter_quant=context.quant,
        chunked_prefill=False,
    )
    pending, running = list(reversed(prompts)), {}
    while pending or running:
        while pending and len(running) < batch and not (deadline and time.monotonic() > deadline):
            p, ids = pending.pop()
            request = eng.Request(ids, params, max_new_tokens, seed=_seed(seed, p), drafter=drafter, k=k)
            collected = eng.Collected()
            engine.submit(request, collected.add)
            running[p.id] = (p, ids, collected)
        if not running:
            return
        engine.iterate()
        for key, (p, ids, collected) in list(running.items()):
            collected.check()
            if collected.done is not None:
                del running[key]
                yield p, ids, collected.done.tokens


def token_map(seqs: list[Record], vocab_size: int, size: int) -> "torch.Tensor":
    """The draft vocabulary: the `size` target tokens most frequent in the responses (then in the
    prompts), topped up with the lowest ids not yet in it (BPE ids roughly follow merge order, i.e.
    frequency in the tokenizer's corpus). Returns [size] target ids, sorted ascending."""
    import torch

    size = min(size, vocab_size)
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for s in seqs:
        counts.index_add_(
            0,
            torch.tensor(s.response_ids, dtype=torch.long),
            torch.ones(len(s.response_ids), dtype=torch.float64),
        )
        counts.index_add_(
            0,
            torch.tensor(s.prompt_ids, dtype=torch.long),
            torch.full((len(s.prompt_ids),), 1e-3, dtype=torch.float64),
        )
    score = counts - torch.arange(vocab_size, dtype=torch.float64) * 1e-9  # ties: lower id first
    return score.topk(size).indices.sort().values
