"""Training: self-distillation data, the shared loop (loss goes down, resume after a kill gives the
same state, atomic checkpoints, loss curve), token maps, and the `train` CLI."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdecode.backends.precision import FP32
from specdecode.cli import main
from specdecode.errors import UserError
from specdecode.train import data, draft, eagle, medusa
from specdecode.train.cli import SCHEDULE
from specdecode.train.loop import Schedule
from train_fixtures import PROMPTS, make_data


@pytest.fixture(scope="module")
def data_dir(target, tmp_path_factory):
    return make_data(target, tmp_path_factory.mktemp("train_data") / "data")


def test_data_holds_the_targets_greedy_responses(target, data_dir):
    from specdecode import drafters
    from specdecode.decoding.generation import generate

    seqs = data.read(data_dir)
    assert len(seqs) == 8 and all(s.source == "target" and s.response_ids for s in seqs)
    plain = generate(
        target, drafters.build("none", drafters.DrafterContext(target)), seqs[0].prompt_ids, max_new_tokens=40
    )
    assert plain.token_ids == seqs[0].response_ids  # the n-gram drafter changed nothing


def test_data_is_decoded_by_the_engine_in_batches_and_equals_the_greedy_oracle(target, tmp_path, monkeypatch):
    """`train data` runs the engine (its default batch: every prompt here at once), never the
    single-sequence loop; at fp32 each greedy response is the oracle's (plain decoding, one
    sequence at a time), token for token."""
    from specdecode import drafters
    from specdecode.corpora import Prompt
    from specdecode.decoding import batch_decoder, decoder, generation
    from specdecode.decoding.generation import generate

    def refuse(*args, **kwargs):
        raise AssertionError("train data ran the single-sequence loop, not the engine")

    widths, step = [], batch_decoder.BatchDecoder.step

    def counted(self, seqs, limit=None):
        widths.append(len(seqs))
        return step(self, seqs, limit)

    monkeypatch.setattr(decoder, "decode", refuse)
    monkeypatch.setattr(generation, "decode", refuse)
    monkeypatch.setattr(batch_decoder.BatchDecoder, "step", counted)
    prompts = [(Prompt(text, str(i), "c"), None) for i, text in enumerate(PROMPTS)]
    seqs = data.generate_data(target, prompts, tmp_path / "d", drafter="ngram", max_new_tokens=40)
    monkeypatch.undo()
    assert max(widths) == len(PROMPTS)  # the default batch (16) holds all eight
    oracle = drafters.build("none", drafters.DrafterContext(target))
    assert sorted(s.id for s in seqs) == sorted(p.id for p, _ in prompts)
    for s in seqs:
        assert s.response_ids == generate(target, oracle, s.prompt_ids, k=1, max_new_tokens=40).token_ids


def test_data_generation_resumes_by_skipping_finished_prompts(target, data_dir, tmp_path):
    from specdecode import shards

    copy = tmp_path / "d"
    make_data(target, copy, shard_size=1)  # one shard per sequence
    for path in shards.paths(copy)[3:]:
        path.unlink()  # killed after three prompts
    make_data(target, copy)
    assert [s.id for s in data.read(copy)] == [s.id for s in data.read(data_dir)]
    assert [s.response_ids for s in data.read(copy)] == [s.response_ids for s in data.read(data_dir)]


def killed_after(n: int, responses):
    """data._responses stopped after n sequences, as SIGTERM stops it (data._stop)."""

    def killed(*args):
        for i, seq in enumerate(responses(*args)):
            if i == n:
                raise KeyboardInterrupt
            yield seq

    return killed


def test_an_interrupted_run_keeps_what_it_finished_and_resumes_to_the_same_data(
    target, data_dir, tmp_path, monkeypatch
):
    real = data._responses

    monkeypatch.setattr(data, "_responses", killed_after(3, real))
    with pytest.raises(KeyboardInterrupt):
        make_data(target, tmp_path / "d")  # shard size 256: only the final flush writes the three
    assert len(data.read(tmp_path / "d")) == 3
    monkeypatch.setattr(data, "_responses", real)
    make_data(target, tmp_path / "d")
    resumed = {s.id: (s.prompt_ids, s.response_ids) for s in data.read(tmp_path / "d")}
    assert resumed == {s.id: (s.prompt_ids, s.response_ids) for s in data.read(data_dir)}


def test_a_run_stops_before_the_disk_fills_and_keeps_what_it_finished(
    target, data_dir, tmp_path, monkeypatch
):
    """--min-free-gb: a disk already short refuses the run before any work; one that runs short stops
    it after the shard that crossed the line, which a rerun (with room again) continues."""
    import shutil
    from collections import namedtuple

    from specdecode.corpora import Prompt

    usage, gb, real = namedtuple("usage", "total used free"), 2**30, shutil.disk_usage
    free = [0.5 * gb]
    monkeypatch.setattr(data.shutil, "disk_usage", lambda path: usage(100 * gb, 0, free[0]))
    prompts = [(Prompt(text, str(i), "c"), None) for i, text in enumerate(PROMPTS)]
    run = dict(drafter="ngram", max_new_tokens=40, shard_size=2, min_free_gb=1.0)
    with pytest.raises(UserError, match=r"0\.5 GB free, under --min-free-gb 1"):
        data.generate_data(target, prompts, tmp_path / "d", **run)
    assert not list((tmp_path / "d").glob("shard-*"))
    free[0] = 1.5 * gb

    def shrinking(path):  # every shard written takes 0.3 GB
        return usage(100 * gb, 0, 1.5 * gb - 0.3 * gb * len(list(Path(path).glob("*shard*"))))

    monkeypatch.setattr(data.shutil, "disk_usage", shrinking)
    with pytest.raises(UserError, match="every finished sequence is written"):
        data.generate_data(target, prompts, tmp_path / "d", **run)
    assert len(data.read(tmp_path / "d")) == 4  # two shards of two, then 0.9 GB free
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())
    monkeypatch.setattr(data.shutil, "disk_usage", real)
    seqs = data.generate_data(target, prompts, tmp_path / "d", **run)
    resumed = {s.id: (s.prompt_ids, s.response_ids) for s in seqs}
    assert resumed == {s.id: (s.prompt_ids, s.response_ids) for s in data.read(data_dir)}
    with pytest.raises(UserError, match="min-free-gb must be at least 0"):
        data.generate_data(target, prompts, tmp_path / "e", **{**run, "min_free_gb": -1})


def test_a_sampled_pass_adds_a_second_answer_per_prompt_beside_the_greedy_ones(
    target, data_dir, tmp_path, monkeypatch
):
    import shutil

    from specdecode.core.sampling import Warp
    from specdecode.corpora import Prompt
    from train_fixtures import PROMPTS

    out = tmp_path / "d"
    shutil.copytree(data_dir, out)
    greedy = {s.id: s.response_ids for s in data.read(out)}
    prompts = [(Prompt(text, str(i), "c"), None) for i, text in enumerate(PROMPTS)]
    real = data._responses

    sample = dict(drafter="none", params=Warp(temperature=0.9), seed=1, max_new_tokens=40)
    monkeypatch.setattr(data, "_responses", killed_after(3, real))
    with pytest.raises(KeyboardInterrupt):
        data.generate_data(target, prompts, out, **sample)
    counts = json.loads((out / "manifest.json").read_text())["by_answer"]  # written though stopped
    assert (counts["greedy"]["sequences"], counts["t0.9s1"]["sequences"]) == (len(PROMPTS), 3)
    monkeypatch.setattr(data, "_responses", real)
    seqs = data.generate_data(target, prompts, out, **sample)  # resumes the sampled pass only
    by_id = {s.id: s for s in seqs}
    assert len(seqs) == 2 * len(PROMPTS) and {i: by_id[i].response_ids for i in greedy} == greedy
    sampled = [s for s in seqs if s.id.endswith("@t0.9s1")]
    assert sorted(data.prompt_id(s.id) for s in sampled) == sorted(greedy)
    assert any(s.response_ids != greedy[data.prompt_id(s.id)] for s in sampled)
    train, val = data.split(seqs, 0.5)
    assert train and val
    sides: dict[str, set[bool]] = {}
    for i in train + val:
        sides.setdefault(data.prompt_id(seqs[i].id), set()).add(i in val)
    assert all(len(side) == 1 for side in sides.values())  # a prompt's two answers on one side


def test_batched_generation_gives_the_same_responses(target, data_dir, tmp_path):
    batched = make_data(target, tmp_path / "b", batch=3)  # 8 prompts through 3 slots: rows join and leave
    by_id = {s.id: s for s in data.read(batched)}
    assert sorted(by_id) == sorted(s.id for s in data.read(data_dir))
    for s in data.read(data_dir):
        assert (by_id[s.id].prompt_ids, by_id[s.id].response_ids) == (s.prompt_ids, s.response_ids)


def test_user_jsonl_responses_are_used_as_given(target, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"prompt": "Say hi", "response": "hi there"})
        + "\n"
        + json.dumps({"prompt": "Count", "id": "c"})
        + "\n"
    )
    prompts = data.collect_prompts(str(f), exclude="")
    assert [r for _, r in prompts] == ["hi there", None]
    seqs = data.generate_data(target, prompts, tmp_path / "d", drafter="none", max_new_tokens=5)
    given = seqs[0]
    assert given.source == "given"
    assert given.response_ids[:-1] == target.tokenizer("hi there", add_special_tokens=False)["input_ids"]
    assert seqs[1].source == "target" and len(seqs[1].response_ids) <= 5


def test_collect_prompts_excludes_and_interleaves(tmp_path):
    f = tmp_path / "p.jsonl"
    rows = [{"prompt": f"q{i}", "id": str(i), "category": "ab"[i % 2]} for i in range(6)]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    ex = tmp_path / "x.jsonl"
    ex.write_text(json.dumps({"prompt": "q0", "id": "0"}))
    got = data.collect_prompts(str(f), exclude=str(ex))
    assert [p.prompt for p, _ in got] == ["q1", "q2", "q3", "q4", "q5"]
    with pytest.raises(UserError, match="no prompts left"):
        data.collect_prompts(str(ex), exclude=str(ex))


def test_a_prompt_that_repeats_a_held_out_one_is_dropped_by_its_text(tmp_path):
    """Self-instruct prompts have ids of their own: the held-out check compares text too (case and
    runs of white space aside)."""
    f = tmp_path / "self.jsonl"
    rows = [
        {"prompt": "Write a  POEM\nabout rain", "id": "self-0"},
        {"prompt": "Write a poem", "id": "self-1"},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows))
    ex = tmp_path / "heldout.jsonl"
    ex.write_text(json.dumps({"prompt": "write a poem about rain", "id": "h-7"}))
    assert [p.id for p, _ in data.collect_prompts(str(f), exclude=str(ex))] == ["self-1"]


def test_the_manifest_counts_sequences_and_tokens_per_prompt_set_and_category(target, tmp_path):
    """`manifest.json` after a run: totals, per prompt set (a set no longer named: "other") and per
    category, beside the run's settings."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(
        "\n".join(json.dumps({"prompt": f"Tell me {w}", "id": f"a{w}", "category": "x"}) for w in "pq")
    )
    b.write_text(json.dumps({"prompt": "Count to three", "id": "b0", "category": "y"}))
    out = tmp_path / "d"
    sources = {}
    seqs = data.generate_data(
        target, data.collect_prompts(f"{a},{b}", sources=sources), out, drafter="none", max_new_tokens=4,
        meta={"exclude": "mtbench:1"}, sources=sources,
    )  # fmt: skip
    got = json.loads((out / "manifest.json").read_text())
    assert got["exclude"] == "mtbench:1" and got["all"]["sequences"] == 3
    assert got["all"]["response_tokens"] == sum(len(s.response_ids) for s in seqs)
    assert {k: v["sequences"] for k, v in got["by_source"].items()} == {str(a): 2, str(b): 1}
    assert {k: v["sequences"] for k, v in got["by_category"].items()} == {"x": 2, "y": 1}
    ids = {s.id: s for s in seqs}
    assert got["by_source"][str(b)]["prompt_tokens"] == len(ids["b0"].prompt_ids)
    sources = {}
    data.generate_data(target, data.collect_prompts(str(b), sources=sources), out, drafter="none",
                       max_new_tokens=4, sources=sources)  # fmt: skip
    again = json.loads((out / "manifest.json").read_text())
    assert {k: v["sequences"] for k, v in again["by_source"].items()} == {"other": 2, str(b): 1}


