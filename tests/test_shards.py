"""Training-data shards: round trip, id width, corruption and wrong-target errors that overwrite
nothing, merging, second turns asked after the target's own first answer, and the large prompt sets."""

import pytest

from specdecode import corpora, shards
from specdecode.corpora import Prompt
from specdecode.errors import UserError
from specdecode.shards import Record
from specdecode.train import data

TARGET = {"name": "t", "fingerprint": "abc"}


def seqs(n: int, top: int = 1000) -> list[Record]:
    return [
        Record(
            f"s{i}",
            "c",
            [i % top, (7 * i) % top],
            [(3 * i + j) % top for j in range(i % 5 + 1)],
            "target" if i % 2 else "given",
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("top,dtype", [(49152, "uint16"), (2**16, "uint16"), (262144, "uint32")])
def test_round_trip_and_id_width(tmp_path, top, dtype):
    original = seqs(40, top) + [Record("max", "c", [top - 1], [top - 1, 0])]
    shards.write(tmp_path / "shard-00000.sds", original, TARGET)
    assert shards.read(tmp_path / "shard-00000.sds", TARGET) == original
    assert f'"dtype": "{dtype}"' in (tmp_path / "shard-00000.sds").read_bytes()[:200].decode("latin-1")


def test_uint16_shards_are_compact(tmp_path):
    many = [Record(str(i), "c", list(range(100)), list(range(i, i + 300))) for i in range(100)]
    shards.write(tmp_path / "s.sds", many, TARGET)
    assert (tmp_path / "s.sds").stat().st_size < 2 * 400 * 100 / 2  # under half of raw uint16


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda b: b[:-7], "truncated or corrupt"),
        (lambda b: b[:-3] + bytes([b[-3] ^ 1]) + b[-2:], "CRC"),
        (lambda b: b"NOTASHARD" + b[9:], "not a specdecode shard"),
        (lambda b: b[:20], "truncated or corrupt"),
    ],
)
def test_damaged_shards_are_clear_errors(tmp_path, damage, message):
    path = tmp_path / "shard-00000.sds"
    shards.write(path, seqs(10), TARGET)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(UserError, match=message) as e:
        shards.read(path)
    assert str(path) in str(e.value)


def test_another_targets_shard_is_refused_and_nothing_is_overwritten(tmp_path):
    path = tmp_path / "shard-00000.sds"
    shards.write(path, seqs(3), TARGET)
    before = path.read_bytes()
    with pytest.raises(UserError, match="not of 'other'"):
        shards.read(path, {"name": "other", "fingerprint": "zzz"})
    with pytest.raises(UserError, match="not overwriting"):
        shards.write(path, seqs(5), TARGET)
    assert path.read_bytes() == before and not list(tmp_path.glob("*.tmp"))


def test_merge_deduplicates_by_id_and_refuses_mixed_targets(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a, b, c):
        d.mkdir()
    shards.write(a / "shard-00000.sds", seqs(6), TARGET)
    shards.write(b / "shard-00000.sds", seqs(10)[4:], TARGET)  # s4, s5 again
    merged = data.merge([a, b], tmp_path / "out", shard_size=4)
    assert [s.id for s in merged] == [f"s{i}" for i in range(10)]
    assert len(shards.paths(tmp_path / "out")) == 3
    shards.write(c / "shard-00000.sds", seqs(2), {"name": "x", "fingerprint": "y"})
    with pytest.raises(UserError, match="different targets"):
        data.merge([a, c], tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_second_turns_follow_the_targets_own_first_answer(target, tmp_path):
    first = Prompt("Name a colour.", "q1", "c")
    second = Prompt("Now another one.", "q1-turn2", "c", parent="q1")
    orphan = Prompt("And a third?", "q9-turn2", "c", parent="q9")  # its first turn is held out
    out = data.generate_data(
        target,
        [(second, None), (orphan, None), (first, None)],
        tmp_path / "d",
        drafter="ngram",
        max_new_tokens=6,
    )
    by_id = {s.id: s for s in out}
    assert sorted(by_id) == ["q1", "q1-turn2"]
    answer = target.tokenizer.decode(by_id["q1"].response_ids, skip_special_tokens=True)
    expected = target.tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "Now another one."},
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert by_id["q1-turn2"].prompt_ids == target.tokenizer(expected, add_special_tokens=False)["input_ids"]


