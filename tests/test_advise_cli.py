"""advise writes a config that generate accepts; memory prints an estimate; adaptive generate."""

import json

from specdecode.cli import main
from specdecode.decoding.config import load_config
from specdecode.drafters import parse


def test_advise_writes_a_config_generate_accepts(capsys, tiny_model_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {"prompt": "a b c d a b c d a b c d", "task": "code"},
                {"prompt": "one two three one two three", "task": "code"},
                {"prompt": "Write a poem about rain."},
            ]
        )
    )
    cfg, rep = tmp_path / "cfg.json", tmp_path / "report.json"
    code = main(
        [
            "advise",
            "--prompts",
            str(prompts),
            "--out",
            str(cfg),
            "--report",
            str(rep),
            "--target",
            tiny_model_dir,
            "--k-max",
            "4",
            "--max-new-tokens",
            "16",
            "--temperatures",
            "0,1.0",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    config = load_config(cfg)
    report = json.loads(rep.read_text())
    assert set(report["tasks"]) == {"code", "creative"}
    row = report["tasks"]["code"]["drafters"][0]
    for key in ("alpha", "tau", "measured_speedup_k_max", "predicted_speedup_k_max", "best_k"):
        assert key in row
    assert set(config.routing) == {"code", "creative"} and parse("ngram") in config.costs
    assert "| code |" in out
    code = main(
        [
            "generate",
            "a b c d a b c d",
            "--config",
            str(cfg),
            "--target",
            tiny_model_dir,
            "--max-new-tokens",
            "8",
            "--json",
            "--task",
            "code",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(json.loads(out)["token_ids"]) <= 8


def test_adaptive_generate_is_lossless_and_keeps_state(capsys, tiny_model_dir, tmp_path):
    state = tmp_path / "state.json"
    runs = {}
    for flags in ([], ["--adaptive", "--state", str(state), "--task", "code"]):
        code = main(
            [
                "generate",
                "a b c a b c a b c",
                "--target",
                tiny_model_dir,
                "--max-new-tokens",
                "24",
                "--json",
                "--k",
                "6",
                *flags,
            ]
        )
        out, err = capsys.readouterr()
        assert code == 0, err
        runs[bool(flags)] = json.loads(out)
    assert runs[True]["token_ids"] == runs[False]["token_ids"]
    assert "code|ngram:2-4" in json.loads(state.read_text())["records"]  # keyed by the canonical spec


def test_unknown_task_rejected(capsys, tiny_model_dir):
    assert main(["generate", "hi", "--task", "astrology", "--target", tiny_model_dir]) == 2
    assert "unknown task 'astrology'" in capsys.readouterr().err


def test_memory_command(capsys, tiny_model_dir, tiny_draft_dir):
    code = main(
        [
            "memory",
            "--target",
            tiny_model_dir,
            "--drafter",
            f"draft:{tiny_draft_dir}",
            "--context",
            "256",
            "--measure",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "target: weights" in out and "draft: weights" in out and "measured: resident growth" in out
    assert main(["memory", "--target", tiny_model_dir, "--context", "0"]) == 2


def test_bench_adaptive_rows_are_lossless(capsys, tiny_model_dir, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        "\n".join(
            json.dumps({"prompt": p, "category": c})
            for p, c in [("a b a b a b", "code"), ("x y z x y z", "code"), ("tell a tale", "creative")]
        )
    )
    out_json = tmp_path / "r.json"
    code = main(
        [
            "bench",
            "--prompts",
            str(f),
            "--drafters",
            "ngram:1-2",
            "--adaptive",
            "--k",
            "2,4",
            "--k-max",
            "6",
            "--target",
            tiny_model_dir,
            "--max-new-tokens",
            "12",
            "--out",
            str(out_json),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = {(r["drafter"], r["category"]): r for r in json.loads(out_json.read_text())["rows"]}
    assert rows[("ngram:1-2+adaptive", "ALL")]["identical_to_none"] == 1.0
    for k in (2, 4):  # one fixed-k run per --k value, labelled with it
        assert rows[(f"ngram:1-2@k{k}", "ALL")]["identical_to_none"] == 1.0
    assert rows[("ngram:1-2@k2", "ALL")]["acceptance_by_position"][2:] == []  # k=2 never drafts a third token
    assert len(rows[("ngram:1-2@k4", "ALL")]["acceptance_by_position"]) == 4
    assert ("ngram:1-2+adaptive", "code") in rows and "| fp32 | ngram:1-2+adaptive | ALL |" in out
