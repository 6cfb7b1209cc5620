"""`train prompts` (Magpie): prompts the target writes after its chat template's user header; seeded
per attempt, so a resumed run gives the uninterrupted run's file; the file feeds `train data`."""

import json

import pytest

from specdecode import corpora
from specdecode.errors import UserError
from specdecode.train import prompts


def test_the_query_prefix_is_the_template_up_to_the_users_message(target):
    tok = target.tokenizer
    prefix = prompts.query_prefix(tok)
    full = tok.apply_chat_template([{"role": "user", "content": "hello there"}], tokenize=False)
    assert tok.decode(prefix) == full[: full.index("hello there")]
    assert len(prefix) > 0


def test_written_prompts_are_kept_samples_and_a_resumed_run_writes_the_same_file(target, tmp_path):
    opts = dict(seed=3, max_tokens=40, min_words=1)
    whole = prompts.write_prompts(target, tmp_path / "whole.jsonl", 5, **opts)
    assert len(whole) == 5
    assert len({r["prompt"] for r in whole}) == 5  # no duplicates
    attempts = [int(r["id"].rpartition("-")[2]) for r in whole]
    assert attempts == sorted(attempts) and len(set(attempts)) == 5

    part = prompts.write_prompts(target, tmp_path / "part.jsonl", 2, **opts)
    assert part == whole[:2]
    resumed = prompts.write_prompts(target, tmp_path / "part.jsonl", 5, **opts)
    assert (tmp_path / "part.jsonl").read_text() == (tmp_path / "whole.jsonl").read_text()
    assert resumed == whole
    # another seed samples other prompts; the file is a prompt set for `train data` and `bench`
    other = prompts.write_prompts(target, tmp_path / "other.jsonl", 5, **{**opts, "seed": 4})
    assert [r["prompt"] for r in other] != [r["prompt"] for r in whole]
    loaded = corpora.read_jsonl(tmp_path / "whole.jsonl")
    assert [p.prompt for p in loaded] == [r["prompt"] for r in whole]
    assert {p.category for p in loaded} == {"self-instruct"}


def test_samples_cut_at_max_tokens_or_too_short_are_dropped(target, tmp_path):
    rows = prompts.write_prompts(target, tmp_path / "p.jsonl", 3, seed=0, max_tokens=40, min_words=3)
    assert all(len(r["prompt"].split()) >= 3 for r in rows)
    # with one token allowed nothing ends its turn: the run stops after max_attempts, keeping nothing
    none = prompts.write_prompts(
        target, tmp_path / "q.jsonl", 2, seed=0, max_tokens=1, min_words=50, max_attempts=5
    )
    assert none == []


def test_bad_arguments_and_foreign_files_are_clear_errors_that_change_nothing(target, tmp_path):
    with pytest.raises(UserError, match="temperature"):
        prompts.write_prompts(target, tmp_path / "p.jsonl", 2, temperature=0.0)
    with pytest.raises(UserError, match="count"):
        prompts.write_prompts(target, tmp_path / "p.jsonl", 0)
    foreign = tmp_path / "mine.jsonl"
    foreign.write_text(json.dumps({"prompt": "my own prompt"}) + "\n")
    before = foreign.read_bytes()
    with pytest.raises(UserError, match="train prompts"):
        prompts.write_prompts(target, foreign, 3)
    assert foreign.read_bytes() == before


def test_a_tokenizer_without_a_chat_template_is_refused(target):
    class Plain:
        chat_template = None

    with pytest.raises(UserError, match="chat template"):
        prompts.query_prefix(Plain())


def test_cli_prompts_then_data_answers_them(tiny_model_dir, tmp_path, capsys):
    from specdecode.cli import main
    from specdecode.train import data

    args = ["--target", tiny_model_dir, "--device", "cpu"]
    out = tmp_path / "self.jsonl"
    assert (
        main(
            [
                "train",
                "prompts",
                "--out",
                str(out),
                "--count",
                "3",
                "--max-tokens",
                "40",
                "--min-words",
                "1",
                *args,
            ]
        )
        == 0
    )
    assert "3 prompts" in capsys.readouterr().out
    assert (
        main(
            [
                "train",
                "data",
                "--prompts",
                str(out),
                "--exclude",
                "",
                "--out",
                str(tmp_path / "d"),
                "--max-new-tokens",
                "8",
                *args,
            ]
        )
        == 0
    )
    seqs = data.read(tmp_path / "d")
    written = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(s.id for s in seqs) == sorted(written)
    assert main(["train", "prompts", "--out", str(out), "--count", "2", "--temperature", "0", *args]) == 2
