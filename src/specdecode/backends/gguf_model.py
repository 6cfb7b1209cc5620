"""A GGUF file loaded as GGUF: the model's skeleton is built without weights, only the small float
tensors the forward reads as floats (norms, biases, the token embedding) are dequantized from the
file, and the linears and the LM head stay the file's blocks (gguf_weights.keep_quantized). No float
copy of the weights exists on disk or in memory, as in llama.cpp's loader.

The config and tokenizer that transformers derives from the file's metadata (slow for a large
vocabulary) are cached once as their small JSON files under the cache directory; the weights never are.
Each float tensor goes through the same dequantization and the same per-architecture fix-ups as
transformers' GGUF conversion (Gemma's norms stored as 1 + w), so `--dtype gguf-exact` keeps the
bits of the dequantized fp32 model (tests/test_gguf_weights.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from specdecode.backends.lm import derived_dir, save_atomically
from specdecode.errors import UserError

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


def skeleton(path: Path, tensors: dict[str, tuple[str, np.ndarray]]):
    """-> the transformers model of `path` whose decoder linears and LM head stay on the meta device
    (no memory) and whose other parameters hold the file's values, dequantized to float32."""
    from accelerate import init_empty_weights
    from gguf import MODEL_ARCH, get_tensor_name_map
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(metadata_dir(path))
    if config.model_type not in _ARCHS:
        raise ValueError(f"no direct GGUF loader for model type {config.model_type}")
    names = get_tensor_name_map(MODEL_ARCH[_ARCHS[config.model_type]], config.num_hidden_layers)
    with init_empty_weights(include_buffers=False):  # rotary tables (buffers) are computed for real
        hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    quantized = {id(m.weight) for m in hf.model.layers.modules() if isinstance(m, torch.nn.Linear)}
    quantized.add(id(hf.get_output_embeddings().weight))
    quantized.discard(id(hf.get_input_embeddings().weight))  # a tied head is the embedding: read as floats
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

    from specdecode.backends.gguf_weights import FORMATS, ROWS_AT_ONCE, repack

    if kind == "F32":
        return raw.view(np.float32).copy()  # off the file's read-only mapping

    def dequantize(rows: np.ndarray) -> np.ndarray:
        if kind in FORMATS:
            return repack(kind, rows, name).dequantize().numpy()
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
