"""Memory estimate from model configs: weights, KV cache and the activations of one forward,
for target and drafter, and a measurement of the real peak to compare with.

Bytes per element come from the precision (fp32, bf16, fp16; not GGUF blocks). The estimate counts
what specdecode actually allocates:
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

from specdecode.backends.embedding import CACHED_ROWS
from specdecode.backends.precision import FLOATS, FP32, Precision
from specdecode.errors import UserError

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
        return {
            "weights": self.weights,
            "packed_weights": self.packed_weights,
            "kv_cache": self.kv_cache,
            "activations": self.activations,
            "total": self.total,
        }


def layer_linear_count(cfg) -> int:
    """Parameters of the decoder layers' linear layers (q, k, v, o, gate, up, down; biases included)."""
    h, inter, heads, kvh = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
    )
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


def weight_bytes(precision: Precision) -> int:
    """Bytes per weight element; a clear error for a precision the estimate does not model (GGUF blocks)."""
    if precision.weight_bytes is None:
        raise UserError(f"unknown dtype {str(precision)!r}; choose one of {', '.join(map(str, FLOATS))}")
    return precision.weight_bytes


def estimate(
    cfg,
    *,
    precision: Precision = FP32,
    context: int = 2048,
    batch: int = 1,
    tokens_in_flight: int = 5,
    fast_backend: bool = True,
    quant: str = "none",
) -> Estimate:
    b = weight_bytes(precision)
    total, linear = param_count(cfg)
    int8 = layer_linear_count(cfg) if quant == "int8" else 0
    heads, kvh, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    d = getattr(cfg, "head_dim", None) or h // heads
    positions = min(
        math.ceil((context + tokens_in_flight) / BLOCK) * BLOCK,
        max(getattr(cfg, "max_position_embeddings", context), context),
    )
    kv = 2 * cfg.num_hidden_layers * kvh * d * positions * batch * b
    per_token = (4 * h + 2 * (heads + 2 * kvh) * d + 3 * cfg.intermediate_size) * b
    verify_n, prefill_n = tokens_in_flight * batch, context * batch
    act = max(
        prefill_n * (per_token + positions) + cfg.vocab_size * 4 * batch,
        verify_n * (per_token + positions + cfg.vocab_size * 4),
    )
    packed = (linear - int8) * b if (fast_backend and precision == FP32) else 0
    return Estimate(round((total - int8) * b + int8 * INT8_WEIGHT_BYTES), packed, kv, act)


# --dtype gguf (tile.h's layout) per 16 rows x 32 inputs of each file format: (quant bytes, scale bytes).
# K-quants keep their factors (FACTORED bytes per 16 rows x 256 inputs); Q4_0/Q4_1 two float16 scales a
# block, Q5_0/Q8_0 one (gguf_weights.Interleaved._compact). A format without a kernel runs as float32.
TILE_BYTES = {
    "Q4_0": (256, 64),
    "Q4_1": (256, 64),
    "Q5_0": (320, 32),
    "Q8_0": (512, 32),
    "Q4_K": (256, 40),
    "Q6_K": (384, 40),
}
# what a gguf process holds besides its weights, KV, activations and tokenizer, measured on Zen 3 with
# torch 2.13 and transformers 5 (VmRSS): Python, torch, transformers and specdecode imported (365 MB),
# the modules a GGUF load imports (+54 MB); `serve` adds its web stack.
RUNTIME_BYTES = {"api": 419 << 20, "serve": 460 << 20}


# matrices one linear runs as one call (backends/gguf_model.FileWeights.layer): when their formats differ
# yet share a kernel family, they are joined before packing, into the widest weights of the two, and
# scales in float32 where a K-quant's factors are lost, else float16 (gguf_weights._compact)
FUSED = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))
FAMILY = {"Q4_0": "q4", "Q4_1": "q4", "Q4_K": "q4", "Q5_0": "q8", "Q8_0": "q8", "Q6_K": "q8"}


