"""A tiny Llama written as a GGUF file with the `gguf` package, its matrices in chosen block types:
what `--dtype gguf` and `gguf-exact` are tested on. Q8_0/Q4_0/Q4_1 blocks quantize the seeded model's weights (gguf's
own quantizer); the package has no Q4_K/Q6_K quantizer, so those tensors are random valid blocks
scaled to the same spread (the model's weights are whatever the file says).
"""

from __future__ import annotations

import json

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

BLOCKS = {"Q4_K": (144, 256, [(0, 1e-3), (2, 1e-3)]), "Q6_K": (210, 256, [(208, 1.5e-4)])}  # bytes, weights, fp16 fields


def random_blocks(type_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random [rows, bytes] K-quant data whose fp16 scale fields hold small positive values."""
    size, per, halves = BLOCKS[type_name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // per, size), dtype=np.uint8)
    for offset, scale in halves:
        value = (scale * rng.uniform(0.5, 1.5, (rows, cols // per))).astype(np.float16)
        raw[..., offset:offset + 2] = value.view(np.uint8).reshape(rows, cols // per, 2)
    return raw.reshape(rows, -1)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF q/k rows -> llama.cpp's rotary layout (what convert_hf_to_gguf writes)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(path, hf_model, tokenizer, types: dict[str, str]) -> str:
    """hf_model (a Llama or Qwen2 causal LM, untied LM head) -> a GGUF file at `path`. types: GGUF
    tensor role ("attn_q", "ffn_down", "token_embd", "output", ...) -> type name; missing roles: Q8_0.
    As llama.cpp's converter: q/k rows rotated for the llama architecture only; biases as F32."""
    cfg = hf_model.config
    arch = cfg.model_type
    w = GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]) if getattr(cfg, "rope_parameters", None)
                         else float(cfg.rope_theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    vocab = tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    specials = set(tokenizer.all_special_tokens)
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_chat_template(tokenizer.chat_template)

    def put(name: str, role: str, weight, heads: int = 0):
        a = weight.detach().float().numpy()
        if heads and arch == "llama":
            a = _permute(a, heads)
        kind = types.get(role, "Q8_0")
        if kind in BLOCKS:
            w.add_tensor(name, random_blocks(kind, *a.shape, seed=len(name)), raw_dtype=T[kind])
        else:
            w.add_tensor(name, quants.quantize(a, T[kind]), raw_dtype=T[kind])

    put("token_embd.weight", "token_embd", hf_model.model.embed_tokens.weight)
    put("output.weight", "output", hf_model.lm_head.weight)
    w.add_tensor("output_norm.weight", hf_model.model.norm.weight.detach().numpy())
    for i, layer in enumerate(hf_model.model.layers):
        b, attn, mlp = f"blk.{i}.", layer.self_attn, layer.mlp
        w.add_tensor(b + "attn_norm.weight", layer.input_layernorm.weight.detach().numpy())
        w.add_tensor(b + "ffn_norm.weight", layer.post_attention_layernorm.weight.detach().numpy())
        put(b + "attn_q.weight", "attn_q", attn.q_proj.weight, cfg.num_attention_heads)
        put(b + "attn_k.weight", "attn_k", attn.k_proj.weight, cfg.num_key_value_heads)
        put(b + "attn_v.weight", "attn_v", attn.v_proj.weight)
        for name in ("q", "k", "v"):
            bias = getattr(attn, f"{name}_proj").bias
            if bias is not None:
                w.add_tensor(f"{b}attn_{name}.bias", bias.detach().numpy())
        put(b + "attn_output.weight", "attn_output", attn.o_proj.weight)
        put(b + "ffn_gate.weight", "ffn_gate", mlp.gate_proj.weight)
        put(b + "ffn_up.weight", "ffn_up", mlp.up_proj.weight)
        put(b + "ffn_down.weight", "ffn_down", mlp.down_proj.weight)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
