"""`specdecode memory` for every drafter spec form: which models each spec adds, read from the
parsed spec (`draft:b=2:<model>` was read as the model `b=2:<model>`, plain `draft` was ignored)."""

import json

import pytest
import torch

from specdecode.backends import models
from specdecode.backends.checkpoint import SHIPPED
from specdecode.backends.precision import FP32
from specdecode.cli import main
from specdecode.decoding import memory
from specdecode.drafters import parse

COMMON = dict(precision=FP32, context=256, batch=1, k=4)


def _report(target_dir, drafter):
    return memory.report(target_dir, parse(drafter), **COMMON)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Config-only stand-ins: memory reads a checkpoint's config.json and its tensors' shapes, never
    the weights' values (nor the target fingerprint, which building the drafter checks)."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("ckpts")
    distilled = root / "distilled"
    distilled.mkdir()
    (distilled / "config.json").write_text(json.dumps({"kind": "draft", "num_layers": 2}))
    heads = root / "medusa"
    heads.mkdir()
    save_file(
        {"weight": torch.zeros(3, 64, 64), "bias": torch.zeros(3, 64), "token_map": torch.arange(100)},
        str(heads / "model.safetensors"),
    )
    (heads / "config.json").write_text(json.dumps({"kind": "medusa"}))
    return {"distilled": str(distilled), "medusa": str(heads)}


def test_plain_and_weightless_specs_add_nothing(tiny_model_dir):
    for drafter in ("none", "ngram", "ngram:1-3:b=3"):
        rep = _report(tiny_model_dir, drafter)
        assert set(rep) & {"draft", "heads"} == set() and rep["total"] == rep["target"].total
    # the target verifies the spec's largest step: 1 token for none, b·k + 1 for an n-gram tree
    cfg = models.load_config(tiny_model_dir)
    assert _report(tiny_model_dir, "none")["target"] == memory.estimate(cfg, context=256, tokens_in_flight=1)
    assert _report(tiny_model_dir, "ngram:b=3")["target"] == memory.estimate(
        cfg, context=256, tokens_in_flight=13
    )


def test_draft_model_with_tree_options_is_the_same_model(tiny_model_dir, tiny_draft_dir):
    chain = _report(tiny_model_dir, f"draft:{tiny_draft_dir}")
    tree = _report(tiny_model_dir, f"draft:b=2:{tiny_draft_dir}")
    dynamic = _report(tiny_model_dir, f"draft:b=2:nodes=10:{tiny_draft_dir}")
    draft_cfg = models.load_config(tiny_draft_dir)
    assert chain["draft"] == memory.estimate(draft_cfg, context=256, tokens_in_flight=1)
    assert tree["draft"].weights == dynamic["draft"].weights == chain["draft"].weights > 0
    assert tree["draft"] == memory.estimate(
        draft_cfg, context=256, tokens_in_flight=2
    )  # b tokens per forward
    assert tree["total"] == tree["target"].total + tree["draft"].total
    assert tree["target"].activations >= chain["target"].activations


def test_distilled_drafts_share_the_target_embedding(tiny_model_dir, checkpoints):
    cfg = models.load_config(tiny_model_dir)
    embedding = cfg.vocab_size * cfg.hidden_size * 4
    for drafter, layers in (
        (f"draft:{checkpoints['distilled']}", 2),
        ("draft", json.loads((SHIPPED / "draft" / "config.json").read_text())["num_layers"]),
    ):
        rep = _report(tiny_model_dir, drafter)
        cfg.num_hidden_layers, cfg.tie_word_embeddings = layers, True
        full = memory.estimate(cfg, context=256, tokens_in_flight=1)
        assert rep["draft"].weights == full.weights - embedding and rep["draft"].kv_cache == full.kv_cache
        assert rep["total"] == rep["target"].total + rep["draft"].total
        cfg = models.load_config(tiny_model_dir)


def test_heads_count_their_tensors_and_reduced_lm_head(tiny_model_dir, checkpoints):
    rep = _report(tiny_model_dir, f"medusa:b=2:{checkpoints['medusa']}")
    elements = 3 * 64 * 64 + 3 * 64 + 100 + 100 * 64  # weight, bias, token_map, LM head rows of the map
    assert rep["heads"].total == elements * 4 and rep["total"] == rep["target"].total + rep["heads"].total
    assert "draft" not in rep


def test_ensemble_adds_each_member(tiny_model_dir, tiny_draft_dir, checkpoints):
    rep = _report(tiny_model_dir, f"ensemble:ngram+draft:{tiny_draft_dir}+medusa:{checkpoints['medusa']}")
    alone = _report(tiny_model_dir, f"draft:{tiny_draft_dir}")
    assert rep["draft"] == alone["draft"] and "heads" in rep
    assert rep["total"] == rep["target"].total + rep["draft"].total + rep["heads"].total


def test_cli_memory_with_a_tree_draft(capsys, tiny_model_dir, tiny_draft_dir):
    assert (
        main(
            [
                "memory",
                "--target",
                tiny_model_dir,
                "--drafter",
                f"draft:b=2:{tiny_draft_dir}",
                "--context",
                "256",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "  draft: weights" in out and "total estimate" in out
    assert main(["memory", "--target", tiny_model_dir, "--drafter", "draft:b=2"]) == 2
    assert "needs a model" in capsys.readouterr().err
