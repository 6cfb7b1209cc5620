"""The CLI contract: generate (text and --json), check-tokenizers, bench, and bad input."""

import json
import subprocess
import sys

import pytest

from specdecode.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_json_fields_and_identity(capsys, tiny_model_dir):
    outputs = {}
    for drafter in ("none", "ngram"):
        code, out, err = run_cli(
            capsys,
            "generate",
            "the cat sat on the mat",
            "--target",
            tiny_model_dir,
            "--drafter",
            drafter,
            "--max-new-tokens",
            "24",
            "--json",
            "--no-chat",
        )
        assert code == 0, err
        obj = json.loads(out.strip().splitlines()[-1])
        assert set(obj) >= {"id", "text", "token_ids", "stats"}
        stats = obj["stats"]
        for key in (
            "drafted",
            "accepted",
            "acceptance_rate",
            "mean_accepted_length",
            "target_forwards",
            "new_tokens",
            "wall_s",
            "tokens_per_s",
        ):
            assert key in stats
        assert stats["new_tokens"] == len(obj["token_ids"]) <= 24
        outputs[drafter] = obj
    assert outputs["none"]["stats"]["drafted"] == 0
    assert outputs["none"]["stats"]["target_forwards"] == outputs["none"]["stats"]["new_tokens"] + 1
    assert outputs["ngram"]["token_ids"] == outputs["none"]["token_ids"]


def test_generate_streams_text_and_stats_line(capsys, tiny_model_dir):
    code, out, err = run_cli(
        capsys, "generate", "hello world", "--target", tiny_model_dir, "--max-new-tokens", "10"
    )
    assert code == 0
    assert "tok/s" in err and "α" in err
    code2, out2, _ = run_cli(
        capsys, "generate", "hello world", "--target", tiny_model_dir, "--max-new-tokens", "10", "--json"
    )
    assert out.rstrip("\n") == json.loads(out2)["text"].rstrip("\n")


def test_generate_prompt_file(capsys, tiny_model_dir, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "one two three", "id": "a", "category": "x"}\n\n{"prompt": "four five"}\n')
    code, out, err = run_cli(
        capsys,
        "generate",
        "--prompt-file",
        str(f),
        "--target",
        tiny_model_dir,
        "--max-new-tokens",
        "5",
        "--json",
    )
    assert code == 0, err
    objs = [json.loads(line) for line in out.strip().splitlines()]
    assert [o["id"] for o in objs] == ["a", "3"]
    assert objs[0]["category"] == "x"


def test_check_tokenizers(capsys, tiny_model_dir, tiny_draft_dir, other_tokenizer_dir):
    code, out, _ = run_cli(capsys, "check-tokenizers", tiny_model_dir, tiny_draft_dir)
    assert code == 0 and "compatible: yes" in out
    code, out, _ = run_cli(capsys, "check-tokenizers", tiny_model_dir, other_tokenizer_dir)
    assert code == 1 and "compatible: NO" in out and "differ" in out


def test_bench_prints_table_and_writes_json(capsys, tiny_model_dir, tmp_path):
    f = tmp_path / "p.jsonl"
    lines = [{"prompt": f"a b c a b c {i}", "category": c} for i, c in enumerate(["code", "code", "chat"])]
    f.write_text("\n".join(json.dumps(x) for x in lines))
    out_json = tmp_path / "r.json"
    code, out, err = run_cli(
        capsys,
        "bench",
        "--prompts",
        str(f),
        "--drafters",
        "ngram",
        "--target",
        tiny_model_dir,
        "--max-new-tokens",
        "12",
        "--out",
        str(out_json),
    )
    assert code == 0, err
    assert "| fp32 | ngram:2-4 | code |" in out and "| fp32 | none | ALL |" in out
    report = json.loads(out_json.read_text())
    rows = {(r["drafter"], r["category"]): r for r in report["rows"]}
    assert rows[("none", "ALL")]["speedup_vs_none"] == 1.0
    assert rows[("ngram:2-4", "ALL")]["identical_to_none"] == 1.0  # greedy fp32: lossless
    assert rows[("ngram:2-4", "ALL")]["prompts"] == 3 and rows[("ngram:2-4", "code")]["prompts"] == 2