def test_token_map_keeps_the_most_frequent_response_tokens():
    seqs = [data.Record("a", "c", [9, 9, 9], [5, 5, 7, 3]), data.Record("b", "c", [9], [5, 7])]
    assert data.token_map(seqs, 12, 3).tolist() == [3, 5, 7]
    assert data.token_map(seqs, 12, 5).tolist() == [0, 3, 5, 7, 9]  # then prompt tokens, then low ids


def _trainer(train, lr: float, **own):
    """train(target, data, out, **kw) with kw a mix of Schedule fields and the trainer's own settings."""

    def call(target, data_dir, out, **kw):
        plan = Schedule(**{"lr": lr, **{k: v for k, v in kw.items() if k in SCHEDULE}})
        return train(target, data_dir, out, plan, **own, **{k: v for k, v in kw.items() if k not in SCHEDULE})

    return call


TRAINERS = {
    "medusa": _trainer(medusa.train, 1e-2, batch_tokens=64, vocab=300),
    "eagle": _trainer(eagle.train, 3e-3, batch_tokens=128, vocab=300, window=64, layers="0,1"),
    "draft": _trainer(draft.train, 3e-3, batch_tokens=128, vocab=300, window=64),
}


def test_the_command_line_names_every_field_of_the_schedule():
    assert SCHEDULE == {f.name for f in dataclasses.fields(Schedule)}  # the CLI's copy, kept without torch


