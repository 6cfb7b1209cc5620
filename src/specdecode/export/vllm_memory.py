"""Memory per GPU of an exported vLLM deployment, from the configs and the exported checkpoints.

vLLM (v0.32.0) loads the weights, profiles one forward pass, then gives what is left of
gpu_memory_utilization x GPU memory to KV-cache blocks. Per GPU, with tensor parallelism t:

- target weights: parameters x bytes / t (linear layers, embedding and LM head are sharded; the
  replicated norms are negligible);
- drafter weights: the exported checkpoint's floating-point parameters x bytes, divided by the
  draft's tensor parallelism (draft_model: draft_tensor_parallel_size, default t; the medusa and
  eagle3 heads run on the target's TP group);
- KV cache per token: 2 (K, V) x layers x max(1, kv_heads / t) x head_dim x bytes (vLLM replicates
  KV heads when t exceeds them), for the target, plus the draft model's layers (draft_model) or the
  EAGLE head's one layer (eagle3); medusa and ngram keep no KV cache.

KV capacity = (utilization x GPU memory - weights) / KV per token. Activations, the sampler and
CUDA graphs (what vLLM's profiling run measures) are not modelled: it is an upper bound.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from specdecode.decoding.memory import fmt, param_count

BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}  # vllm serve --dtype
VLLM_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
GIB = 2**30


@dataclass
class Shape:
    """What the estimate needs of a model: parameters, layers with a KV cache, their KV heads and head
    size."""

    params: int
    kv_layers: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, cfg) -> "Shape":
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(param_count(cfg)[0], cfg.num_hidden_layers, cfg.num_key_value_heads, head_dim)

    def kv_per_token(self, tp: int, nbytes: int) -> int:
        return 2 * self.kv_layers * max(1, self.kv_heads // tp) * self.head_dim * nbytes


def _checkpoint_shape(directory: Path, with_kv: bool) -> Shape:
    """An exported head (medusa, eagle3): floating-point parameters of model.safetensors; eagle3 has one
    attention layer with a KV cache."""
    from safetensors import safe_open

    params = 0
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        for name in f.keys():
            t = f.get_slice(name)
            if t.get_dtype() in ("BF16", "F16", "F32"):
                params += math.prod(t.get_shape())
    if not with_kv:
        return Shape(params, 0, 1, 0)
    cfg = json.loads((directory / "config.json").read_text())
    return Shape(params, cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"])


def _head(with_kv: bool):
    """An exported head runs on the target's tensor-parallel group."""
    return lambda spec, tp: (_checkpoint_shape(Path(spec["model"]), with_kv), tp)


def _draft_model(spec: dict, tp: int) -> tuple[Shape, int]:
    from specdecode.backends import models

    return Shape.of(models.load_config(spec["model"])), spec.get("draft_tensor_parallel_size", tp)


DRAFTERS = {"medusa": _head(with_kv=False), "eagle3": _head(with_kv=True), "draft_model": _draft_model}
NO_DRAFTER = Shape(0, 0, 1, 0)  # ngram, or plain decoding


def estimate(
    target_cfg,
    speculative_config: dict | None,
    *,
    tp: int,
    dtype: str,
    gpu_gib: float,
    utilization: float,
    max_model_len: int | None,
) -> dict:
    """The deployment's memory per GPU (bytes) and its KV capacity (tokens, and sequences of
    max_model_len)."""
    nbytes, target = BYTES[dtype], Shape.of(target_cfg)
    method = (speculative_config or {}).get("method")
    drafter, draft_tp = DRAFTERS[method](speculative_config, tp) if method in DRAFTERS else (NO_DRAFTER, tp)
    weights = target.params * nbytes // tp
    drafter_weights = drafter.params * nbytes // draft_tp
    kv_target, kv_drafter = target.kv_per_token(tp, nbytes), drafter.kv_per_token(draft_tp, nbytes)
    free = utilization * gpu_gib * GIB - weights - drafter_weights
    tokens = max(0, int(free // (kv_target + kv_drafter)))
    max_len = max_model_len or getattr(target_cfg, "max_position_embeddings", None)
    return {
        "per_gpu": True,
        "tensor_parallel_size": tp,
        "dtype": dtype,
        "gpu_memory_gib": gpu_gib,
        "gpu_memory_utilization": utilization,
        "target_weights": weights,
        "drafter_weights": drafter_weights,
        "kv_cache_per_token": {"target": kv_target, "drafter": kv_drafter},
        "kv_cache_tokens": tokens,
        "max_model_len": max_len,
        "sequences_at_max_model_len": tokens // max_len if max_len else None,
        "fits": free > 0,
        "not_modelled": (
            "activations, sampler and CUDA graphs (vLLM's profiling run): the capacity is an upper bound"
        ),
    }


def render(mem: dict) -> str:
    kv = mem["kv_cache_per_token"]
    line = (
        f"memory per GPU (tp={mem['tensor_parallel_size']}, {mem['dtype']}): target weights "
        f"{fmt(mem['target_weights'])}, drafter weights {fmt(mem['drafter_weights'])}, KV cache "
        f"{(kv['target'] + kv['drafter']) / 1024:.1f} KiB/token (drafter {kv['drafter'] / 1024:.1f}); "
    )
    if not mem["fits"]:
        return line + (
            f"the weights do not fit in {mem['gpu_memory_utilization']} x {mem['gpu_memory_gib']} GiB: "
            "raise --tensor-parallel-size"
        )
    seqs = mem["sequences_at_max_model_len"]
    return line + (
        f"at {mem['gpu_memory_utilization']} x {mem['gpu_memory_gib']} GiB at most "
        f"{mem['kv_cache_tokens']:,} "
        "tokens of KV cache"
        + (f" ({seqs} sequences of {mem['max_model_len']})" if seqs is not None else "")
        + ", before activations and CUDA graphs"
    )