BAD = [
    (["generate", ""], "empty prompt"),
    (["generate", "   "], "empty prompt"),
    (["generate"], "no prompt"),
    (["generate", "hi", "--k", "0"], "k must be"),
    (["generate", "hi", "--k", "100000"], "k must be"),
    (["generate", "hi", "--temperature", "-0.5"], "temperature"),
    (["generate", "hi", "--top-p", "0"], "top-p"),
    (["generate", "hi", "--top-p", "1.5"], "top-p"),
    (["generate", "hi", "--top-k", "-1"], "top-k"),
    (["generate", "hi", "--max-new-tokens", "0"], "max-new-tokens"),
    (["generate", "hi", "--drafter", "telepathy"], "unknown drafter"),
    (["generate", "hi", "--target", "/no/such/model"], "model path not found"),
    (["generate", "hi", "--drafter", "draft:/no/such/draft"], "model path not found"),
    (["generate", "hi", "--threads", "0"], "threads"),
    (["bench", "--prompts", "/no/such/file.jsonl"], "prompt file not found"),
    (["bench", "--repeats", "0"], "repeats"),
    (["bench", "--k", "2,x"], "comma-separated list of integers"),
    (["bench", "--k", "2,0"], "k must be"),
    (["bench", "--k-max", "0"], "k must be"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_one_line_error(capsys, tiny_model_dir, argv, message):
    if "--target" not in argv:
        argv = argv + ["--target", tiny_model_dir] if argv[0] != "check-tokenizers" else argv
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdecode: error:") and message in lines[0], err


def test_prompt_longer_than_context(capsys, tiny_model_dir):
    code, _, err = run_cli(capsys, "generate", "word " * 2000, "--target", tiny_model_dir)
    assert code == 2 and "exceeds the model's context" in err
    code, _, err = run_cli(capsys, "generate", "hi", "--target", tiny_model_dir, "--max-new-tokens", "100000")
    assert code == 2 and "exceeds the model's context" in err


def test_mismatched_tokenizers_draft_across_vocabularies(capsys, tiny_model_dir, other_tokenizer_dir):
    code, out, err = run_cli(
        capsys,
        "generate",
        "hi",
        "--target",
        tiny_model_dir,
        "--drafter",
        f"draft:{other_tokenizer_dir}",
        "--max-new-tokens",
        "8",
        "--json",
    )
    assert code == 0 and json.loads(out)["stats"]["drafted"] > 0, err
    code, _, err = run_cli(
        capsys, "generate", "hi", "--target", tiny_model_dir, "--drafter", f"draft:b=2:{other_tokenizer_dir}"
    )
    assert code == 2 and "token trees" in err


@pytest.mark.parametrize(
    "content,message",
    [
        ("not json\n", ":1: not valid JSON"),
        ('{"text": "no prompt field"}\n', ":1: expected an object"),
        ('{"prompt": "ok"}\n[1, 2]\n', ":2: expected an object"),
        ('{"prompt": ""}\n', ":1: empty prompt"),
        ("", "has no prompts"),
    ],
)
def test_malformed_prompt_file(capsys, tiny_model_dir, tmp_path, content, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    code, _, err = run_cli(capsys, "generate", "--prompt-file", str(f), "--target", tiny_model_dir)
    assert code == 2 and message in err, err


def test_console_script_user_error_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "specdecode", "generate", "hi", "--k", "-3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "k must be between" in proc.stderr


def test_threads_follow_the_free_cores_unless_chosen(monkeypatch, capsys):
    """Beside a busy core a second thread stalls every parallel region (40x slower measured): without
    --threads, the CLI uses the cores the load average leaves free, and says so."""
    import argparse
    import os

    import torch

    from specdecode import cli

    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(os, "cpu_count", lambda: 4)
        monkeypatch.setattr(os, "getloadavg", lambda: (2.2, 2.0, 1.0))
        torch.set_num_threads(4)
        cli.options.setup(argparse.Namespace(threads=None))
        assert torch.get_num_threads() == 2 and "2 of 4 cores busy" in capsys.readouterr().err
        cli.options.setup(argparse.Namespace(threads=3))  # an explicit choice wins
        assert torch.get_num_threads() == 3
        monkeypatch.setattr(os, "getloadavg", lambda: (9.0, 9.0, 9.0))
        assert cli.options.free_cores() == 1
    finally:
        torch.set_num_threads(before)