@pytest.mark.parametrize("kind", TRAINERS)
def test_a_few_steps_lower_the_loss_and_write_a_checkpoint(target, data_dir, tmp_path, kind):
    result = TRAINERS[kind](target, data_dir, tmp_path / kind, steps=20, save_every=10)
    assert len(result.losses) == 20
    assert sum(result.losses[-5:]) / 5 < 0.8 * sum(result.losses[:3]) / 3
    config = json.loads((tmp_path / kind / "config.json").read_text())
    assert config["kind"] == kind and config["target"]["name"] == target.name
    seqs = data.read(data_dir)  # what the scaling curve counts: the training set's response tokens
    assert config["train"]["response_tokens"] == sum(len(s.response_ids) for s in seqs) > 0
    weights = load_file(tmp_path / kind / "model.safetensors")
    assert all(v.dtype == torch.bfloat16 for k, v in weights.items() if k != "token_map")
    assert (tmp_path / kind / "loss.png").stat().st_size > 1000
    assert not list((tmp_path / kind).glob(".*"))  # no temp files left behind


def test_the_hass_top_k_term_is_the_cross_entropy_over_the_teachers_top_k_tokens():
    from specdecode.train import loop

    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(5, 16, generator=g), torch.randn(5, 16, generator=g)
    mask = torch.tensor([True, True, False, True, True])
    p, logq = teacher.softmax(-1), student.log_softmax(-1)
    kl, _ = loop.kl_loss(student, teacher, mask)
    full, _ = loop.kl_loss(student, teacher, mask, topk=16)  # K = V: + H(p, q) = KL + H(p)
    entropy = -(p * p.log()).sum(-1)[mask].mean()
    assert torch.allclose(full, 2 * kl + entropy)
    one, _ = loop.kl_loss(student, teacher, mask, topk=1, topk_weight=0.5)  # + 0.5 * -p_max log q(argmax p)
    top = teacher.argmax(-1, keepdim=True)
    assert torch.allclose(one, kl - 0.5 * (p.gather(-1, top) * logq.gather(-1, top))[mask].mean())


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_training_with_the_top_k_term_lowers_the_loss_and_records_it(target, data_dir, tmp_path, kind):
    result = TRAINERS[kind](
        target, data_dir, tmp_path / kind, steps=20, save_every=10, topk=10, topk_weight=0.5
    )
    assert sum(result.losses[-5:]) / 5 < 0.8 * sum(result.losses[:3]) / 3
    config = json.loads((tmp_path / kind / "config.json").read_text())
    assert config["train"]["topk"] == 10 and config["train"]["topk_weight"] == 0.5


