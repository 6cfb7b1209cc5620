"""scripts/scaling_curve.py: bench rows become points at their checkpoint's training tokens, per series."""

import json
from pathlib import Path

import pytest

from helpers import load_script


@pytest.fixture(scope="module")
def curve():
    return load_script("scaling_curve")


def _row(drafter, category="ALL", a1=0.3):
    return {
        "drafter": drafter,
        "category": category,
        "dtype": "fp32",
        "acceptance_rate": a1 / 2,
        "acceptance_by_position": [a1, a1 / 3],
        "mean_accepted_length": 1 + a1,
        "speedup_vs_none": 0.9,
        "identical_to_none": 1.0,
    }


def _checkpoint(path: Path, tokens: int | None) -> str:
    path.mkdir()
    train = {"steps": 10} if tokens is None else {"steps": 10, "response_tokens": tokens}
    (path / "config.json").write_text(json.dumps({"kind": "eagle", "train": train}))
    return str(path)


def test_points_by_training_tokens_and_series(curve, tmp_path):
    small, big, chat = (_checkpoint(tmp_path / n, t) for n, t in (("s", 1000), ("b", 3000), ("c", 2000)))
    old = _checkpoint(tmp_path / "old", None)
    report = {
        "rows": [
            _row("none", a1=0.0),
            _row(f"eagle:{big}", a1=0.2),
            _row(f"eagle:{small}", a1=0.1),
            _row(f"eagle:{small}", category="code", a1=0.9),
            _row(f"eagle:b=2:nodes=6:{chat}", a1=0.4),
            _row(f"eagle:{old}"),
            _row("ngram", a1=0.5),
        ]
    }
    pts = curve.points([report], {}, {f"eagle:b=2:nodes=6:{chat}": "eagle tree + chat"})
    # only category ALL of trained drafters with known tokens; sorted by series, then tokens
    assert [(p["series"], p["train_tokens"], p["alpha_by_position"][0]) for p in pts] == [
        ("eagle", 1000, 0.1),
        ("eagle", 3000, 0.2),
        ("eagle tree + chat", 2000, 0.4),
    ]
    with_old = curve.points([report], {f"eagle:{old}": 500})
    assert [p["train_tokens"] for p in with_old if p["series"] == "eagle"] == [500, 1000, 3000]
    assert {p["series"] for p in with_old} == {
        "eagle",
        "eagle:b=2:nodes=6",
    }  # the path is not part of a series
    gone = {"rows": [_row(f"eagle:{tmp_path / 'elsewhere'}")]}  # a checkpoint from another machine
    assert curve.points([gone], {}) == []
    moved = curve.points([gone], {f"eagle:{tmp_path / 'elsewhere'}": 700})
    assert [(p["train_tokens"], p["train"]) for p in moved] == [(700, None)]  # not the shipped head's config


def test_rows_of_a_run_over_several_k_keep_their_checkpoint_and_can_be_filtered(curve, tmp_path):
    ckpt = _checkpoint(tmp_path / "c", 1000)
    report = {"rows": [_row(f"eagle:{ckpt}@k1", a1=0.4), _row(f"eagle:{ckpt}@k3", a1=0.3), _row("ngram@k3")]}
    both = curve.points([report], {})
    assert [(p["train_tokens"], p["alpha_by_position"][0]) for p in both] == [(1000, 0.4), (1000, 0.3)]
    assert [p["alpha_by_position"][0] for p in curve.points([report], {}, k=3)] == [0.3]
    assert [p["series"] for p in curve.points([report], {}, k=1)] == ["eagle"]
