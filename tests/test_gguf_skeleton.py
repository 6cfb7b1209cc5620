"""gguf_skeleton.SkeletonLM stands in for transformers' class as a GGUF model's skeleton (Llama, Qwen2,
Qwen3): the same parameters by name and shape, the file's float tensors with the same values, the same
rotary tables bit for bit and the same generation config; the other families keep transformers' class.
Loading a GGUF file of those families imports none of transformers' modeling code, nor torch._dynamo."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import make_tokenizer
from gguf_fixtures import write_tiny_gguf
from specdecode.backends import gguf_model, gguf_skeleton, kernels

VARIANTS = {  # GGUF metadata carries no head_dim: Qwen3's default of 128 (hidden 512, 4 heads)
    "llama": {"tie_word_embeddings": True},
    "qwen2": {"tie_word_embeddings": False},
    "qwen3": {"hidden_size": 512, "tie_word_embeddings": True},
}


def tiny(tmp_path, variant: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = {"vocab_size": 384, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    cfg = AutoConfig.for_model(
        variant,
        **{**shape, **VARIANTS[variant]},
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.normal_(0, 0.5)  # norms and biases that are not their initial ones and zeros
    return write_tiny_gguf(tmp_path / f"{variant}.gguf", hf, make_tokenizer(), {})


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_light_skeleton_is_transformers_skeleton_without_its_code(variant, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDECODE_CACHE", str(tmp_path / "cache"))
    path = Path(tiny(tmp_path, variant))
    tensors = gguf_model.read(path)[1]
    light = gguf_model.skeleton(path, tensors)
    monkeypatch.setattr(gguf_skeleton, "supported", lambda config: False)
    full = gguf_model.skeleton(path, tensors)
    assert isinstance(light, gguf_skeleton.SkeletonLM) and not isinstance(full, gguf_skeleton.SkeletonLM)
    mine, theirs = dict(light.named_parameters()), dict(full.named_parameters())
    assert {k: v.shape for k, v in mine.items()} == {k: v.shape for k, v in theirs.items()}
    real = {k for k, v in theirs.items() if v.device.type != "meta"}
    assert real == {k for k, v in mine.items() if v.device.type != "meta"}
    assert any(k.endswith("bias") for k in real) == (variant == "qwen2")  # q|k|v biases
    for k in real:
        assert torch.equal(mine[k], theirs[k]), k
    tied = light.get_output_embeddings().weight is light.get_input_embeddings().weight
    assert tied == (full.get_output_embeddings().weight is full.get_input_embeddings().weight)
    positions, probe = torch.arange(512)[None], torch.empty(0)
    for a, b in zip(light.model.rotary_emb(probe, positions), full.model.rotary_emb(probe, positions)):
        assert torch.equal(a, b)
    assert light.generation_config.to_dict() == full.generation_config.to_dict()
    assert light.dtype == full.dtype == torch.float32


def test_other_families_keep_transformers_class():
    from transformers import AutoConfig

    for family in ("gemma3_text", "phi3", "mistral"):
        assert not gguf_skeleton.supported(AutoConfig.for_model(family))
    dynamic = AutoConfig.for_model("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    assert not gguf_skeleton.supported(dynamic)  # its tables change with the sequence length
    assert gguf_skeleton.supported(AutoConfig.for_model("qwen2"))


def test_loading_a_gguf_model_imports_no_modeling_code(tmp_path):
    if kernels.load() is None:
        pytest.skip("no C++ compiler: --dtype gguf needs the fused kernels")
    path = tiny(tmp_path, "qwen2")
    code = (
        "import sys, json\n"
        "from specdecode.backends import models\n"
        "from specdecode.backends.precision import GGUF\n"
        f"lm = models.load({path!r}, GGUF)\n"
        "lm.model.extend(__import__('torch').tensor([1, 2, 3]))\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    cache = tmp_path / "cache"  # the file's metadata apart, the kernels built once already (kernels.py)
    cache.mkdir()
    (cache / "kernels").symlink_to(kernels.cache_root(), target_is_directory=True)
    env = {**os.environ, "SPECDECODE_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    # transformers.models.auto's mappings name the model classes without importing their code
    model_code = re.compile(
        r"transformers\.modeling_utils$|transformers\.models\.(?!auto\.)\w+\.modeling_|torch\._dynamo"
    )
    assert [m for m in loaded if model_code.match(m)] == []
    assert model_code.match("transformers.models.qwen2.modeling_qwen2")  # what transformers' class imports