@pytest.mark.parametrize("kind", TRAINERS)
def test_bf16_autocast_training_lowers_the_loss_and_resumes_to_the_same_state(
    target, data_dir, tmp_path, kind
):
    whole = TRAINERS[kind](target, data_dir, tmp_path / "whole", steps=20, save_every=5, amp="bf16")
    assert sum(whole.losses[-5:]) / 5 < 0.8 * sum(whole.losses[:3]) / 3
    fp32 = TRAINERS[kind](target, data_dir, tmp_path / "fp32", steps=2, save_every=5)
    assert whole.losses[0] != fp32.losses[0]  # the forward did run in bf16
    assert json.loads((tmp_path / "whole" / "config.json").read_text())["train"]["amp"] == "bf16"
    TRAINERS[kind](target, data_dir, tmp_path / "split", steps=20, save_every=5, amp="bf16", stop_after=10)
    resumed = TRAINERS[kind](
        target, data_dir, tmp_path / "split", steps=20, save_every=5, amp="bf16", resume=True
    )
    assert resumed.losses == whole.losses
    with pytest.raises(UserError, match="amp: expected fp32 or bf16"):
        TRAINERS[kind](target, data_dir, tmp_path / "bad", steps=2, amp="fp16")


def test_eagle_trains_further_from_a_checkpoint(target, data_dir, tmp_path):
    first = TRAINERS["eagle"](target, data_dir, tmp_path / "a", steps=20, save_every=20)
    kw = dict(batch_tokens=128, vocab=300, window=64, init=str(tmp_path / "a"))
    one = Schedule(steps=1, lr=0.0, save_every=1)
    same = eagle.train(
        target, data_dir, tmp_path / "b", one, **kw
    )  # no update: it exports what it started from
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert same.losses[0] < 0.8 * first.losses[0]  # it starts where the first run ended, not from scratch
    assert json.loads((tmp_path / "b" / "config.json").read_text())["train"]["init"] == str(tmp_path / "a")
    with pytest.raises(UserError, match="fuses layers"):
        eagle.train(target, data_dir, tmp_path / "c", one, layers="1", **kw)


