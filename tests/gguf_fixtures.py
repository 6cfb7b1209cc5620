"""A tiny model (Llama, Qwen2/3, Phi-3, Gemma 3) written as a GGUF file with the `gguf` package, its
matrices in chosen block types: what `--dtype gguf` and `gguf-exact` are tested on. Q8_0/Q4_0/Q4_1
blocks quantize the seeded model's weights (gguf's own quantizer); the package has no Q4_K/Q6_K
quantizer, so those tensors are random valid blocks scaled to the same spread (the model's weights
are whatever the file says).
"""

from __future__ import annotations

import json

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

BLOCKS = {
    "Q4_K": (144, 256, [(0, 1e-3), (2, 1e-3)]),
    "Q6_K": (210, 256, [(208, 1.5e-4)]),
}  # bytes, weights, fp16 fields


def random_blocks(type_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random [rows, bytes] K-quant data whose fp16 scale fields hold small positive values."""
    size, per, halves = BLOCKS[type_name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // per, size), dtype=np.uint8)
    for offset, scale in halves:
        value = (scale * rng.uniform(0.5, 1.5, (rows, cols // per))).astype(np.float16)
        raw[..., offset : offset + 2] = value.view(np.uint8).reshape(rows, cols // per, 2)
    return raw.reshape(rows, -1)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF q/k rows -> llama.cpp's rotary layout (what convert_hf_to_gguf writes)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


ARCHS = {"llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3", "phi3": "PHI3", "gemma3_text": "GEMMA3"}


def write_tiny_gguf(path, hf_model, tokenizer, types: dict[str, str]) -> str:
    """hf_model (a causal LM of a family in ARCHS) -> a GGUF file at `path`, tensors named by the gguf
    package's map, as llama.cpp's converter writes them: q/k rows rotated for the llama architecture
    only, Gemma's norms stored as 1 + w, vectors (norms, biases) as F32, a tied LM head not repeated.
    types: tensor role ("attn_q", "attn_qkv", "ffn_down", "token_embd", "output", ...) -> type name;
    missing roles: Q8_0."""
    from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, get_tensor_name_map

    cfg = hf_model.config
    arch = MODEL_ARCH[ARCHS[cfg.model_type]]
    names = get_tensor_name_map(arch, cfg.num_hidden_layers)
    w = GGUFWriter(str(path), MODEL_ARCH_NAMES[arch])
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None)
    if head_dim:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if getattr(cfg, "sliding_window", None) and arch == MODEL_ARCH.GEMMA3:
        w.add_sliding_window(cfg.sliding_window)
    w.add_rope_freq_base(
        float(cfg.rope_parameters["rope_theta"])
        if getattr(cfg, "rope_parameters", None) and "rope_theta" in cfg.rope_parameters
        else float(getattr(cfg, "rope_theta", 10000.0))
    )
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
    w.add_pad_token_id(
        tokenizer.eos_token_id
    )  # transformers' Phi-3 default (32000) is outside a tiny vocabulary
    w.add_unk_token_id(tokenizer.eos_token_id)  # its Gemma tokenizer converter needs one
    w.add_chat_template(tokenizer.chat_template)

    heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
    for hf_name, tensor in hf_model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        a = tensor.detach().float().numpy()
        if a.ndim == 1:
            w.add_tensor(name, a + 1 if arch == MODEL_ARCH.GEMMA3 and name.endswith("norm.weight") else a)
            continue
        proj = hf_name.split(".")[-2]
        if arch == MODEL_ARCH.LLAMA and proj in heads:
            a = _permute(a, heads[proj])
        kind = types.get(name.removesuffix(".weight").split(".")[-1], "Q8_0")
        if kind in BLOCKS:
            w.add_tensor(name, random_blocks(kind, *a.shape, seed=len(name)), raw_dtype=T[kind])
        else:
            w.add_tensor(name, quants.quantize(a, T[kind]), raw_dtype=T[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
