"""A GGUF file loaded as GGUF (`--dtype gguf`, `gguf-exact`): `load` is the one constructor. The
model's skeleton (gguf_skeleton.py, or transformers' class for the families it does not cover) is
built without weights, only the small float tensors the forward reads as floats
(norms, biases) are dequantized from the file, the linears and the LM head stay the file's blocks,
repacked once into the kernels' layouts (gguf_weights.py), and the token embedding stays in the file's
mapping, its rows dequantized when looked up (embedding.py). No float copy of the weights exists on
disk or in memory, as in llama.cpp's loader.

The config and tokenizer that transformers derives from the file's metadata (slow for a large
vocabulary) are cached once as their small JSON files under the cache directory; the weights never are.
Each float tensor goes through the same dequantization and the same per-architecture fix-ups as
transformers' GGUF conversion (Gemma's norms stored as 1 + w), so `--dtype gguf-exact` keeps the
bits of the dequantized fp32 model (tests/test_gguf_weights.py).
"""

from __future__ import annotations

import ctypes
import gc
import sys
from functools import partial
from pathlib import Path

import numpy as np
import torch

from specdecode.backends import gguf_skeleton
from specdecode.backends import kernels as fused_kernels
from specdecode.backends.embedding import Embedding, FileBlocks
from specdecode.backends.fast_llama import FastLlama
from specdecode.backends.gguf_file import drop_pages, read
from specdecode.backends.gguf_repack import FORMATS, QuantMatrix, dequantized, repack, repack_chunks
from specdecode.backends.gguf_weights import Interleaved, QuantLinear
from specdecode.errors import UserError
from specdecode.files import derived_dir, save_atomically

# our architectures (config.model_type) -> the gguf package's MODEL_ARCH member name
_ARCHS = {"llama": "LLAMA", "qwen2": "QWEN2", "qwen3": "QWEN3", "phi3": "PHI3", "gemma3_text": "GEMMA3"}


def metadata_dir(path: Path) -> Path:
    """The file's config.json and tokenizer files, derived once from its metadata and cached."""
    target = derived_dir(path, "gguf-meta")
    if (target / "config.json").exists():
        return target
    from transformers import AutoConfig, AutoTokenizer

    print(
        f"specdecode: reading {path.name}'s config and tokenizer once (cached in {target})", file=sys.stderr
    )
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as e:  # transformers raises many types for unreadable or unsupported files
        raise UserError(f"cannot load GGUF file {path}: {e}") from e
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return save_atomically(target, lambda tmp: (config.save_pretrained(tmp), tokenizer.save_pretrained(tmp)))


def load(path: Path, int8_activations: bool) -> FastLlama:
    """The FastLlama of the GGUF file `path` computing from its quantized blocks; int8_activations:
    `--dtype gguf` (see gguf_weights.QuantLinear), else `gguf-exact`. A family or variant the lean
    forward does not run raises ValueError; no fused kernels here, a UserError."""
    arch, tensors = read(path)  # the file is mapped once, its pages dropped as layers are repacked
    hf = skeleton(path, tensors)
    kernels = fused_kernels.load()
    if kernels is None:
        raise UserError(
            "--dtype gguf needs the fused CPU kernels, which did not build here (use --dtype fp32)"
        )
    return FastLlama(hf, weights=FileWeights(kernels, path, arch, tensors, hf.config, int8_activations))


def skeleton(path: Path, tensors: dict[str, tuple[str, np.ndarray]]):
    """-> the model of `path` (gguf_skeleton.SkeletonLM where it stands in, else the transformers
    class) whose decoder linears, LM head and token embedding stay on the meta device (no memory) and
    whose other parameters hold the file's values, dequantized to float32."""
    from gguf import MODEL_ARCH, get_tensor_name_map
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(metadata_dir(path))
    if config.model_type not in _ARCHS:
        raise ValueError(f"no direct GGUF loader for model type {config.model_type}")
    names = get_tensor_name_map(MODEL_ARCH[_ARCHS[config.model_type]], config.num_hidden_layers)
    if gguf_skeleton.supported(config):
        hf = gguf_skeleton.SkeletonLM(config)
    else:
        from accelerate import init_empty_weights
        from transformers import AutoModelForCausalLM

        with init_empty_weights(include_buffers=False):  # rotary tables (buffers) are computed for real
            hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    quantized = {id(m.weight) for m in hf.model.layers.modules() if isinstance(m, torch.nn.Linear)}
    quantized.add(id(hf.get_output_embeddings().weight))
    quantized.add(id(hf.get_input_embeddings().weight))  # FileWeights: kept as blocks (embedding.py)
    for full, param in list(hf.named_parameters()):
        if id(param) in quantized:
            continue
        name = names.get_name(full, try_suffixes=(".weight", ".bias"))
        if name is None or name not in tensors:
            raise UserError(f"GGUF file {path} has no tensor for {full}")
        kind, raw = tensors[name]
        values = repack_float(kind, raw, name)
        if config.model_type == "gemma3_text" and name.endswith("norm.weight"):
            values = values - 1  # stored as 1 + w (transformers' conversion does the same)
        values = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(param.shape)
        module_name, _, attr = full.rpartition(".")
        hf.get_submodule(module_name)._parameters[attr] = torch.nn.Parameter(values, requires_grad=False)
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


