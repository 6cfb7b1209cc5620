"""The target's features for training: one teacher-forced forward per sequence.

For each sequence: the final hidden state of every position (after the final norm; the target's
next-token distribution is lm_head(hidden)) and the outputs of the `layers` an EAGLE-3 head fuses.
Distributions are not stored: a trainer computes them from `hidden` over its draft vocabulary.
The layers' outputs are kept in bfloat16 (an EAGLE input; 2,304 floats a token in float32 would
hold 8 GB for 900k tokens), the final hidden states, which make the teacher's logits, in float32:
on a tiny random model, whose logits nearly tie, bfloat16 rows move the teacher's argmax and a
head trained on them is never accepted. `compact()` rewrites a store's hidden rows in bfloat16 where
disk is short (the 1.5B's 2.73M tokens: 52 -> 42 GB; its head's held-out score 0.5874 -> 0.5875).
The result is stored per sequence (cached()), so the trainers that follow, a resumed run and a
larger data set skip the forward for what was computed before. `train data --capture` fills the
same store as it generates (Writer: the rows its own forwards computed, engine/capture.py), without
the last token's row, which decoding never computes (it would predict past the end).
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specdecode.backends.precision import FP32, Precision
from specdecode.errors import UserError
from specdecode.shards import Record


@dataclass
class Features:
    tokens: list[torch.Tensor]  # per sequence [n] token ids
    start: list[int]  # per sequence: index of the first response token (= prompt length)
    hidden: list[torch.Tensor]  # per sequence [n or n - 1 (Writer's), H] final hidden (after the norm)
    layers: list[
        torch.Tensor
    ]  # per sequence [n, len(layer ids) * H] bf16 captured layer outputs, concatenated


@dataclass(frozen=True)
class Source:
    """The target a drafter learns from, as it will serve: `model` loaded in `precision`. A head for
    `--dtype gguf` can learn from the quantized target's own features (on the default model the shipped
    head's teacher-forced agreement is 0.006 lower on them than on fp32's: docs/drafters.md); the store
    keeps each source's features apart. gguf-exact computes fp32's bits, so it shares fp32's.
    rows: feed each response to the model in calls of at most this many rows after its prompt, as
    decoding does: a target that computes a long prefill differently from a few rows (gguf: 8-bit
    activations up to kernels.DENSE_ROWS rows, exact float32 GEMMs beyond) then gives the features it
    gives when serving."""

    model: object
    precision: Precision = FP32
    rows: int | None = None

    def key(self, fingerprint: str) -> str:
        """The store's fingerprint for this source's features."""
        if self.precision.exact and self.rows is None:
            return fingerprint
        return f"{fingerprint}:{self.precision}" + (f":rows{self.rows}" if self.rows else "")

    def features(
        self, store: str | Path, seqs: list[Record], fingerprint: str, layer_ids: tuple[int, ...] = ()
    ) -> Features:
        return cached(store, self.model, seqs, self.key(fingerprint), layer_ids, self.rows)


def compute(model, seqs: list[Record], layer_ids: tuple[int, ...] = (), rows: int | None = None) -> Features:
    """model: a CausalLM (FastLlama or HFModel), asked for its final hidden rows and the layers `layer_ids`;
    rows: see Source (None: each sequence in one forward)."""
    from tqdm import tqdm

    model = teacher(model) if rows is None else model
    out = Features([], [], [], [])
    try:
        for s in tqdm(seqs, desc="target features", unit="seq"):
            tokens = torch.tensor(s.tokens, dtype=torch.long)
            model.reset()
            n, start = len(tokens), len(s.prompt_ids)
            spans = (
                [(0, n)]
                if rows is None
                else [(0, start), *((a, min(a + rows, n)) for a in range(start, n, rows))]
            )
            feats = torch.cat(
                [
                    model.forward(tokens[a:b], num_logits=1, layers=(-1, *layer_ids)).features
                    for a, b in spans
                    if b > a
                ]
            )  # [n, (1 + layers) H]
            width = feats.shape[1] // (1 + len(layer_ids))
            hidden, layers = (
                feats[:, :width],
                feats[:, width:],
            )  # the final hidden rows, the layers' concatenated
            out.tokens.append(tokens)
            out.start.append(len(s.prompt_ids))
            out.hidden.append(hidden.float().cpu().clone())  # clone: a normal (not inference) tensor
            out.layers.append(layers.to(torch.bfloat16).cpu().clone())
    finally:
        model.reset()
    return out


def teacher(model):
    """The forward for whole teacher-forced sequences: Hugging Face's where the model keeps its float
    weights (its oneDNN/MKL GEMMs run a long sequence about twice as fast as our row-invariant kernels;
    features are training data, not a decode step's bits), else
    the model itself (a GGUF target that released its float linears)."""
    from specdecode.backends.models import HFModel

    hf = model.hf
    if isinstance(model, HFModel) or any(p.numel() == 0 for p in hf.parameters()):
        return model
    return HFModel(hf)


CHUNK = 256  # sequences per store file: what an interrupted feature pass loses at most


def sequence_key(fingerprint: str, tokens: torch.Tensor, start: int) -> str:
    """The store's name for one sequence's features: the target's weights, the tokens, the prompt length."""
    h = hashlib.sha1(f"{fingerprint}:{start}:".encode())
    h.update(tokens.to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:20]


def cached(
    store: str | Path,
    model,
    seqs: list[Record],
    fingerprint: str,
    layer_ids: tuple[int, ...] = (),
    rows: int | None = None,
) -> Features:
    """compute(), memoized per sequence in the directory `store`, in files of CHUNK sequences: an
    interrupted pass resumes after its last finished file, and a grown or merged data set (more
    shards, a subset by --max-tokens, another order) computes only the sequences the store lacks.
    The final hidden states and each layer set live in separate files (`chunk-*.pt` and
    `chunk-*.layers-2_15_27.pt`), so a Medusa run reuses what an EAGLE run computed. Files are
    loaded memory-mapped: a store larger than RAM trains from the page cache."""
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True)
    suffix = _layers_suffix(layer_ids)
    tokens = [torch.tensor(s.tokens, dtype=torch.long) for s in seqs]
    starts = [len(s.prompt_ids) for s in seqs]
    keys = [sequence_key(fingerprint, t, n) for t, n in zip(tokens, starts)]
    have = _index(store, suffix)
    first = {}  # key -> index of its first sequence, for the keys the store lacks (in data order)
    for i, k in enumerate(keys):
        if k not in have:
            first.setdefault(k, i)
    missing = list(first.values())
    if missing:
        print(f"target features: {len(missing)} of {len(seqs)} sequences not in {store}", file=sys.stderr)
    for lo in range(0, len(missing), CHUNK):
        part = [seqs[i] for i in missing[lo : lo + CHUNK]]
        part_keys = [keys[i] for i in missing[lo : lo + CHUNK]]
        feats = compute(model, part, layer_ids, rows)
        path = _save_chunk(store, part_keys, feats.hidden, feats.layers, suffix)
        have.update(_index_file(path, suffix))  # memory-mapped, not the computed copies
    hidden = [have[k][0] for k in keys]
    layers = [have[k][1] if suffix else h.new_zeros(len(h), 0) for k, h in zip(keys, hidden)]
    for k, t, h in zip(keys, tokens, hidden):
        if len(h) not in (len(t), len(t) - 1):
            raise UserError(
                f"feature store {store}: sequence {k} holds {len(h)} rows for {len(t)} tokens "
                "(a corrupt file: delete the store and rerun)"
            )
    return Features(tokens, starts, hidden, layers)


