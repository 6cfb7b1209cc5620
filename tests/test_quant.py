"""int8 quantization (quant.py): FastLlama calls the quantized linears, the model gets smaller, an int8
drafter leaves greedy output to the fp32 target, and bad requests are clear errors."""

from __future__ import annotations

import io
import warnings

import pytest
import torch

from conftest import make_llama
from specdecode import drafters
from specdecode.backends import models, quant
from specdecode.backends.precision import BF16, FP32
from specdecode.cli import main
from specdecode.decoding.generation import generate
from specdecode.errors import UserError

PROMPTS = ["The quick brown fox", "def fibonacci(n):\n    return", "Hello, world! How are"]


def _layer_bytes(hf) -> int:
    buf = io.BytesIO()
    torch.save(hf.model.layers.state_dict(), buf)
    return buf.tell()


def test_decoder_linears_shrink_about_4x():
    hf = make_llama(seed=0, layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2)
    fp32, embed = _layer_bytes(hf), hf.model.embed_tokens.weight.clone()
    quant.quantize(hf)
    assert all(
        quant.is_int8(m) for layer in hf.model.layers for m in (layer.self_attn.q_proj, layer.mlp.down_proj)
    )
    assert _layer_bytes(hf) < 0.3 * fp32  # int8 weights + per-channel scales, norms still fp32
    assert torch.equal(hf.model.embed_tokens.weight, embed) and hf.lm_head.weight.dtype == torch.float32


def test_fast_llama_runs_the_int8_weights(tiny_model_dir):
    """FastLlama on a quantized model gives HF's own forward of that model (same int8 kernels), not
    the fp32 logits: it calls the quantized linears rather than weights it kept from before."""
    fp32 = models.load(tiny_model_dir, FP32, "cpu").model
    int8 = models.load(tiny_model_dir, FP32, "cpu", quant="int8")
    hf_forward = models.wrap(int8.model.hf, "hf")
    tokens = torch.tensor([5, 70, 9, 200, 31, 8, 150, 42])
    fast, slow, full = (m.extend(tokens) for m in (int8.model, hf_forward, fp32))
    assert type(int8.model).__name__ == "FastLlama"
    torch.testing.assert_close(fast, slow, atol=1e-4, rtol=1e-4)
    assert (fast - full).abs().max() > 1e-2  # quantization changed the numbers


def test_int8_drafter_keeps_the_targets_greedy_output(target, tiny_model_dir):
    """The target decides: an int8 copy of the target as draft changes α, never the output."""
    ctx = drafters.DrafterContext(target, device="cpu", quant="int8")
    drafter = drafters.build(f"draft:{tiny_model_dir}", ctx)
    assert quant.is_int8(drafter.model.hf.model.layers[0].self_attn.q_proj)
    plain = drafters.build("none", ctx)
    drafted = accepted = 0
    for prompt in PROMPTS:
        want = generate(target, plain, prompt, max_new_tokens=24, chat=False)
        got = generate(target, drafter, prompt, k=3, max_new_tokens=24, chat=False)
        assert got.token_ids == want.token_ids, prompt
        drafted, accepted = drafted + got.stats.drafted, accepted + got.stats.accepted
    print(f"int8 self-draft α = {accepted / drafted:.2f}")
    assert 0.3 < accepted / drafted < 1  # mostly its own tokens, yet int8 rounding changes some


def test_bad_quantization_requests_are_clear_errors(tiny_model_dir, capsys):
    with pytest.raises(UserError, match="unknown quantization 'int4'.*none, int8"):
        models.load(tiny_model_dir, FP32, "cpu", quant="int4")
    with pytest.raises(UserError, match="starts from fp32"):
        quant.check("int8", BF16, "cpu")
    with pytest.raises(UserError, match="CPU only"):
        quant.check("int8", FP32, "cuda")
    assert (
        main(["generate", "hi", "--target", tiny_model_dir, "--drafter", "ngram", "--drafter-quant", "int8"])
        != 0
    )
    assert "--drafter-quant applies to draft models" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "hi", "--target-quant", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err


def test_an_int8_target_that_speculates_is_warned_about_in_the_api_and_the_cli(tiny_model_dir, capsys):
    """README's losslessness promise has this exception; each way in says so (plain decoding does not)."""
    from specdecode import LLM

    with pytest.warns(quant.LossyTargetWarning, match="target-quant int8 with speculation"):
        LLM(tiny_model_dir, "ngram", target_quant="int8", dtype="fp32")
    with warnings.catch_warnings():
        warnings.simplefilter("error", quant.LossyTargetWarning)
        LLM(tiny_model_dir, "none", target_quant="int8", dtype="fp32")  # no speculation: no warning
        LLM(tiny_model_dir, "ngram", dtype="fp32")  # a float target: no warning
    with pytest.warns(quant.LossyTargetWarning):
        main(
            [
                "generate",
                "hi",
                "--target",
                str(tiny_model_dir),
                "--target-quant",
                "int8",
                "--dtype",
                "fp32",
                "--max-new-tokens",
                "2",
                "--no-chat",
            ]
        )
