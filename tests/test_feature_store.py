"""The per-sequence target-feature store (features.cached): an interrupted pass resumes, a subset or
reordered data set computes nothing, a new layer set is added beside the final hidden states, and a
damaged file is a clear error."""

import pytest
import torch

from specdecode.errors import UserError
from specdecode.train import data, features
from train_fixtures import make_data

LAYERS = (0, 1)


@pytest.fixture(scope="module")
def seqs(target, tmp_path_factory):
    return data.read(make_data(target, tmp_path_factory.mktemp("store_data") / "data", max_new_tokens=12))


@pytest.fixture
def counted(monkeypatch):
    """Small store files (3 sequences) and a count of the sequences each compute() call was given."""
    monkeypatch.setattr(features, "CHUNK", 3)
    calls = []
    real = features.compute

    def compute(model, part, layer_ids=(), rows=None):
        calls.append(len(part))
        return real(model, part, layer_ids, rows)

    monkeypatch.setattr(features, "compute", compute)
    return calls


def _same(a: features.Features, b: features.Features) -> None:
    assert a.start == b.start
    for x, y in zip(a.tokens + a.hidden + a.layers, b.tokens + b.hidden + b.layers, strict=True):
        assert torch.equal(x, y)


def test_an_interrupted_pass_resumes_and_equals_a_fresh_one(target, seqs, tmp_path, counted):
    fresh = features.compute(target.model, seqs, LAYERS)
    counted.clear()

    class Killed(Exception):
        pass

    real = features._save_atomic
    saved = []

    def save_then_die(obj, path):  # killed after the first file of the second chunk
        if len(saved) == 3:
            raise Killed
        saved.append(path)
        real(obj, path)

    features._save_atomic = save_then_die
    try:
        with pytest.raises(Killed):
            features.cached(tmp_path, target.model, seqs, "fp", LAYERS)
    finally:
        features._save_atomic = real
    assert counted == [3, 3]
    assert not list(tmp_path.glob("*.tmp"))
    counted.clear()
    resumed = features.cached(tmp_path, target.model, seqs, "fp", LAYERS)
    assert counted == [3, 2]  # the unfinished chunk again and the rest: 8 = 3 + 3 + 2
    _same(resumed, fresh)


def test_a_subset_in_another_order_computes_nothing(target, seqs, tmp_path, counted):
    whole = features.cached(tmp_path, target.model, seqs, "fp", LAYERS)
    counted.clear()
    order = [5, 0, 7, 2]
    part = features.cached(tmp_path, target.model, [seqs[i] for i in order], "fp", LAYERS)
    assert counted == []
    for j, i in enumerate(order):
        assert torch.equal(part.hidden[j], whole.hidden[i]) and torch.equal(part.layers[j], whole.layers[i])
    features.cached(tmp_path, target.model, seqs, "other weights", LAYERS)
    assert counted == [3, 3, 2]  # another target fingerprint shares nothing


def test_a_new_layer_set_is_added_and_the_hidden_states_are_shared(target, seqs, tmp_path, counted):
    hidden_only = features.cached(tmp_path, target.model, seqs, "fp")  # a Medusa run first
    assert counted == [3, 3, 2] and all(x.shape[1] == 0 for x in hidden_only.layers)
    counted.clear()
    with_layers = features.cached(tmp_path, target.model, seqs, "fp", LAYERS)  # then an EAGLE run
    assert counted == [3, 3, 2]
    assert all(x.shape[1] == 2 * y.shape[1] for x, y in zip(with_layers.layers, with_layers.hidden))
    counted.clear()
    again = features.cached(tmp_path, target.model, seqs, "fp")  # Medusa again: reuses EAGLE's files
    assert counted == []
    _same(again, hidden_only)


def test_a_damaged_store_file_is_a_user_error_naming_it(target, seqs, tmp_path):
    features.cached(tmp_path, target.model, seqs[:2], "fp")
    (path,) = tmp_path.glob("chunk-*.pt")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(UserError, match=path.name):
        features.cached(tmp_path, target.model, seqs, "fp")


def test_features_captured_while_generating_fill_the_store_the_trainers_read(target, tmp_path, counted):
    """`train data --capture`: the engine's own rows of every position but the last, stored under the
    trainers' key, so their pass computes nothing; the rows are the teacher-forced forward's."""
    from specdecode.corpora import Prompt
    from train_fixtures import PROMPTS

    prompts = [(Prompt(text, str(i), "c"), None) for i, text in enumerate(PROMPTS[:4])]
    writer = features.Writer(tmp_path / "store", "fp", LAYERS)
    seqs = data.generate_data(
        target, prompts, tmp_path / "d", drafter="ngram", max_new_tokens=12, shard_size=3, features=writer
    )
    assert writer.written == 4 and len(list((tmp_path / "store").glob("chunk-*.layers-0_1.pt"))) == 2
    stored = features.cached(tmp_path / "store", target.model, seqs, "fp", LAYERS)
    assert counted == []  # nothing recomputed
    fresh = features.compute(target.model, seqs, LAYERS)
    for s, h, ls, fh, fl in zip(seqs, stored.hidden, stored.layers, fresh.hidden, fresh.layers, strict=True):
        assert len(h) == len(ls) == len(s.tokens) - 1
        torch.testing.assert_close(h, fh[:-1], rtol=1e-4, atol=1e-4)  # the engine's kernels, not HF's
        torch.testing.assert_close(ls.float(), fl[:-1].float(), rtol=2**-7, atol=1e-3)  # bfloat16 both


def test_compact_rewrites_a_stores_float32_rows_in_bfloat16(target, seqs, tmp_path, counted):
    """compact() halves a store's float32 hidden rows in place, the trainers read the same sequences
    without computing anything, and a second pass has nothing to do."""
    fresh = features.cached(tmp_path, target.model, seqs, "fp", LAYERS)
    paths = [p for p in tmp_path.glob("chunk-*.pt") if ".layers-" not in p.name]
    before = sum(p.stat().st_size for p in paths)
    counted.clear()
    files, size_before, size_after = features.compact(tmp_path)
    assert files == len(paths) == 3 and size_before == before and size_after < 0.6 * before
    assert not list(tmp_path.glob("*.tmp"))
    stored = features.cached(tmp_path, target.model, seqs, "fp", LAYERS)
    assert counted == []  # every sequence still found under its key
    for h, x, ls, fl in zip(stored.hidden, fresh.hidden, stored.layers, fresh.layers, strict=True):
        assert x.dtype == torch.float32 and h.dtype == torch.bfloat16 and torch.equal(h, x.to(torch.bfloat16))
        assert torch.equal(ls, fl)
    assert features.compact(tmp_path) == (0, 0, 0)
    with pytest.raises(UserError, match="not a directory"):
        features.compact(tmp_path / "missing")
    (tmp_path / "chunk-damaged.pt").write_bytes(b"not a torch file")
    with pytest.raises(UserError, match="chunk-damaged.pt is unreadable"):
        features.compact(tmp_path)