class Writer:
    """The store of `cached()` filled while `train data` generates: each sequence's rows as the engine
    captured them (Request.capture: the final norm's output, then `layer_ids`'), [n - 1, (1 + L) H],
    saved as cached() saves a chunk when flush() is called (with the data's shard, before it)."""

    def __init__(self, store: str | Path, key: str, layer_ids: tuple[int, ...]):
        """key: the source's store fingerprint (Source.key): the one the trainers will ask for."""
        self.store, self.key, self.layer_ids = Path(store), key, tuple(layer_ids)
        self.layers = (-1, *self.layer_ids)  # what the engine is asked to capture
        self.keys: list[str] = []
        self.hidden: list[torch.Tensor] = []
        self.fused: list[torch.Tensor] = []
        self.written = 0

    def add(self, seq: Record, features: torch.Tensor) -> None:
        tokens = torch.tensor(seq.tokens, dtype=torch.long)
        if len(features) != len(tokens) - 1:
            raise RuntimeError(f"features for {len(features)} positions of a {len(tokens)}-token sequence")
        width = features.shape[1] // len(self.layers)
        self.keys.append(sequence_key(self.key, tokens, len(seq.prompt_ids)))
        self.hidden.append(features[:, :width].float().clone())
        self.fused.append(features[:, width:].to(torch.bfloat16))

    def flush(self) -> None:
        if not self.keys:
            return
        self.store.mkdir(parents=True, exist_ok=True)
        _save_chunk(self.store, self.keys, self.hidden, self.fused, _layers_suffix(self.layer_ids))
        self.written += len(self.keys)
        self.keys, self.hidden, self.fused = [], [], []