def repack_float(kind: str, raw: np.ndarray, name: str) -> np.ndarray:
    """A tensor's float32 values, equal to the `gguf` package's dequantization (transformers'
    conversion): our repacked blocks dequantized where a kernel format exists (the same values,
    tested, a third of the time), else the package's; in slices of rows, whose temporaries stay small
    beside a 150k-row embedding."""
    from gguf import GGMLQuantizationType, quants

    from specdecode.backends.gguf_repack import ROWS_AT_ONCE

    if kind == "F32":
        return raw.view(np.float32).copy()  # off the file's read-only mapping

    def dequantize(rows: np.ndarray) -> np.ndarray:
        if kind in FORMATS:
            return dequantized(kind, rows, name).numpy()
        try:
            return quants.dequantize(rows, GGMLQuantizationType[kind])
        except (KeyError, NotImplementedError):
            return repack(kind, rows, name).numpy()  # raises the clear error for an unreadable type

    out = None
    for i in range(0, len(raw), ROWS_AT_ONCE):
        part = dequantize(raw[i : i + ROWS_AT_ONCE])
        out = np.empty((len(raw), part.shape[1]), np.float32) if out is None else out
        out[i : i + len(part)] = part
    return out


def tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(metadata_dir(path))


def trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise): after a load whose float
    temporaries were freed (here; a drafter head's fp32 weights once packed, eagle.load)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the pages are reused by later allocations instead
        pass


class FileWeights:
    """A GGUF file's linears, LM head and token embedding for FastLlama's constructor (its `weights`):
    each layer's blocks repacked into the kernels' layouts when the model builds that layer, then the
    file pages and temporaries let go, so that loading costs about the model's repacked size; the
    embedding stays the file's blocks (embedding.py). int8_activations: see QuantLinear."""

    def __init__(self, kernels, path: Path, arch: str, tensors: dict, config, int8_activations: bool):
        self.kernels, self.path, self.tensors = kernels, path, tensors
        self.int8_activations = int8_activations
        self.permuted = arch == "llama"  # llama.cpp rotates q/k rows for its llama architecture only
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.hidden = config.hidden_size
        self.linear = partial(QuantLinear, kernels, int8_activations=int8_activations)

    def _weight(self, name: str, heads: int = 0):
        if name not in self.tensors:
            raise UserError(f"GGUF file {self.path} has no tensor {name}")
        m = repack(*self.tensors[name], name)
        if not (heads and self.permuted):
            return m
        order = _unpermute(m.shape[0], heads)
        return m.rows(order) if isinstance(m, QuantMatrix) else m[order]

    def layer(self, i: int, hf_layer) -> tuple:
        """Layer i's (qkv, o, gate_up, down); the biases are the skeleton's (Qwen2: q|k|v biases, in
        the weights' row order), whose weightless linears are emptied (nothing reads them)."""
        b, w, attn = f"blk.{i}.", self._weight, hf_layer.self_attn
        fused = b + "attn_qkv.weight" in self.tensors  # Phi-3: q|k|v in one matrix, and gate|up in ffn_up
        biases = [] if fused else [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
        qkv_bias = torch.cat(biases) if biases and all(x is not None for x in biases) else None
        if fused:
            qkv_bias = attn.qkv_proj.bias
        qkv = self.linear(
            [w(b + "attn_qkv.weight")]
            if fused
            else [
                w(b + "attn_q.weight", self.heads),
                w(b + "attn_k.weight", self.kv_heads),
                w(b + "attn_v.weight"),
            ],
            bias=qkv_bias,
        )
        o = self.linear([w(b + "attn_output.weight")], bias=attn.o_proj.bias)
        gate_up = self.linear(
            [w(b + "ffn_up.weight")]
            if b + "ffn_gate.weight" not in self.tensors
            else [w(b + "ffn_gate.weight"), w(b + "ffn_up.weight")]
        )
        down = self.linear([w(b + "ffn_down.weight")])
        with torch.no_grad():
            for lin in (m for m in hf_layer.modules() if isinstance(m, torch.nn.Linear)):
                lin.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
        drop_pages(self.tensors)  # this layer's blocks are repacked: its file pages need not stay resident
        trim_heap()  # nor the repacks' temporaries (glibc keeps freed pages otherwise)
        return qkv, o, gate_up, down

    def head(self) -> QuantLinear:
        """The LM head (tied: the embedding's blocks), interleaved slice by slice where it can be."""
        name = "output.weight" if "output.weight" in self.tensors else "token_embd.weight"
        kind, raw = self.tensors[name]
        if self.int8_activations and kind in FORMATS:

            def chunks():  # each slice's file pages let go once it is packed
                for m in repack_chunks(kind, raw, name):
                    yield m
                    drop_pages(self.tensors)

            return self.linear([Interleaved.pack_chunks(self.kernels, chunks, len(raw))])
        return self.linear([self._weight(name)])

    def embedding(self) -> Embedding:
        """The token embedding, left in the file's mapping; then what loading left is let go."""
        embedding = Embedding(
            FileBlocks(*self.tensors["token_embd.weight"], "token_embd.weight", self.hidden)
        )
        drop_pages(self.tensors)
        gc.collect()
        trim_heap()
        unsupported = sorted(
            {t for t, _ in self.tensors.values() if t not in FORMATS and t not in ("F32", "F16", "BF16")}
        )
        if unsupported:
            print(
                f"specdecode: GGUF types {', '.join(unsupported)} have no quantized kernel; "
                f"their matrices run as float32",
                file=sys.stderr,
            )
        return embedding


def _unpermute(n: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k rotary permutation (as transformers' reverse_permute)."""
    return torch.arange(n).view(heads, n // heads // 2, 2).transpose(1, 2).reshape(n)
