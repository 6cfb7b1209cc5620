"""Our drafter checkpoints in the layouts vLLM loads (targets vLLM v0.32.0; the facts, with the
vLLM source files they come from, are recorded in tests/fixtures/vllm/*_checkpoint.json).

Each function maps (our tensors, our config, what it needs from the target) -> (tensors, config.json)
and refuses, naming the mismatch, what vLLM would load differently from what we trained:

- Medusa: exact. vLLM 0.32 registers token_map as a parameter while loading and never reports it
  loaded, so its weight-tracking check fails on any truncated vocabulary; a full-vocabulary export
  would avoid it but change the drafts (our heads argmax over the draft vocabulary), so the
  exporter keeps token_map and the serve command turns the check off (MEDUSA_SERVER_ARGS).
  Our head i is z = h + SiLU(W_i h + b_i) followed by the target's LM head restricted
  to a draft vocabulary: vLLM's ResidualBlock with one layer and a bias (medusa_fc_bias), one shared
  lm_head (original_lm_head) holding the target's LM-head rows of our token map (truncated_vocab_size,
  token_map). vLLM feeds it the target's last hidden state after the final norm, as we do.
- EAGLE-3: exact, with three renamings. Our fused q|k|v and gate|up matrices are split into
  q/k/v_proj and gate/up_proj; the draft vocabulary becomes lm_head = the target's LM-head rows of
  the token map and d2t = token_map - arange (vLLM adds d2t[i] to draft id i); our capture of layer
  l's output is vLLM's aux layer id l + 1 (vLLM captures the residual stream before layer id).
  Refused: not exactly 3 fused layers (vLLM's fc takes 3·hidden), the last layer (we capture it after
  the final norm, vLLM never does), a target whose vLLM class lacks the EAGLE-3 interface. The
  variant switches vLLM 0.32 reads are written as our head computes them: no norm before fc
  (norm_before_fc, fc_norm), the pre-norm output fed to the next draft step (norm_output false),
  unscaled logits (logit_scale 1). `speculators` writes the same head in the speculators format
  (speculators_config naming the verifier), so that `vllm serve <that directory>` finds the method,
  the target and k by itself.
- Distilled draft: exact. A Llama with the target's configuration, n layers and the target's
  (tied) embedding, in Hugging Face layout; vLLM runs it with method draft_model.

Weights are written in bf16 (as our checkpoints), index maps in int64. config.json carries rope_theta
and rope_scaling (transformers 4) as well as rope_parameters (transformers 5): a vLLM environment
that reads only the former would otherwise fall back to the default θ.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from specdecode.errors import UserError

VLLM_VERSION = "v0.32.0"
MEDUSA_SERVER_ARGS = ("--model-loader-extra-config", '{"enable_weights_track":false}')
# target architectures whose vLLM 0.32 class implements SupportsEagle3 (model_executor/models/*.py,
# through base classes; the gpu/cpu model runner refuses aux hidden states to any other)
EAGLE3_TARGETS = frozenset(
    """AfmoeForCausalLM ApertusForCausalLM Cohere2MoeForCausalLM DeepseekForCausalLM DeepseekV2ForCausalLM
    DeepseekV3ForCausalLM Ernie4_5ForCausalLM Gemma4ForCausalLM GlmMoeDsaForCausalLM GptOssForCausalLM
    GraniteForCausalLM K2HorizonForCausalLM LagunaForCausalLM Llama4ForCausalLM LlamaForCausalLM
    MiMoForCausalLM MiMoV2FlashForCausalLM MiMoV2ForCausalLM MiniCPM3ForCausalLM MiniCPMForCausalLM
    MiniMaxM2ForCausalLM MistralForCausalLM MistralLarge3ForCausalLM NemotronHForCausalLM Phi3ForCausalLM
    Plamo3ForCausalLM Qwen2ForCausalLM Qwen3ForCausalLM Qwen3MoeForCausalLM Qwen3NextForCausalLM
    Qwen3_5ForCausalLM Qwen3_5MoeForCausalLM SarvamMLAForCausalLM Step1ForCausalLM TeleChat2ForCausalLM
    TeleFLMForCausalLM""".split()
)
# how our EAGLE head computes (drafters/eagle_head.py), in vLLM 0.32's llama_eagle3.py switches
EAGLE3_VARIANT = {
    "norm_before_residual": False,  # the residual is the fused feature g itself
    "norm_before_fc": False,  # fc reads the raw concatenated target layers
    "fc_norm": False,  # no per-layer norm of the three chunks either
    "norm_output": False,  # later draft steps get the pre-norm output o
    "logit_scale": 1.0,
}
EXPORT_INFO = {"exported_by": "specdecode export vllm", "vllm_version": VLLM_VERSION}


def rope_fields(target_cfg: dict) -> dict:
    """RoPE settings of a target config (either transformers convention) in both conventions."""
    params = dict(target_cfg.get("rope_parameters") or {})
    theta = params.pop("rope_theta", None) or target_cfg.get("rope_theta") or 10000.0
    scaling = target_cfg.get("rope_scaling")
    if params and params.get("rope_type", "default") != "default":
        scaling = params
    out = {"rope_theta": float(theta), "rope_scaling": scaling}
    if "rope_parameters" in target_cfg:
        out["rope_parameters"] = target_cfg["rope_parameters"]
    return out


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.bfloat16).contiguous()


def _check_token_map(token_map: torch.Tensor, vocab_size: int, what: str) -> torch.Tensor:
    token_map = token_map.long().cpu()
    if token_map.numel() and (
        int(token_map.min()) < 0
        or int(token_map.max()) >= vocab_size
        or token_map.unique().numel() != token_map.numel()
    ):
        raise UserError(f"{what}: the token map is not a set of distinct target token ids")
    return token_map


def medusa(tensors: dict, config: dict, lm_head: torch.Tensor) -> tuple[dict, dict]:
    """tensors: weight [K, H, H], bias [K, H], token_map [Vd]; lm_head: the target's [V, H]."""
    vocab_size, hidden = lm_head.shape
    token_map = _check_token_map(tensors["token_map"], vocab_size, "medusa")
    weight, bias = tensors["weight"], tensors["bias"]
    out = {}
    for i in range(weight.shape[0]):
        out[f"blocks.{i}.layers.0.weight"] = _bf16(weight[i])  # [H, H]
        out[f"blocks.{i}.layers.0.bias"] = _bf16(bias[i])  # [H]
    out["lm_heads.0.weight"] = _bf16(lm_head[token_map])  # [Vd, H], shared by all heads
    out["token_map"] = token_map.clone()
    cfg = {
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": hidden,
        "vocab_size": vocab_size,
        "num_heads": int(weight.shape[0]),
        "num_hidden_layers": 1,
        "truncated_vocab_size": int(token_map.numel()),
        "medusa_fc_bias": True,
        "original_lm_head": True,
        "torch_dtype": "bfloat16",
        "specdecode": {**EXPORT_INFO, "target": config.get("target")},
    }
    return out, cfg