def _index(store: Path, suffix: str | None) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """key -> (hidden [n, H], layers [n, F] or None) over the store's complete files."""
    out = {}
    for path in sorted(store.glob("chunk-*.pt")):
        if ".layers-" not in path.name:
            out.update(_index_file(path, suffix))
    return out


def _index_file(path: Path, suffix: str | None) -> dict:
    layers_path = path.with_name(path.stem + suffix) if suffix else None
    if suffix and not layers_path.exists():
        return {}  # computed without this layer set: those sequences are recomputed with it
    try:
        stored = torch.load(path, mmap=True)
        layers = torch.load(layers_path, mmap=True) if suffix else [None] * len(stored["keys"])
    except Exception as e:  # noqa: BLE001 (torch raises several types for a damaged file)
        raise UserError(
            f"feature store file {path} is unreadable ({type(e).__name__}: {e}): "
            "delete it and rerun (its sequences are recomputed)"
        ) from None
    return {k: (h, ls) for k, h, ls in zip(stored["keys"], stored["hidden"], layers)}


def compact(store: str | Path) -> tuple[int, int, int]:
    """Rewrite the float32 final hidden rows of a store's chunk files in bfloat16, each file replaced
    atomically (an interrupted pass leaves every file whole; a rerun continues) -> (files rewritten,
    bytes before, bytes after)."""
    store = Path(store)
    if not store.is_dir():
        raise UserError(f"feature store {store} is not a directory")
    rewritten, before, after = 0, 0, 0
    for path in sorted(store.glob("chunk-*.pt")):
        if ".layers-" in path.name:
            continue
        try:
            stored = torch.load(path, mmap=True)
        except Exception as e:  # noqa: BLE001 (as _index_file)
            raise UserError(f"feature store file {path} is unreadable ({type(e).__name__}: {e})") from None
        if all(h.dtype == torch.bfloat16 for h in stored["hidden"]):
            continue
        size = path.stat().st_size
        stored = {"keys": stored["keys"], "hidden": [h.to(torch.bfloat16) for h in stored["hidden"]]}
        _save_atomic(stored, path)
        rewritten, before, after = rewritten + 1, before + size, after + path.stat().st_size
    return rewritten, before, after


def _layers_suffix(layer_ids: tuple[int, ...]) -> str | None:
    """The file suffix of a chunk's layer set (`.layers-2_15_27.pt`), or None without layers."""
    return ".layers-" + "_".join(map(str, layer_ids)) + ".pt" if layer_ids else None


def _save_chunk(store: Path, keys: list[str], hidden: list, layers: list, suffix: str | None) -> Path:
    """One chunk file (and its layer file) of the sequences `keys` -> the hidden file's path."""
    name = "chunk-" + hashlib.sha1("".join(keys).encode()).hexdigest()[:16]
    if suffix:  # the layers first: a chunk's hidden file is what marks it complete
        _save_atomic(layers, store / (name + suffix))
    _save_atomic({"keys": keys, "hidden": hidden}, store / (name + ".pt"))
    return store / (name + ".pt")


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)