def test_a_narrower_eagle_head_starts_from_the_first_units_of_the_targets_last_mlp(
    target, data_dir, tmp_path
):
    from specdecode.drafters import DrafterContext, build

    kw = dict(batch_tokens=128, vocab=300, window=64, layers="0,1")
    eagle.train(target, data_dir, tmp_path / "n", Schedule(steps=1, lr=0.0, save_every=1), width=0.5, **kw)
    config = json.loads((tmp_path / "n" / "config.json").read_text())
    full = target.model.hf.config.intermediate_size
    assert config["intermediate"] == eagle.mlp_width(full, 0.5) < full
    tensors = load_file(tmp_path / "n" / "model.safetensors")
    mlp = target.model.hf.model.layers[-1].mlp
    units = config["intermediate"]
    gate_up = torch.cat([mlp.gate_proj.weight[:units], mlp.up_proj.weight[:units]])
    assert torch.equal(tensors["gate_up.weight"], gate_up.to(torch.bfloat16))  # lr 0: the start, exported
    assert torch.equal(tensors["down.weight"], mlp.down_proj.weight[:, :units].to(torch.bfloat16))
    build(f"eagle:{tmp_path / 'n'}", DrafterContext(target))  # its checkpoint loads at that width
    with pytest.raises(UserError, match="fraction of the target's"):
        eagle.train(target, data_dir, tmp_path / "m", Schedule(steps=1), width=1.5, **kw)


def test_a_wider_eagle_head_from_a_checkpoint_computes_what_the_checkpoint_did(target, data_dir, tmp_path):
    from specdecode.drafters.eagle_head import head_from_config, rope_tables

    kw = dict(batch_tokens=128, vocab=300, window=64, layers="0,1")
    eagle.train(target, data_dir, tmp_path / "n", Schedule(steps=5, save_every=5), width=0.5, **kw)
    zero = Schedule(steps=1, lr=0.0, save_every=1)
    eagle.train(target, data_dir, tmp_path / "w", zero, width=1.0, init=str(tmp_path / "n"), **kw)
    eagle.train(target, data_dir, tmp_path / "k", zero, init=str(tmp_path / "n"), **kw)  # no width: kept
    configs = {d: json.loads((tmp_path / d / "config.json").read_text()) for d in "nwk"}
    full = target.model.hf.config.intermediate_size
    assert configs["w"]["intermediate"] == full > configs["n"]["intermediate"] == configs["k"]["intermediate"]
    heads = {}
    for d in "nw":
        tensors = load_file(tmp_path / d / "model.safetensors")
        heads[d] = head_from_config(configs[d])
        heads[d].load_state_dict({k: v.float() for k, v in tensors.items() if k != "token_map"})
    units = configs["n"]["intermediate"]
    mlp = target.model.hf.model.layers[-1].mlp
    wide = heads["w"].gate_up.weight
    assert torch.equal(wide[units:full], mlp.gate_proj.weight[units:].to(torch.bfloat16).float())  # new units
    assert torch.equal(wide[full + units :], mlp.up_proj.weight[units:].to(torch.bfloat16).float())
    assert not heads["w"].down.weight[:, units:].any()  # their outputs start at zero
    torch.manual_seed(0)
    h, t = configs["n"]["hidden"], 6
    emb, fused = torch.randn(1, t, h), torch.randn(1, t, h * len(configs["n"]["layers"]))
    cos, sin = rope_tables(target.model.hf, t)
    with torch.no_grad():
        narrow, wider = (heads[d].unroll(emb, fused, cos, sin, 2) for d in "nw")
    assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(narrow, wider, strict=True))
    with pytest.raises(UserError, match="keeps at least its checkpoint's MLP width"):
        eagle.train(target, data_dir, tmp_path / "m", zero, width=0.5, init=str(tmp_path / "w"), **kw)


