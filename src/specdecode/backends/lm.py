"""What the decoder sees of a language model: the `CausalLM` protocol and the `Output` of a forward.

A forward returns what was asked for and nothing is left behind on the model: the logits, and
when a drafter reads the target's hidden states (Medusa, EAGLE) the rows of the layers it named.
This module imports no model code, so backends (fast_llama.py, models.py, batch_model.py) and
their users depend on it, not on each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from specdecode.backends.embedding import Embedding


@dataclass
class Output:
    """One forward's results. Layer i's features are HF's output_hidden_states[i + 1] (the output
    of decoder layer i); the last layer's entry is after the final norm (what the LM head reads),
    and a negative i counts from the end, so (-1,) asks for the LM head's input."""

    logits: torch.Tensor  # [n or num_logits, V] float32
    features: torch.Tensor | None = None  # [n, len(layers) * H]: every new row, the asked layers concatenated


def tree_attention(tree_mask: torch.Tensor, length: int) -> torch.Tensor:
    """A tree forward's mask over the whole cache: tree_mask [n, t] (its n rows against the cache's last
    t slots, themselves among them) after `length` cached slots -> [n, length + n] bool, every slot before
    those t visible to every row (CausalLM.forward's tree_mask)."""
    n = tree_mask.shape[0]
    prefix = torch.ones(n, length + n - tree_mask.shape[1], dtype=torch.bool, device=tree_mask.device)
    return torch.cat([prefix, tree_mask], dim=1)


def layer_ids(layers: tuple[int, ...], num_layers: int) -> list[int]:
    """Requested layers with negative ids resolved; an id out of range is an error."""
    ids = [i + num_layers if i < 0 else i for i in layers]
    if any(not 0 <= i < num_layers for i in ids):
        raise ValueError(f"layers {layers} out of range for a model of {num_layers} layers")
    return ids


class CausalLM(Protocol):
    """A language model with one sequence's KV cache. Everything a decoder or a drafter may use of
    it is declared here (drafters built over the target read `hf`, `kernels` and `head_rows`); nothing
    is probed with hasattr."""

    vocab_size: int
    max_length: int
    device: torch.device
    length: int  # tokens currently held in the KV cache
    hf: torch.nn.Module  # the transformers module the weights come from (config, rotary)
    embedding: Embedding  # the token embedding (embedding.py: a GGUF file's rows stay quantized)
    kernels: object | None  # the fused CPU kernels its linears run on (kernels.py); None: none
    int8_activations: bool  # its linears quantize their input rows to 8 bits (`--dtype gguf`)

    def fork(self) -> "CausalLM":
        """The same weights with an empty KV cache of its own (a draft model per request)."""
        ...

    def head_rows(self, index: torch.Tensor):
        """The LM head restricted to the rows `index` [Vd] (a draft vocabulary): a callable
        [..., H] -> [..., Vd]. As a 1-row product it dominates a head's draft step: on a quantized
        model its quantized rows, else prepacked float32 (through `kernels` where there are). A
        draft's precision changes what it proposes, never what is accepted."""
        ...

    def output_weight(self) -> torch.Tensor:
        """The LM head's float weights [V, H] (a GGUF file's quantized head dequantized)."""
        ...

    def reset(self) -> None: ...

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        num_logits: int = 0,
        layers: tuple[int, ...] = (),
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
    ) -> Output:
        """tokens: [n] appended to the cache -> Output (logits of the last `num_logits` rows when > 0,
        features of every row for `layers`). A token tree (tree.py) passes positions [n] and
        tree_mask [n, t] bool (t >= n) over the last t - n cached tokens and the n new ones (i attends
        to j where True); every new token also attends to all cached tokens before those."""
        ...

    def extend(self, tokens: torch.Tensor, num_logits: int = 0) -> torch.Tensor:
        """forward(tokens, num_logits=...).logits: [n or num_logits, V] float32."""
        ...

    def extend_tree(
        self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor
    ) -> torch.Tensor:
        """forward(tokens, positions=..., tree_mask=...).logits: [n, V] float32."""
        ...

    def truncate(self, length: int) -> None: ...

    def keep(self, length: int, indices: list[int]) -> None:
        """Keep the first `length` cached tokens, then those at `indices` (ascending), moved up (a
        token tree's accepted path); a model whose cache cannot be compacted raises a UserError."""
        ...