def eagle3(tensors: dict, config: dict, lm_head: torch.Tensor, target_cfg: dict) -> tuple[dict, dict]:
    """tensors: our EagleHead state (fuse, qkv, o, gate_up, down, norm_*) + token_map [Vd]."""
    layers, num_layers = list(config["layers"]), target_cfg["num_hidden_layers"]
    if len(layers) != 3:
        raise UserError(
            f"the eagle head fuses {len(layers)} target layers {layers}; vLLM's EAGLE-3 "
            "(llama_eagle3.py) fuses exactly 3 (fc: 3·hidden -> hidden). Retrain with "
            "`specdecode train eagle --set layers=A,B,C`"
        )
    if layers != sorted(set(layers)):
        raise UserError(
            f"the eagle head's layers {layers} are not increasing; vLLM concatenates them in layer order"
        )
    if layers[-1] >= num_layers - 1:
        raise UserError(
            f"the eagle head reads the target's last layer ({layers[-1]}), which specdecode captures "
            "after the final norm; vLLM's aux hidden states are the residual stream before a layer, "
            "so it cannot feed that feature. Retrain with layers below the last"
        )
    arch = (target_cfg.get("architectures") or ["?"])[0]
    if arch not in EAGLE3_TARGETS:
        raise UserError(
            f"vLLM {VLLM_VERSION} runs EAGLE-3 heads only on targets whose model class has its EAGLE-3 "
            f"interface (LlamaForCausalLM, Qwen3ForCausalLM, ...), not {arch}"
        )
    vocab_size, hidden = lm_head.shape
    h, kvh, d = config["heads"], config["kv_heads"], config["head_dim"]
    token_map = _check_token_map(tensors["token_map"], vocab_size, "eagle")
    q, k, v = tensors["qkv.weight"].split([h * d, kvh * d, kvh * d], dim=0)  # each [*, 2H]
    gate, up = tensors["gate_up.weight"].chunk(2, dim=0)  # each [I, H]
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[token_map] = True
    out = {
        "fc.weight": tensors["fuse.weight"],  # [H, 3H]
        "midlayer.input_layernorm.weight": tensors["norm_emb"],
        "midlayer.hidden_norm.weight": tensors["norm_feat"],
        "midlayer.self_attn.q_proj.weight": q,
        "midlayer.self_attn.k_proj.weight": k,
        "midlayer.self_attn.v_proj.weight": v,
        "midlayer.self_attn.o_proj.weight": tensors["o.weight"],
        "midlayer.post_attention_layernorm.weight": tensors["norm_mlp"],
        "midlayer.mlp.gate_proj.weight": gate,
        "midlayer.mlp.up_proj.weight": up,
        "midlayer.mlp.down_proj.weight": tensors["down.weight"],
        "norm.weight": tensors["norm_out"],
        "lm_head.weight": lm_head[token_map],  # [Vd, H]
    }
    out = {name: _bf16(t) for name, t in out.items()}
    out["d2t"] = token_map - torch.arange(token_map.numel())  # target id = draft id + d2t[draft id]
    out["t2d"] = t2d
    aux = [layer + 1 for layer in layers]  # vLLM id j = the output of layer j - 1
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": config["intermediate"],
        "num_attention_heads": h,
        "num_key_value_heads": kvh,
        "head_dim": d,
        "num_hidden_layers": 1,
        "rms_norm_eps": config["eps"],
        "hidden_act": "silu",
        "vocab_size": vocab_size,
        "draft_vocab_size": int(token_map.numel()),
        "target_hidden_size": hidden,
        "max_position_embeddings": target_cfg["max_position_embeddings"],
        **rope_fields(target_cfg),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        **EAGLE3_VARIANT,
        "eagle_aux_hidden_state_layer_ids": aux,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
        "torch_dtype": "bfloat16",
        "specdecode": {**EXPORT_INFO, "target": config.get("target"), "layers": layers},
    }
    return out, cfg