def _joined(kinds: set[str]) -> tuple[int, int]:
    """(quant, scale) bytes per 16 rows x 32 inputs of matrices of these formats joined in one call."""
    quant = max(TILE_BYTES[k][0] for k in kinds)
    if kinds & {"Q4_K", "Q6_K"}:
        return quant, 128
    return quant, 32 if kinds <= {"Q5_0", "Q8_0"} else 64


def gguf_weight_bytes(path) -> int:
    """Resident bytes of a GGUF file's weights at --dtype gguf: its matrices in tile.h's layout (the LM
    head too, tied or not), small tensors and formats without a tile kernel as float32; the token
    embedding stays in the file's mapping (rows read on lookup: not counted) but for the rows last
    looked up, kept as float32 (embedding.CACHED_ROWS)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from specdecode.backends.gguf_file import read

    _, tensors = read(path)
    joined = {}  # members of a fused group whose formats differ within a family -> their layout
    for name in tensors:
        for group in FUSED:
            if name.endswith(f".{group[0]}.weight"):
                layer = name[: -len(group[0]) - 7]
                members = [f"{layer}{g}.weight" for g in group if f"{layer}{g}.weight" in tensors]
                kinds = [tensors[m][0] for m in members]
                for family in {FAMILY.get(k) for k in kinds} - {None}:
                    same = [m for m, k in zip(members, kinds) if FAMILY.get(k) == family]
                    if len({tensors[m][0] for m in same}) > 1:
                        joined.update(dict.fromkeys(same, _joined({tensors[m][0] for m in same})))
    total = 0
    for name, (kind, raw) in tensors.items():
        rows = raw.shape[0]
        per_block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
        floats = kind in ("F32", "F16", "BF16")  # raw holds values, not blocks
        cols = raw.size // rows if floats else raw.shape[1] // block_bytes * per_block
        if name == "token_embd.weight":
            total += min(rows, CACHED_ROWS) * cols * 4  # the rows kept as floats, at most
            if "output.weight" in tensors:
                continue  # untied: the head is a tensor of its own
        if floats:
            total += raw.size * 4
            continue
        if kind in TILE_BYTES:
            quant, scale = joined.get(name, TILE_BYTES[kind])
            total += -(-rows // 16) * (cols // 32) * (quant + scale)
        else:
            total += rows * cols * 4
    return total


@dataclass
class ServeEstimate:
    """Resident memory of a gguf process serving `requests` at once (each `tokens` long: prompt and
    answer), in bytes."""

    runtime: int
    weights: int
    kv_cache: int
    activations: int
    kv_budget: int
    waiting: int  # requests that do not fit at full length beside the others: they wait (or are
    # preempted and recompute their output when readmitted: batch_decoder.reserve)

    @property
    def total(self) -> int:
        return self.runtime + self.weights + self.kv_cache + self.activations


def serve_estimate(
    cfg,
    path,
    *,
    requests: int,
    tokens: int,
    slots: int,
    kv_dtype: str = "auto",
    kv_memory: int | None = None,
    prefill_rows: int = 1024,
    serve: bool = True,
    tokenizer_bytes: int = 0,
) -> ServeEstimate:
    """The resident memory of `specdecode serve` (or the Python API) at --dtype gguf with `requests`
    concurrent requests of `tokens` positions each (prompt + max_tokens): the runtime, the weights
    (gguf_weight_bytes), the KV pool's blocks those requests write (64 positions a block, the
    admission's tree slack included; requests past the slots or the budget wait, and write nothing
    yet), and one forward's activations at the largest prefill (a step in which nothing decodes:
    8 x the prefill chunk) with its logits. The runtime is RUNTIME_BYTES, the loaded tokenizer
    (tokenizer_bytes: tokenizer_resident measures it) and the rotary tables."""
    import torch

    from specdecode.backends.batch_model import KV_DTYPES, available_memory
    from specdecode.backends.kv_pool import BLOCK, row_bytes
    from specdecode.decoding.batch_decoder import TREE_SLACK

    if kv_dtype not in KV_DTYPES:
        raise UserError(f"unknown KV cache dtype {kv_dtype!r}; one of {', '.join(KV_DTYPES)}")
    heads, kvh, h = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    d = getattr(cfg, "head_dim", None) or h // heads
    per_position = 2 * cfg.num_hidden_layers * kvh * row_bytes(d, KV_DTYPES[kv_dtype] or torch.float32)
    context = getattr(cfg, "max_position_embeddings", tokens)
    # serve's default: batch_model.kv_budget, every slot at the whole context or half the free memory
    budget = min(slots * context * per_position, available_memory() // 2) if kv_memory is None else kv_memory
    claim = -(-(tokens + TREE_SLACK) // BLOCK) * BLOCK * per_position
    running = min(requests, slots, budget // claim if claim else slots)
    written = -(-tokens // BLOCK) * BLOCK * per_position
    per_row = (4 * h + 2 * (heads + 2 * kvh) * d + 3 * cfg.intermediate_size) * 4
    act = prefill_rows * per_row + cfg.vocab_size * 4 * min(prefill_rows, max(1, requests))
    rotary = 2 * context * d * 4  # cos and sin, every position
    return ServeEstimate(
        RUNTIME_BYTES["serve" if serve else "api"] + tokenizer_bytes + rotary,
        gguf_weight_bytes(path),
        running * written,
        act,
        budget,
        requests - running,
    )


def tokenizer_resident(spec) -> int:
    """Resident bytes the model's tokenizer takes once loaded (a 152k-token vocabulary: about 190 MB),
    measured by loading it here."""
    from specdecode.backends import models

    before = current_rss_bytes()
    tokenizer = models.load_tokenizer(spec)
    grown = current_rss_bytes() - before
    del tokenizer
    return max(0, grown)


def peak_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def fmt(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def current_rss_bytes() -> int:
    """Resident memory now (anonymous and file-backed: transformers keeps safetensors weights
    mmapped), after asking glibc to return freed heap memory to the OS, so that it counts live
    allocations rather than what the allocator keeps for reuse."""
    import os

    from specdecode.backends.gguf_model import trim_heap

    trim_heap()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def heads_estimate(directory, target_cfg, precision: Precision) -> Estimate:
    """Medusa/EAGLE heads: the checkpoint's tensors plus the LM head rows its token map keeps
    (draft_lm_head), in the precision; read from the file's header, nothing is loaded. Not modelled: an
    EAGLE head's own KV cache (one layer, small beside the target's)."""
    from safetensors import safe_open

    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        shapes = {key: f.get_slice(key).get_shape() for key in f.keys()}
    elements = sum(math.prod(shape) for shape in shapes.values())
    if "token_map" in shapes:
        elements += shapes["token_map"][0] * target_cfg.hidden_size
    return Estimate(elements * weight_bytes(precision), 0, 0, 0)


def draft_config(source: str | None, target_cfg):
    """(config, shares the target's embedding) of a draft model source: a distilled checkpoint
    (None: the shipped one) is the target's architecture with its own few layers over the target's
    embedding and tied head; anything else is a model of its own."""
    import copy

    from specdecode.backends import models
    from specdecode.drafters import distilled

    if distilled.is_checkpoint(source):
        cfg = copy.deepcopy(target_cfg)
        cfg.num_hidden_layers, cfg.tie_word_embeddings = distilled.num_layers(source), True
        return cfg, True
    return models.load_config(source), False


def report(
    target: str | None,
    spec,
    *,
    precision: Precision,
    context: int,
    batch: int,
    k: int,
    backend: str = "auto",
    measure: bool = False,
    target_quant: str = "none",
    drafter_quant: str = "none",
) -> dict:
    """Estimates for the target (verifying the spec's largest step: its tree nodes + 1 tokens), each
    draft model the spec loads (one token per forward, b per forward for a static tree) and trained heads."""
    import torch

    from specdecode.backends import checkpoint, models
    from specdecode.backends.layer import SUPPORTED
    from specdecode.drafters import distilled

    def est(cfg, tokens, quant):
        fast = backend != "hf" and cfg.model_type in SUPPORTED
        return estimate(
            cfg,
            precision=precision,
            context=context,
            batch=batch,
            tokens_in_flight=tokens,
            fast_backend=fast,
            quant=quant,
        )

    out = {
        "dtype": str(precision),
        "context": context,
        "batch": batch,
        "k": k,
        "drafter": str(spec),
        "target_quant": target_quant,
        "drafter_quant": drafter_quant,
    }
    target_cfg = models.load_config(target)
    out["target"] = est(target_cfg, spec.tree_nodes(k) + 1, target_quant)
    parts = [out["target"]]
    for i, source in enumerate(spec.draft_models):
        cfg, shared = draft_config(source, target_cfg)
        e = est(cfg, spec.option("b", 1), drafter_quant)
        if shared:  # the embedding (and tied head) are the target's own tensors
            e = Estimate(
                e.weights - cfg.vocab_size * cfg.hidden_size * weight_bytes(precision),
                e.packed_weights,
                e.kv_cache,
                e.activations,
            )
        out["draft" if i == 0 else f"draft{i + 1}"] = e
        parts.append(e)
    for i, member in enumerate(spec.heads):
        parts.append(
            heads_estimate(checkpoint.checkpoint_dir(member.arg, member.kind), target_cfg, precision)
        )
        out["heads" if i == 0 else f"heads{i + 1}"] = parts[-1]
    out["total"] = sum(e.total for e in parts)
    if measure:
        if batch != 1:
            raise UserError("--measure runs one sequence; use --batch 1")
        if spec.uses_features or not all(
            source and not distilled.is_checkpoint(source) for source in spec.draft_models
        ):
            raise UserError(
                f"--measure loads the target and separate draft models (draft:<model>) only; "
                f"{spec} is built over the target"
            )
        before = current_rss_bytes()
        loaded = [models.load(target, precision, "cpu", backend, target_quant)] + [
            models.load(source, precision, "cpu", backend, drafter_quant) for source in spec.draft_models
        ]
        for m, tokens in zip(
            loaded, [spec.tree_nodes(k) + 1] + [spec.option("b", 1)] * len(spec.draft_models)
        ):
            m.model.reset()
            fill = max(1, min(context, m.model.max_length) - tokens)
            m.model.extend(torch.randint(0, m.model.vocab_size, (fill,)), num_logits=1)
            m.model.extend(torch.randint(0, m.model.vocab_size, (tokens,)))
        out["measured_resident"] = current_rss_bytes() - before
        out["measured_peak_process"] = peak_rss_bytes()
    return out


def render(rep: dict) -> str:
    lines = [
        f"memory estimate ({rep['dtype']}, context {rep['context']}, batch {rep['batch']}, k {rep['k']}):"
    ]
    for name, e in rep.items():
        if not isinstance(e, Estimate):
            continue
        quant = rep["target_quant" if name == "target" else "drafter_quant"]
        name += " (int8 linears)" if quant == "int8" and not name.startswith("heads") else ""
        lines.append(
            f"  {name}: weights {fmt(e.weights)} + prepacked {fmt(e.packed_weights)} + KV cache "
            f"{fmt(e.kv_cache)} + activations {fmt(e.activations)} = {fmt(e.total)}"
        )
    lines.append(f"  total estimate: {fmt(rep['total'])}")
    if "measured_resident" in rep:
        err = (rep["measured_resident"] - rep["total"]) / rep["total"] * 100
        lines.append(
            f"  measured: resident growth {fmt(rep['measured_resident'])} ({err:+.0f}% vs estimate), "
            f"process peak {fmt(rep['measured_peak_process'])} (includes load-time copies and libraries)"
        )
    return "\n".join(lines)
