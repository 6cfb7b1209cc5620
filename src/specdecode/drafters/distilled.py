"""`draft` (no argument) and `draft:DIR` for a checkpoint of `specdecode train draft`: a small
draft model distilled from the target (DistillSpec: Zhou et al. 2024, "DistillSpec: Improving
Speculative Decoding via Knowledge Distillation").

The checkpoint holds only what differs from the target: n decoder layers and the final norm. The
model is rebuilt as the target's own architecture (Llama, Qwen, Gemma 3, Phi-3...) with n layers and
the target's own embedding and LM head, then drafts like any other draft model (drafters/__init__.py
wraps it).
`specdecode train draft` also writes a complete Hugging Face model directory (`DIR/hf`) for other tools.
"""

from __future__ import annotations

import torch


def is_checkpoint(spec: str | None) -> bool:
    import json
    from pathlib import Path

    if not spec:
        return True
    config = Path(spec).expanduser() / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("kind") == "draft"


def build_model(target, num_layers: int, tensors: dict | None = None):
    """The model class of `target` (a CausalLM) with `num_layers` layers (the first `num_layers` of its
    layer kinds), sharing the target's embedding and LM head (one matrix when the target ties them; a
    GGUF target's, which its HF module does not hold, dequantized).
    tensors: {"layers.i.…", "norm.weight"} from a checkpoint, or None to leave the layers as initialised."""
    target_hf = target.hf
    overrides = {"num_hidden_layers": num_layers}
    if isinstance(getattr(target_hf.config, "layer_types", None), list):
        overrides["layer_types"] = target_hf.config.layer_types[:num_layers]
    cfg = type(target_hf.config)(**{**target_hf.config.to_dict(), **overrides})
    from transformers import AutoModelForCausalLM  # the target's class (a GGUF target's skeleton is not one)

    model = AutoModelForCausalLM.from_config(cfg).to(dtype=target_hf.dtype, device=target.device)
    embed, head = target.embedding.weight(), target.output_weight()
    model.model.embed_tokens.weight = _parameter(embed)
    model.lm_head.weight = model.model.embed_tokens.weight if head is embed else _parameter(head)
    if tensors is not None:
        state = {k: v.to(target_hf.dtype) for k, v in tensors.items()}
        model.model.load_state_dict(state, strict=False)
    model.generation_config = target_hf.generation_config
    return model.eval()


def _parameter(weight: torch.Tensor) -> torch.nn.Parameter:
    """The target's own parameter (shared), or dequantized weights made one."""
    if isinstance(weight, torch.nn.Parameter):
        return weight
    return torch.nn.Parameter(weight, requires_grad=False)


def num_layers(spec: str | None) -> int:
    """The decoder layers of a distilled checkpoint (None: the shipped one), read from its config."""
    import json
    from pathlib import Path

    from specdecode.backends.checkpoint import SHIPPED

    directory = Path(spec).expanduser() if spec else SHIPPED / "draft"
    return int(json.loads((directory / "config.json").read_text())["num_layers"])


def load(spec: str | None, ctx):
    """The distilled draft model (a CausalLM over the target's embedding) for the target in ctx."""
    from specdecode.backends import checkpoint, models, quant

    quant.check(ctx.quant, ctx.precision, ctx.device)
    tensors, config = checkpoint.load(spec, "draft", ctx.target)
    hf = build_model(ctx.target.model, config["num_layers"], tensors)
    int8 = ctx.target.model.int8_activations  # beside a --dtype gguf target: its 8-bit path
    if ctx.quant == "int8" and not int8:
        quant.quantize(hf)
    return models.wrap(hf, ctx.backend, int8)
