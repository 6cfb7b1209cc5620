"""A GGUF model's skeleton without transformers' modeling code, for the families whose layers and
rotary embedding are plain (Llama, Qwen2, Qwen3 with RoPE that no sequence length changes): the
module tree FastLlama and gguf_model.FileWeights read, its parameters named as transformers names
them (the `gguf` package's name map finds the file's tensors by those names), its linears, LM head and
token embedding on the meta device, and its rotary tables computed as transformers' own
`LlamaRotaryEmbedding` computes them (Qwen2's and Qwen3's are the same code).

Importing transformers' modeling code for a skeleton whose weights are the file's pulled in ~1,700
modules: 136 MB resident and 1.5 s at start (SmolLM2-135M: a quarter of its resident memory after
loading). Other families (Phi-3's long RoPE, Gemma 3's local and global tables) keep transformers'
classes (gguf_model.skeleton).
"""

from __future__ import annotations

import torch
from torch import nn

LIGHT = {"llama", "qwen2", "qwen3"}
PLAIN_ROPE = {"default", "linear", "llama3", "yarn"}  # cos/sin fixed per position (no dynamic update)


def supported(config) -> bool:
    """Whether SkeletonLM stands in for `config`'s transformers class."""
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    return config.model_type in LIGHT and rope in PLAIN_ROPE


def _meta(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device="meta"), requires_grad=False)


class _Linear(nn.Linear):
    """An nn.Linear whose weight (and bias) are meta tensors, never initialised: initialising meta
    tensors goes through torch's Python references, whose import pulls in torch._dynamo (25 MB)."""

    def __init__(self, n_in: int, n_out: int, bias: bool):
        nn.Module.__init__(self)
        self.in_features, self.out_features = n_in, n_out
        self.weight = _meta(n_out, n_in)
        self.bias = _meta(n_out) if bias else None


class RMSNorm(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n), requires_grad=False)


class Attention(nn.Module):
    def __init__(self, config, head_dim: int):
        super().__init__()
        qwen2 = config.model_type == "qwen2"  # q|k|v biases always, none on o
        qkv_bias, o_bias = (True, False) if qwen2 else (config.attention_bias, config.attention_bias)
        h, kv, hidden = config.num_attention_heads, config.num_key_value_heads, config.hidden_size
        self.q_proj = _Linear(hidden, h * head_dim, qkv_bias)
        self.k_proj = _Linear(hidden, kv * head_dim, qkv_bias)
        self.v_proj = _Linear(hidden, kv * head_dim, qkv_bias)
        self.o_proj = _Linear(h * head_dim, hidden, o_bias)
        if config.model_type == "qwen3":  # each head's q and k RMS-normed
            self.q_norm, self.k_norm = RMSNorm(head_dim), RMSNorm(head_dim)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        bias, hidden, inner = getattr(config, "mlp_bias", False), config.hidden_size, config.intermediate_size
        self.gate_proj = _Linear(hidden, inner, bias)
        self.up_proj = _Linear(hidden, inner, bias)
        self.down_proj = _Linear(inner, hidden, bias)


class DecoderLayer(nn.Module):
    def __init__(self, config, head_dim: int):
        super().__init__()
        self.self_attn = Attention(config, head_dim)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size)


class Rotary(nn.Module):
    """transformers' LlamaRotaryEmbedding for the PLAIN_ROPE types: (cos, sin) [B, P, head_dim] of
    position_ids [B, P], in x's dtype."""

    def __init__(self, config, head_dim: int):
        super().__init__()
        params = config.rope_parameters
        if params["rope_type"] == "default":
            base = params["rope_theta"]
            inv_freq, self.attention_scaling = (
                1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)),
                1.0,
            )
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class SkeletonLM(nn.Module):
    """What FastLlama reads of a transformers causal LM (`config`, `model.layers`, `model.norm`,
    `model.rotary_emb`, the input and output embeddings, `dtype`, `generation_config`, `tie_weights`),
    in float32."""

    def __init__(self, config):
        super().__init__()
        from transformers import GenerationConfig

        self.config = config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=_meta(config.vocab_size, config.hidden_size)
        )
        self.model.layers = nn.ModuleList(
            DecoderLayer(config, head_dim) for _ in range(config.num_hidden_layers)
        )
        self.model.norm = RMSNorm(config.hidden_size)
        self.model.rotary_emb = Rotary(config, head_dim)
        self.lm_head = _Linear(config.hidden_size, config.vocab_size, False)
        self.generation_config = GenerationConfig.from_model_config(config)

    def tie_weights(self) -> None:
        """The LM head is the token embedding (config.tie_word_embeddings)."""
        self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head
