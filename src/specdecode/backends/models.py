"""Loading causal LMs (HF directory, hub id, GGUF) and running them with a rollback-able KV cache.

`CausalLM` (lm.py) is what the decoder and drafters see: `forward` appends tokens to the cache and
returns their logits (and the hidden rows asked for); `truncate` rolls the cache back to a shorter
prefix (rejected drafts) without recomputing anything. `HFModel` implements it on top of any
transformers causal LM, FastLlama (fast_llama.py) for Llama-architecture models.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specdecode.backends import registry
from specdecode.backends.embedding import Embedding
from specdecode.backends.fast_llama import FastLlama
from specdecode.backends.layer import head_linear
from specdecode.backends.lm import (  # noqa: F401 (CausalLM: re-exported)
    CausalLM,
    Output,
    layer_ids,
    tree_attention,
)
from specdecode.backends.precision import FP32, GGUF, Precision
from specdecode.errors import UserError
from specdecode.files import derived_dir, save_atomically

DEFAULT_TARGET = "smollm2"  # SmolLM2-135M-Instruct (registry.py: an alias of smollm2-135m, its server name)
GEMMA3 = "gemma3-270m"  # another tokenizer than the default's, for cross-vocabulary drafting


class HFModel:
    """A transformers causal LM with one sequence's KV cache (a DynamicCache cropped on rollback)."""

    kernels = None  # transformers' own ops
    int8_activations = False

    def __init__(self, hf_model):
        self.hf = hf_model.eval()
        self.config = hf_model.config
        self.embedding = Embedding(hf_model.get_input_embeddings().weight)
        self.vocab_size = hf_model.get_output_embeddings().weight.shape[0]
        self.device = hf_model.device
        self.max_length = getattr(self.config, "max_position_embeddings", None) or 2048
        self.reset()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.config)
        self.cache.activate_past_recording()  # lets sliding-window layers roll back too
        self.length = 0

    def fork(self) -> "HFModel":
        return HFModel(self.hf)

    def head_rows(self, index: torch.Tensor):
        return head_linear(self.hf.get_output_embeddings().weight.detach()[index].float())

    def output_weight(self) -> torch.Tensor:
        return self.hf.get_output_embeddings().weight

    def extend(self, tokens: torch.Tensor, num_logits: int = 0) -> torch.Tensor:
        return self.forward(tokens, num_logits=num_logits).logits

    def extend_tree(
        self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor
    ) -> torch.Tensor:
        return self.forward(tokens, positions=positions, tree_mask=tree_mask).logits

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        *,
        num_logits: int = 0,
        layers: tuple[int, ...] = (),
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
    ) -> Output:
        """As CausalLM.forward. A tree runs with a custom 4D boolean attention mask [1, 1, n, length+n]
        and explicit position ids (transformers 5 passes a 4D mask through unchanged; checked against
        per-path chains in the tests)."""
        n, mask = tokens.shape[0], None
        if tree_mask is not None:
            self._check_tree_support()
            mask = tree_attention(tree_mask.to(self.device), self.length)[None, None]
            positions = positions.to(self.device)
        else:
            positions = torch.arange(self.length, self.length + n, device=self.device)
        ids = layer_ids(layers, self.config.num_hidden_layers) if layers else []
        out = self.hf(
            input_ids=tokens.to(self.device)[None],
            position_ids=positions[None],
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=num_logits,
            output_hidden_states=bool(ids),
        )
        self.length += n
        # hidden_states: (embeddings, layer 0, ..., last layer after the final norm)
        features = torch.cat([out.hidden_states[i + 1][0] for i in ids], -1) if ids else None
        return Output(out.logits[0].float(), features)

    def _check_tree_support(self) -> None:
        from transformers.cache_utils import DynamicLayer

        for layer in self.cache.layers:
            if type(layer) is not DynamicLayer:
                raise UserError(
                    f"token trees need plain full-attention KV caches; this model's {type(layer).__name__} "
                    "cannot be compacted: use a chain drafter, or a Llama model (fast backend)"
                )

    @torch.inference_mode()
    def keep(self, length: int, indices: list[int]) -> None:
        if indices == list(range(length, length + len(indices))):
            return self.truncate(length + len(indices))
        idx = torch.tensor(indices, dtype=torch.long, device=self.device)
        self._check_tree_support()
        for layer in self.cache.layers:
            layer.keys = torch.cat([layer.keys[..., :length, :], layer.keys[..., idx, :]], dim=-2)
            layer.values = torch.cat([layer.values[..., :length, :], layer.values[..., idx, :]], dim=-2)
        self.length = length + len(indices)

    def truncate(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)  # transformers 5: a negative count removes tokens
            self.length = length