@pytest.mark.parametrize("kind", TRAINERS)
def test_resume_after_a_kill_reaches_the_same_state(target, data_dir, tmp_path, kind):
    whole = TRAINERS[kind](target, data_dir, tmp_path / "whole", steps=12, save_every=4, seed=3)
    TRAINERS[kind](
        target, data_dir, tmp_path / "split", steps=12, save_every=4, seed=3, stop_after=6
    )  # killed at 6
    resumed = TRAINERS[kind](
        target, data_dir, tmp_path / "split", steps=12, save_every=4, seed=3, resume=True
    )
    assert resumed.losses == whole.losses
    a = torch.load(tmp_path / "whole" / "train_state.pt", weights_only=False)["module"]
    b = torch.load(tmp_path / "split" / "train_state.pt", weights_only=False)["module"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("kind", TRAINERS)
def test_held_out_scores_keep_the_best_drafter_and_survive_a_resume(target, data_dir, tmp_path, kind):
    whole = TRAINERS[kind](
        target, data_dir, tmp_path / "whole", steps=12, save_every=4, val=0.3, eval_every=4
    )
    saved = json.loads((tmp_path / "whole" / "losses.json").read_text())["val"]
    assert [h["step"] for h in saved] == [4, 8, 12] and all(0 <= h["score"] <= 1 for h in saved)
    first = "top1" if kind == "draft" else "top1_0"  # the score is position 1's agreement
    assert all(h["score"] == h[first] for h in saved)
    config = json.loads((tmp_path / "whole" / "config.json").read_text())["train"]
    train_ids, val_ids = data.split(data.read(data_dir), 0.3)
    assert (config["sequences"], config["val_sequences"]) == (len(train_ids), len(val_ids)) and val_ids
    best = max(saved, key=lambda h: h["score"])  # written when it was scored: the first best one
    assert json.loads((tmp_path / "whole" / "best" / "config.json").read_text())["kind"] == kind
    if best["step"] == 12:
        assert (
            load_file(tmp_path / "whole" / "best" / "model.safetensors").keys()
            == load_file(tmp_path / "whole" / "model.safetensors").keys()
        )
    TRAINERS[kind](
        target, data_dir, tmp_path / "split", steps=12, save_every=4, val=0.3, eval_every=4, stop_after=6
    )
    resumed = TRAINERS[kind](
        target, data_dir, tmp_path / "split", steps=12, save_every=4, val=0.3, eval_every=4, resume=True
    )
    assert resumed.losses == whole.losses
    assert json.loads((tmp_path / "split" / "losses.json").read_text())["val"] == saved


def test_patience_ends_a_run_whose_held_out_score_stops_improving(target, data_dir, tmp_path):
    # lr 0: the score never improves on the first one, so two more evaluations end the run
    result = medusa.train(
        target,
        data_dir,
        tmp_path / "m",
        Schedule(steps=40, lr=0.0, val=0.3, eval_every=2, patience=2),
        batch_tokens=64,
        vocab=300,
    )
    assert len(result.losses) == 6
    history = json.loads((tmp_path / "m" / "losses.json").read_text())["val"]
    assert [h["step"] for h in history] == [2, 4, 6] and len({h["score"] for h in history}) == 1
    assert (tmp_path / "m" / "best" / "model.safetensors").is_file()


def test_the_held_out_split_is_stable_as_data_grows_and_checks_its_fraction(data_dir):
    seqs = data.read(data_dir)
    _, val_all = data.split(seqs, 0.3)
    _, val_half = data.split(seqs[: len(seqs) // 2], 0.3)
    assert val_half == [i for i in val_all if i < len(seqs) // 2]
    assert data.split(seqs, 0.0) == (list(range(len(seqs))), [])
    for bad in (-0.1, 1.0):
        with pytest.raises(UserError, match="--val: expected a fraction"):
            data.split(seqs, bad)
    with pytest.raises(UserError, match="held-out and"):
        data.split(seqs[:1], 0.5)  # one sequence: one side is empty


def test_resume_without_a_checkpoint_is_a_user_error(target, data_dir, tmp_path):
    with pytest.raises(UserError, match="no training state"):
        TRAINERS["medusa"](target, data_dir, tmp_path / "none", steps=4, resume=True)


def test_train_cli_data_then_medusa(tiny_model_dir, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "The quick brown fox"}) + "\n" + json.dumps({"prompt": "def f(n):"})
    )
    args = ["--target", tiny_model_dir, "--device", "cpu"]
    assert (
        main(
            [
                "train",
                "data",
                "--prompts",
                str(prompts),
                "--exclude",
                "",
                "--out",
                str(tmp_path / "d"),
                "--max-new-tokens",
                "16",
                *args,
            ]
        )
        == 0
    )
    assert "2 sequences" in capsys.readouterr().out
    assert (
        main(
            [
                "train",
                "medusa",
                "--data",
                str(tmp_path / "d"),
                "--out",
                str(tmp_path / "m"),
                "--steps",
                "3",
                "--vocab",
                "100",
                "--set",
                "num_heads=2",
                *args,
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "m" / "config.json").read_text())["num_heads"] == 2
    assert (
        main(["generate", "hello", "--drafter", f"medusa:{tmp_path / 'm'}", "--max-new-tokens", "8", *args])
        == 0
    )
    assert (
        main(["train", "medusa", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m2"), *args])
        == 2
    )
    capsys.readouterr()
    assert (
        main(
            [
                "train",
                "eagle",
                "--data",
                str(tmp_path / "d"),
                "--out",
                str(tmp_path / "m3"),
                "--resume",
                "--target",
                str(tmp_path / "no-model"),
            ]
        )
        == 2
    )  # refused before the target is even looked for
    assert "no training state" in capsys.readouterr().err
    assert (
        main(
            [
                "train",
                "eagle",
                "--data",
                str(tmp_path / "d"),
                "--out",
                str(tmp_path / "m4"),
                "--set",
                "topk=4",
                "--set",
                "ttt=3",
                "--target",
                str(tmp_path / "no-model"),
            ]
        )
        == 2
    )  # a misspelt setting: refused first
    assert (
        "--set ttt: not a setting of `train eagle`" in capsys.readouterr().err
        and not (tmp_path / "m4").exists()
    )


def test_a_lora_adapter_starts_as_the_base_and_merges_to_the_same_linear():
    from torch import nn

    from specdecode.train import lora

    torch.manual_seed(0)
    model = nn.Sequential()
    model.q_proj, model.other = nn.Linear(8, 6), nn.Linear(6, 6)
    x = torch.randn(3, 8)
    before = model.q_proj(x)
    assert lora.apply(model, rank=2) == 1
    assert torch.equal(model.q_proj(x), before)  # B = 0: training starts from the unchanged layer
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["q_proj.lora_a", "q_proj.lora_b"]
    with torch.no_grad():
        model.q_proj.lora_b.normal_()
    adapted = model.q_proj(x)
    state = lora.merged_state_dict(model)
    assert sorted(state) == ["other.bias", "other.weight", "q_proj.bias", "q_proj.weight"]
    torch.testing.assert_close(
        torch.nn.functional.linear(x, state["q_proj.weight"], state["q_proj.bias"]), adapted
    )
    lora.merge(model)
    assert isinstance(model.q_proj, nn.Linear)
    torch.testing.assert_close(model.q_proj(x), adapted)
    with pytest.raises(UserError, match="rank"):
        lora.apply(nn.Sequential(), rank=0)


def test_domain_fine_tuning_of_a_draft_checkpoint_with_lora(target, data_dir, tmp_path):
    from specdecode import drafters
    from specdecode.core.sampling import Warp
    from specdecode.decoding.generation import generate

    fresh = TRAINERS["draft"](target, data_dir, tmp_path / "base", steps=6)
    result = draft.train(
        target,
        data_dir,
        tmp_path / "tuned",
        Schedule(steps=10, lr=1e-2),
        batch_tokens=128,
        vocab=300,
        window=64,
        init=str(tmp_path / "base"),
        lora=2,
    )
    assert result.losses[0] < fresh.losses[0]  # the same first batch, scored by the trained checkpoint
    base, tuned = (
        load_file(tmp_path / "base" / "model.safetensors"),
        load_file(tmp_path / "tuned" / "model.safetensors"),
    )
    assert base.keys() == tuned.keys()  # adapters are merged: an ordinary draft checkpoint
    linears = [k for k in base if k.endswith("proj.weight")]
    assert len(linears) == 7 and all(
        torch.equal(base[k], tuned[k]) for k in base if k not in linears
    )  # frozen
    for k in linears:  # each linear moved by a rank-2 update (plus bf16 rounding)
        s = torch.linalg.svdvals(tuned[k].float() - base[k].float())
        assert s[1] > 0 and s[2] < 0.05 * s[1]  # two directions, then only rounding noise
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert config["train"]["lora"] == 2 and config["train"]["init"] == str(tmp_path / "base")
    drafter = drafters.build(f"draft:{tmp_path / 'tuned'}", drafters.DrafterContext(target))
    drafter.begin([1, 2, 3])
    assert drafter.propose([1, 2, 3], 3, Warp(), torch.Generator()).tokens.numel() == 3
    ctx = drafters.DrafterContext(target)
    for prompt in data.read(data_dir)[:2]:  # fp32 greedy: the fine-tuned draft changes nothing in the output
        plain = generate(target, drafters.build("none", ctx), prompt.prompt_ids, max_new_tokens=24)
        tuned = generate(target, drafter, prompt.prompt_ids, k=3, max_new_tokens=24)
        assert tuned.token_ids == plain.token_ids and tuned.stats.drafted > 0

    (tmp_path / "medusa").mkdir()
    (tmp_path / "medusa" / "config.json").write_text(json.dumps({"kind": "medusa"}))
    with pytest.raises(UserError, match="not 'draft'"):
        draft.train(target, data_dir, tmp_path / "x", Schedule(steps=1), init=str(tmp_path / "medusa"))


def test_the_recipe_script_trains_all_three_sharing_one_feature_store_and_skips_finished_ones(
    tiny_model_dir, data_dir, tmp_path
):
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "train_drafters.sh"
    env = {
        **os.environ,
        "EAGLE_STEPS": "2",
        "MEDUSA_STEPS": "2",
        "DRAFT_STEPS": "2",
        "AMP": "fp32",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    command = [
        "bash",
        str(script),
        str(data_dir),
        str(tmp_path / "out"),
        "--target",
        tiny_model_dir,
        "--device",
        "cpu",
        "--threads",
        "1",
        "--batch-tokens",
        "64",
        "--vocab",
        "100",
    ]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    for kind in ("eagle", "medusa", "draft"):
        assert (tmp_path / "out" / kind / "model.safetensors").is_file()
        assert len(json.loads((tmp_path / "out" / kind / "losses.json").read_text())["losses"]) == 2
    assert list((tmp_path / "out" / "features").iterdir())  # one store, in OUT/features
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout.count(": done (") == 3


def test_a_bf16_feature_source_keeps_its_own_store_entries_and_serves_losslessly(
    tiny_model_dir, data_dir, tmp_path
):
    from helpers import assert_lossless
    from specdecode import drafters
    from specdecode.backends import models

    store = tmp_path / "store"
    common = [
        "--data",
        str(data_dir),
        "--features",
        str(store),
        "--target",
        tiny_model_dir,
        "--device",
        "cpu",
        "--steps",
        "3",
        "--vocab",
        "300",
        "--set",
        "num_heads=2",
    ]
    assert main(["train", "medusa", *common, "--out", str(tmp_path / "fp32"), "--dtype", "fp32"]) == 0
    fp32_files = len(list(store.iterdir()))
    assert main(["train", "medusa", *common, "--out", str(tmp_path / "bf16"), "--dtype", "bf16"]) == 0
    assert len(list(store.iterdir())) == 2 * fp32_files  # bf16's hidden states beside fp32's, not over them
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["train"]["features"] == "bf16"
    target = models.load(tiny_model_dir, FP32, "cpu")
    ctx = drafters.DrafterContext(target, FP32)
    plain, head = drafters.build("none", ctx), drafters.build(f"medusa:{tmp_path / 'bf16'}", ctx)
    # three training steps: drafts proposed, none accepted on the random model (the rejection path)
    assert_lossless(target, plain, head, PROMPTS[:3], k=2, max_new_tokens=24, min_accepted=0)


def test_train_cli_data_with_capture_then_eagle_computes_no_features(tiny_model_dir, tmp_path, capsys):
    """`train data --capture eagle` stores the rows `train eagle` reads (the same layers by default), so
    the trainer starts without a feature pass and learns from rows that stop one short of each sequence."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"prompt": p}) for p in ("The quick brown fox", "def f(n):", "1 2 3"))
    )
    args = ["--target", tiny_model_dir, "--device", "cpu"]
    out = ["--out", str(tmp_path / "d"), "--max-new-tokens", "16"]
    assert (
        main(["train", "data", "--prompts", str(prompts), "--exclude", "", "--capture", "eagle", *out, *args])
        == 0
    )
    assert "3 sequences" in capsys.readouterr().out
    assert len(list((tmp_path / "d" / "features").glob("chunk-*.layers-0_1.pt"))) == 1
    eagle_args = [
        "--data",
        str(tmp_path / "d"),
        "--out",
        str(tmp_path / "e"),
        "--steps",
        "2",
        "--vocab",
        "100",
    ]
    assert main(["train", "eagle", *eagle_args, *args]) == 0
    assert "not in" not in capsys.readouterr().err  # features.cached found every sequence
    assert (tmp_path / "e" / "config.json").exists()
    assert (
        main(["train", "data", "--prompts", str(prompts), "--exclude", "", "--capture", "top", *out, *args])
        == 2
    )
    assert "--capture expects 'eagle' or layer ids like 2,14,25, got 'top'" in capsys.readouterr().err