def test_long_prompts_are_skipped(target, tmp_path):
    prompts = [(Prompt("short", "a", "c"), None), (Prompt("long " * 200, "b", "c"), None)]
    out = data.generate_data(
        target, prompts, tmp_path / "d", drafter="ngram", max_new_tokens=4, max_prompt_tokens=50
    )
    assert [s.id for s in out] == ["a"]


def test_training_prompt_sets_cover_many_sources():
    mt2 = corpora.load_prompts("mtbench2")
    assert len(mt2) == 80 and all(p.parent and p.id == p.parent + "-turn2" for p in mt2)
    bfcl = corpora.load_prompts("bfclall:5")
    assert len({p.category for p in bfcl}) >= 15 and len({p.id for p in bfcl}) == len(bfcl)
    heldout_bfcl = {p.id for p in corpora.load_prompts("bfcl:2")}
    assert heldout_bfcl <= {p.id for p in corpora.load_prompts("bfclall")}  # same ids: --exclude works
    reasoning = corpora.load_prompts("reasoning:2")
    generators = {p.id.rsplit("-", 1)[0] for p in reasoning}
    assert len(generators) >= 80 and len({p.id for p in reasoning}) == len(reasoning)
    assert reasoning[0].id.endswith("-0") and reasoning[len(generators)].id.endswith("-1")  # interleaved


def test_merge_with_a_token_budget_keeps_the_first_sequences_that_fit(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shards.write(src / "shard-00000.sds", seqs(10), TARGET)
    sizes = [len(s.response_ids) for s in seqs(10)]
    budget = sum(sizes[:4]) + sizes[4] - 1  # room for four, one token short of the fifth
    merged = data.merge([src], tmp_path / "out", max_tokens=budget)
    assert [s.id for s in merged] == [f"s{i}" for i in range(4)]
    with pytest.raises(UserError, match="at least 1"):
        data.merge([src], tmp_path / "out3", max_tokens=0)


def test_parallel_workers_sharing_a_directory_answer_every_prompt_once_as_one_run_does(target, tmp_path):
    prompts = [(Prompt(f"Count to {i}.", f"q{i}", "c"), None) for i in range(6)]
    prompts += [(Prompt("And backwards?", f"q{i}-turn2", "c", parent=f"q{i}"), None) for i in range(6)]
    shares = [data.part(prompts, f"{i}/2") for i in range(2)]
    assert sorted(p.id for share, _ in shares for p, _ in share) == sorted(p.id for p, _ in prompts)
    for share, _ in shares:  # a second turn goes to the worker that answers its first turn
        ids = {p.id for p, _ in share}
        assert all(p.parent in ids for p, _ in share if p.parent) and 0 < len(ids) < len(prompts)
    for share, tag in shares:
        data.generate_data(target, share, tmp_path / "shared", drafter="ngram", max_new_tokens=4, tag=tag)
    alone = data.generate_data(target, prompts, tmp_path / "alone", drafter="ngram", max_new_tokens=4)
    together = data.read(tmp_path / "shared")
    assert sorted(together, key=lambda s: s.id) == sorted(alone, key=lambda s: s.id)
    assert sorted(p.name for p in shards.paths(tmp_path / "shared")) == [
        "shard-00000-p0of2.sds",
        "shard-00001-p1of2.sds",
    ]


@pytest.mark.parametrize("spec", ["2/2", "1", "a/2", "-1/2", "0/0"])
def test_a_bad_part_is_a_clear_error(spec):
    with pytest.raises(UserError, match="--part expects I/N"):
        data.part([(Prompt("x", "x", "c"), None)], spec)
