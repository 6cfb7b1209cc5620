"""Memory estimate from model configs: weights, KV cache and the activations of one forward,
for target and drafter, and a measurement of the real peak to compare with.

Bytes per element come from the dtype. The estimate counts what specdecode actually allocates:
- weights: every parameter of the HF module, plus, for the FastLlama backend on CPU in fp32, the
  oneDNN-prepacked copy of each linear weight (same size again); with int8 quantization (quant.py)
  the decoder layers' linear weights take INT8_WEIGHT_BYTES each instead (and no prepacked fp32
  copy), while embeddings, norms and the LM head stay in the dtype (FastLlama still prepacks the head);
- KV cache: 2 (K and V) x layers x kv_heads x head_dim x positions x batch, where positions is the
  context rounded up to FastLlama's 256-position growth block, plus the tree/draft tokens in flight;
- activations: the larger of the prompt's prefill (n = context tokens, one pass, logits of the
  last only) and a verify step (n = k+1 or tree size, logits of all n in float32), each holding
  n x (4 hidden + 2 (heads + 2 kv_heads) head_dim + 3 intermediate) elements of layer
  intermediates (residual, norm, q|k|v and roped copies, attention output, gate|up, silu*up) plus
  the boolean attention mask n x positions.
Not modelled: the allocator's retained free blocks, oneDNN scratch, and library code (the measured
process peak reports them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specdecode.errors import UserError

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
BLOCK = 256
# bytes per int8 weight as torch's packed dynamic linear holds it: the int8 value plus fbgemm's
# blocking and per-channel scale, zero point and column offsets; measured 1.21 on 2048x4096 layers
INT8_WEIGHT_BYTES = 1.2


@dataclass
class Estimate:
    weights: int
    packed_weights: int
    kv_cache: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.packed_weights + self.kv_cache + self.activations

    def to_json(self) -> dict:
        return {"weights": self.weights, "packed_weights": self.packed_weights, "kv_cache": self.kv_cache,
                "activations": self.activations, "total": self.total}


def layer_linear_count(cfg) -> int:
    """Parameters of the decoder layers' linear layers (q, k, v, o, gate, up, down; biases included)."""
    h, inter, heads, kvh = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or h // heads
    attn = h * heads * d + 2 * h * kvh * d + heads * d * h
    if getattr(cfg, "attention_bias", False):
        attn += heads * d + 2 * kvh * d + h
    return cfg.num_hidden_layers * (attn + 3 * h * inter)


def param_count(cfg) -> tuple[int, int]:
    """(all parameters, parameters in linear layers that FastLlama prepacks) of a Llama-like config."""
    h, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    head = 0 if getattr(cfg, "tie_word_embeddings", False) else vocab * h
    linear = layer_linear_count(cfg)
    total = vocab * h + linear + layers * 2 * h + h + head  # embedding, layers with 2 norms, final norm
    return total, linear + vocab * h  # the LM head is packed even when tied


def estimate(cfg, *, dtype: str = "fp32", context: int = 2048, batch: int = 1, tokens_in_flight: int = 5,
             fast_backend: bool = True, quant: str = "none") -> Estimate:
    b = BYTES[dtype]
    total, linear = param_count(cfg)
    int8 = layer_linear_count(cfg) if quant == "int8" else 0
    heads, kvh, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    d = getattr(cfg, "head_dim", None) or h // heads
    positions = min(math.ceil((context + tokens_in_flight) / BLOCK) * BLOCK,
                    max(getattr(cfg, "max_position_embeddings", context), context))
    kv = 2 * cfg.num_hidden_layers * kvh * d * positions * batch * b
    per_token = (4 * h + 2 * (heads + 2 * kvh) * d + 3 * cfg.intermediate_size) * b
    verify_n, prefill_n = tokens_in_flight * batch, context * batch
    act = max(prefill_n * (per_token + positions) + cfg.vocab_size * 4 * batch,
              verify_n * (per_token + positions + cfg.vocab_size * 4))
    packed = (linear - int8) * b if (fast_backend and dtype == "fp32") else 0
    return Estimate(round((total - int8) * b + int8 * INT8_WEIGHT_BYTES), packed, kv, act)


def peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def fmt(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def current_rss_bytes() -> int:
    """Resident memory now (anonymous and file-backed: transformers keeps safetensors weights
    mmapped), after asking glibc to return freed heap memory to the OS, so that it counts live
    allocations rather than what the allocator keeps for reuse."""
    import ctypes
    import os

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def report(target: str | None, drafter: str, *, dtype: str, context: int, batch: int, k: int,
           backend: str = "auto", measure: bool = False, target_quant: str = "none",
           drafter_quant: str = "none") -> dict:
    import torch

    from specdecode import models
    from specdecode.fast_llama import SUPPORTED

    def est(spec, tokens, quant):
        cfg = models.load_config(spec)
        fast = backend != "hf" and cfg.model_type in SUPPORTED
        return cfg, estimate(cfg, dtype=dtype, context=context, batch=batch, tokens_in_flight=tokens,
                             fast_backend=fast, quant=quant)

    out = {"dtype": dtype, "context": context, "batch": batch, "k": k, "target_quant": target_quant,
           "drafter_quant": drafter_quant}
    _, out["target"] = est(target, k + 1, target_quant)
    draft_spec = drafter.partition(":")[2] if drafter.startswith("draft:") else None
    if draft_spec:
        _, out["draft"] = est(draft_spec, 1, drafter_quant)
    out["total"] = out["target"].total + (out["draft"].total if draft_spec else 0)
    if measure:
        if batch != 1:
            raise UserError("--measure runs one sequence; use --batch 1")
        before = current_rss_bytes()
        loaded = [models.load(target, dtype, "cpu", backend, target_quant)] + (
            [models.load(draft_spec, dtype, "cpu", backend, drafter_quant)] if draft_spec else [])
        for m, tokens in zip(loaded, [k + 1, 1]):
            m.model.reset()
            fill = max(1, min(context, m.model.max_length) - tokens)
            m.model.extend(torch.randint(0, m.model.vocab_size, (fill,)), num_logits=1)
            m.model.extend(torch.randint(0, m.model.vocab_size, (tokens,)))
        out["measured_resident"] = current_rss_bytes() - before
        out["measured_peak_process"] = peak_rss_bytes()
    return out


def render(rep: dict) -> str:
    lines = [f"memory estimate ({rep['dtype']}, context {rep['context']}, batch {rep['batch']}, k {rep['k']}):"]
    for name in ("target", "draft"):
        if name in rep:
            e = rep[name]
            quant = rep[f"{'target' if name == 'target' else 'drafter'}_quant"]
            name += " (int8 linears)" if quant == "int8" else ""
            lines.append(f"  {name}: weights {fmt(e.weights)} + prepacked {fmt(e.packed_weights)} + KV cache "
                         f"{fmt(e.kv_cache)} + activations {fmt(e.activations)} = {fmt(e.total)}")
    lines.append(f"  total estimate: {fmt(rep['total'])}")
    if "measured_resident" in rep:
        err = (rep["measured_resident"] - rep["total"]) / rep["total"] * 100
        lines.append(f"  measured: resident growth {fmt(rep['measured_resident'])} ({err:+.0f}% vs estimate), "
                     f"process peak {fmt(rep['measured_peak_process'])} (includes load-time copies and libraries)")
    return "\n".join(lines)
