"""The fast forward on the families it covers beyond Llama (Qwen2 biases, Qwen3 q/k norms, Mistral,
Phi-3 fused matrices, Gemma 3 with sliding-window layers): tiny random models built from their
transformers configs give Hugging Face's logits through prefill, decode, rollback and a tree, fused
and eager; greedy speculation equals plain decoding; unsupported variants fall back with a one-line reason."""

import json

import pytest
import torch

from helpers import assert_lossless
from specdecode import drafters
from specdecode.backends import models
from specdecode.backends.fast_llama import FastLlama
from specdecode.backends.precision import FP32
from train_fixtures import PROMPTS

FAMILIES = {
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "mistral": {"sliding_window": None},
    "phi3": {"pad_token_id": None},
    # Gemma 3: a window of 16 that the tests' 80+ positions exceed, local and global layers, its own q.k scale
    "gemma3_text": {
        "head_dim": 32,
        "num_key_value_heads": 1,
        "sliding_window": 16,
        "query_pre_attn_scalar": 24,
        "layer_types": ["sliding_attention", "full_attention"],
        "pad_token_id": None,
    },
}


def make(family: str, seed: int = 0, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        family,
        **{
            "vocab_size": 384,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
            "initializer_range": 0.2,
            "eos_token_id": 0,
            "bos_token_id": None,
            **FAMILIES[family],
            **extra,
        },
    )
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        hf.lm_head.weight.mul_(2.5)  # peaked next-token distributions (conftest.make_llama)
        for name, param in hf.named_parameters():
            if "norm" in name and family.startswith("gemma"):
                param.normal_(0, 0.3)  # Gemma's (1 + w) norms start at w = 0: make the offset matter
            if name.endswith("bias"):
                param.normal_(0, 0.5)  # Qwen2's q/k/v biases start at 0: make them matter
    return hf


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_hugging_face(family, fused):
    hf = make(family)
    fast, ref = FastLlama(hf, fused=fused), models.HFModel(hf)
    if fused:
        assert fast.kernels is not None or pytest.skip("no C++ compiler")
    ids = torch.randint(0, 384, (120,), generator=torch.Generator().manual_seed(1))
    for chunk, keep in [(70, None), (4, 72), (1, None), (5, None)]:  # prefill, verify + rollback, decode
        start = fast.length
        a, b = fast.extend(ids[start : start + chunk]), ref.extend(ids[start : start + chunk])
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        if keep is not None:
            fast.truncate(keep), ref.truncate(keep)
    # a tree of 3 tokens after the prefix: its paths' logits are the chains' logits
    n = fast.length
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    tree = fast.extend_tree(ids[:3], torch.tensor([n, n + 1, n + 1]), mask)
    fast.truncate(n)
    torch.testing.assert_close(tree[:2], fast.extend(ids[:2]), atol=1e-4, rtol=1e-4)
    fast.truncate(n)
    torch.testing.assert_close(tree[2], fast.extend(ids[:3:2])[1], atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_target(request, tmp_path_factory, tiny_tokenizer):
    path = tmp_path_factory.mktemp(request.param)
    make(request.param, seed=2, eos_token_id=tiny_tokenizer.eos_token_id).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return models.load(str(path), FP32, "cpu")


@pytest.mark.parametrize("spec", ["ngram", "draft:{draft}", "draft:{self}"])
def test_greedy_speculation_equals_plain(family_target, tiny_draft_dir, spec):
    """n-gram and an unrelated random draft are (almost) never accepted by a random family model: they
    check the rejection path; the family's own weights as the draft check acceptance and bonus tokens."""
    assert isinstance(family_target.model, FastLlama)
    ctx = drafters.DrafterContext(family_target)
    own = spec == "draft:{self}"
    spec = spec.format(draft=tiny_draft_dir, self=family_target.name)
    plain, drafter = drafters.build("none", ctx), drafters.build(spec, ctx)
    assert_lossless(
        family_target, plain, drafter, PROMPTS[:3], k=4, max_new_tokens=30, min_accepted=30 if own else 0
    )


def test_unsupported_variants_fall_back_with_a_reason(capsys):
    hf = make("mistral", sliding_window=16)
    assert isinstance(models.wrap(hf, "auto"), models.HFModel)
    assert (
        "no sliding-window attention (mistral, window 16); using the Hugging Face forward"
        in capsys.readouterr().err
    )
    hf = make("qwen2", use_sliding_window=True, sliding_window=16, max_window_layers=0)
    assert isinstance(models.wrap(hf, "auto"), models.HFModel)
    assert isinstance(
        models.wrap(make("qwen2", use_sliding_window=False, sliding_window=16), "auto"), FastLlama
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_every_trainer_runs_on_the_family_its_drafter_is_lossless_and_exports(
    family, tmp_path, tiny_tokenizer, capsys
):
    """train eagle, draft and medusa on each family (Phi-3: untied LM head and fused matrices; Gemma 3:
    (1 + w) norms, two rotary tables); greedy speculation with what they wrote equals plain; the vLLM
    export writes each, or refuses an EAGLE-3 head on a family vLLM runs none on, naming it."""
    from specdecode import cli
    from specdecode.drafters.distilled import build_model
    from train_fixtures import make_data

    path = tmp_path / family
    kinds = FAMILIES[family].get("layer_types")
    make(
        family,
        seed=3,
        eos_token_id=tiny_tokenizer.eos_token_id,
        num_hidden_layers=4,
        **({"layer_types": kinds * 2} if kinds else {}),
    ).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    target = models.load(str(path), FP32, "cpu")
    data_dir = make_data(target, tmp_path / "data", max_new_tokens=24)
    ctx = drafters.DrafterContext(target)
    plain = drafters.build("none", ctx)
    for trainer, extra in (("eagle", ["--set", "layers=0,1,2"]), ("draft", []), ("medusa", [])):
        out = tmp_path / trainer
        assert (
            cli.main(
                [
                    "train",
                    trainer,
                    "--target",
                    str(path),
                    "--data",
                    str(data_dir),
                    "--out",
                    str(out),
                    "--threads",
                    "1",
                    "--device",
                    "cpu",
                    "--steps",
                    "3",
                    *extra,
                ]
            )
            == 0
        )
        # a few training steps on a random model: drafts are proposed, rarely accepted (the accepting
        # path of each trained drafter: tests/test_gguf_weights.py and test_medusa_eagle.py)
        assert_lossless(
            target,
            plain,
            drafters.build(f"{trainer}:{out}", ctx),
            PROMPTS[:2],
            k=3,
            max_new_tokens=20,
            min_accepted=0,
        )
        capsys.readouterr()
        code = cli.main(
            [
                "export",
                "vllm",
                "--target",
                str(path),
                "--drafter",
                f"{trainer}:{out}",
                "--k",
                "3",
                "--out",
                str(tmp_path / f"export-{trainer}"),
            ]
        )
        if trainer == "eagle" and family == "gemma3_text":  # vLLM 0.32's Gemma 3 has no EAGLE-3 interface
            assert code == 2 and "not Gemma3ForCausalLM" in capsys.readouterr().err
            continue
        assert code == 0, capsys.readouterr().err
        written = json.loads(
            next((tmp_path / f"export-{trainer}" / "drafters").glob("*/config.json")).read_text()
        )
        if trainer == "draft":  # the target's own architecture, its LM head where it is not the embedding
            assert written["architectures"] == target.model.hf.config.architectures
            assert written["tie_word_embeddings"] == target.model.hf.config.tie_word_embeddings

    draft = build_model(target.model, 1)
    assert type(draft) is type(target.model.hf)
    assert draft.get_output_embeddings().weight is target.model.hf.get_output_embeddings().weight