def speculators(eagle3_cfg: dict, verifier: str, verifier_architectures: list, k: int) -> dict:
    """An exported EAGLE-3 config.json -> the same head's config in the speculators format, which vLLM
    0.32 reads as: method from speculators_model_type, target from speculators_config.verifier, k from
    the first proposal method (transformers_utils/configs/speculators/). No top-level model_type: vLLM
    recognises the format by its absence and the presence of speculators_config."""
    top = {"draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", *EAGLE3_VARIANT}
    layer = {
        key: v
        for key, v in eagle3_cfg.items()
        if key not in top | {"architectures", "eagle_config", "specdecode", "torch_dtype"}
    }
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {**layer, "logit_scale": EAGLE3_VARIANT["logit_scale"]},
        **{key: eagle3_cfg[key] for key in sorted(top) if key != "logit_scale"},
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k}],
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures},
        },
        "torch_dtype": "bfloat16",
        "specdecode": eagle3_cfg["specdecode"],
    }


def draft(
    tensors: dict, config: dict, embedding: torch.Tensor, lm_head: torch.Tensor, target_cfg: dict
) -> tuple[dict, dict]:
    """tensors: layers.{i}.* and norm.weight of a distilled draft (the target's own architecture);
    embedding, lm_head: the target's [V, H] (one matrix when it ties them)."""
    out = {"model.embed_tokens.weight": _bf16(embedding)}
    tied = lm_head is embedding or lm_head.data_ptr() == embedding.data_ptr()
    if not tied:
        out["lm_head.weight"] = _bf16(lm_head)
    out.update({f"model.{name}": _bf16(t) for name, t in tensors.items()})
    n = config["num_layers"]
    cfg = {k: v for k, v in target_cfg.items() if not k.startswith("_")}
    cfg.update(
        architectures=target_cfg.get("architectures") or ["LlamaForCausalLM"],
        num_hidden_layers=n,
        tie_word_embeddings=tied,
        torch_dtype="bfloat16",
        dtype="bfloat16",
        **rope_fields(target_cfg),
        specdecode={**EXPORT_INFO, "target": config.get("target")},
    )
    if isinstance(cfg.get("layer_types"), list):
        cfg["layer_types"] = cfg["layer_types"][:n]
    return out, cfg


def save(directory: Path, tensors: dict, config: dict) -> None:
    """model.safetensors and config.json (config last: a directory with a config has its weights)."""
    from safetensors.torch import save_file

    from specdecode.files import write_atomic

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    write_atomic(
        directory / "model.safetensors", lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"})
    )
    write_atomic(
        directory / "config.json", lambda tmp: Path(tmp).write_text(json.dumps(config, indent=1) + "\n")
    )