@dataclass
class LoadedModel:
    name: str
    model: CausalLM  # FastLlama or HFModel; both keep the HF module as .hf
    tokenizer: object  # a transformers tokenizer

    @property
    def eos_ids(self) -> set[int]:
        ids = set()
        gen = getattr(self.model.hf, "generation_config", None)
        for source in (getattr(gen, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        return ids


def resolve(spec: str | None) -> Path | str:
    """Model spec -> a local directory, a local .gguf file, or a hub id (returned as str). A registered
    name (registry.py) is its GGUF file, assembled from its packages on first use."""
    model = registry.lookup(spec or DEFAULT_TARGET)
    if model is not None:
        return registry.path(model)
    path = Path(spec).expanduser()
    if path.exists():
        return path
    looks_like_hub_id = spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and "\\" not in spec
    if looks_like_hub_id and not spec.endswith(".gguf"):
        return spec
    raise UserError(f"model path not found: {spec}")


def _gguf_to_safetensors(gguf: Path) -> Path:
    """Dequantize a GGUF file once and cache it as a safetensors model directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = derived_dir(gguf, "models")
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"specdecode: dequantizing {gguf.name} once; caching it in {target}", file=sys.stderr)
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as e:  # transformers raises many types for unreadable/unsupported files
        raise UserError(f"cannot load GGUF file {gguf}: {e}") from e
    # The dequantized weights are plain tensors; drop the GGUF marker so they can be saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return save_atomically(target, lambda tmp: (model.save_pretrained(tmp), tokenizer.save_pretrained(tmp)))


def local_path(spec: str | None) -> Path | str:
    """Model spec -> a local model directory (a .gguf file is dequantized and cached once) or a hub id."""
    where = resolve(spec)
    if isinstance(where, Path) and where.suffix == ".gguf":
        where = _gguf_to_safetensors(where)
    return where


def _from_pretrained(auto_class, spec: str | None, what: str):
    where = resolve(spec)
    if isinstance(where, Path) and where.suffix == ".gguf":  # its metadata, not a dequantized copy
        from specdecode.backends.gguf_model import metadata_dir

        where = metadata_dir(where)
    try:
        return auto_class.from_pretrained(where)
    except Exception as e:  # transformers raises many types for unreadable or unsupported files
        raise UserError(f"cannot load the {what} of {spec or DEFAULT_TARGET}: {e}") from e


def load_config(spec: str | None):
    """The model's transformers config, without loading weights."""
    from transformers import AutoConfig

    return _from_pretrained(AutoConfig, spec, "config")


def load_tokenizer(spec: str | None):
    from transformers import AutoTokenizer

    return _from_pretrained(AutoTokenizer, spec, "tokenizer")


BACKENDS = ("auto", "fast", "hf")


def wrap(hf_model, backend: str = "auto", int8: bool = False) -> CausalLM:
    """The lean FastLlama forward for Llama-architecture models, HF's own forward otherwise; int8: float
    weights beside a `--dtype gguf` target, on its 8-bit path (FastLlama's int8)."""
    if backend not in BACKENDS:
        raise UserError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "hf":
        return HFModel(hf_model)
    try:
        return FastLlama(hf_model, int8=int8)
    except ValueError as e:
        if backend == "fast":
            raise UserError(f"--backend fast: {e}") from None
        print(f"specdecode: {e}; using the Hugging Face forward", file=sys.stderr)
        return HFModel(hf_model)


def load(
    spec: str | None,
    precision: Precision = FP32,
    device: str | None = None,
    backend: str = "auto",
    quant: str = "none",
) -> LoadedModel:
    """Load a causal LM and its tokenizer. spec: None (default target), dir, .gguf file or hub id;
    precision: a resolved one (not auto). quant: "int8" quantizes the decoder's linear layers (quant.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdecode.backends import quant as quantization

    if precision.quantized:
        return _load_quantized(spec, device, backend, quant, int8_activations=precision.int8_activations)
    dtype = precision.torch_dtype  # auto: an error (resolved before loading)
    quantization.check(quant, precision, device)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda requested but no CUDA device is available")
    where = local_path(spec)
    try:
        hf = AutoModelForCausalLM.from_pretrained(where, dtype=dtype).to(device)
        tokenizer = AutoTokenizer.from_pretrained(where)
    except Exception as e:
        raise UserError(f"cannot load model {spec or DEFAULT_TARGET}: {e}") from e
    if quant == "int8":
        quantization.quantize(hf)
    return LoadedModel(str(spec or DEFAULT_TARGET), wrap(hf, backend), tokenizer)


def is_gguf(spec: str | None) -> bool:
    where = resolve(spec)
    return isinstance(where, Path) and where.suffix == ".gguf"


def auto_dtype(spec: str | None, device: str | None, quant: str = "none", backend: str = "auto") -> Precision:
    """gguf for a GGUF file of a supported family on CPU when the fused kernels build, else fp32."""
    from specdecode.backends import kernels
    from specdecode.backends.layer import SUPPORTED

    cpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cpu")
    if not (cpu and quant == "none" and backend != "hf" and is_gguf(spec)):
        return FP32
    return GGUF if load_config(spec).model_type in SUPPORTED and kernels.load() is not None else FP32


def _load_quantized(
    spec: str | None, device: str | None, backend: str, quant: str, int8_activations: bool
) -> LoadedModel:
    """--dtype gguf / gguf-exact: FastLlama on the file's quantized blocks (gguf_model.load)."""
    from specdecode.backends import gguf_model

    if not is_gguf(spec):
        raise UserError(
            f"--dtype gguf keeps a GGUF file's weights quantized; {spec or DEFAULT_TARGET} is not a "
            ".gguf file"
        )
    if quant != "none":
        raise UserError(
            "--dtype gguf already computes from the file's quantized weights; drop the int8 quantization"
        )
    if device and not device.startswith("cpu"):
        raise UserError("--dtype gguf runs on the fused CPU kernels; on CUDA use --dtype bf16")
    if backend == "hf":
        raise UserError("--dtype gguf runs on the fast Llama backend; --backend hf needs --dtype fp32")
    path = resolve(spec)
    try:
        model = gguf_model.load(path, int8_activations)
    except ValueError as e:  # a family or variant the lean forward does not run
        raise UserError(f"--dtype gguf: {spec or DEFAULT_TARGET}: {e} (use --dtype fp32)") from None
    return LoadedModel(str(spec or DEFAULT_TARGET), model, gguf_model.tokenizer(path))
