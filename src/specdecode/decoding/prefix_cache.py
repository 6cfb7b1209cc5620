"""Automatic prefix caching: KV blocks of prompt prefixes reused across requests.

A prompt's tokens are cut into blocks of `block` tokens; block i is keyed by a hash of its tokens and
of block i-1's key (a chain: equal keys mean equal whole prefixes, as vLLM's automatic prefix
caching). After a sequence's prefill its full blocks are stored (keys and values of every layer,
read from its KV slot); a later prompt starting with the same blocks gets them written into its slot
and prefills only the rest. The part after the last full block is stored too, keyed by the chain
and its tokens, and found only by a prompt that goes on exactly as far: a repeated prompt (an agent's
retry, a replayed request) prefills nothing, where it prefilled up to a block less one token (one
forward of up to 31 rows). Blocks are evicted least
recently used beyond `max_bytes`. Only for models that can read and write KV rows (the fused Llama
batch) and drafters that need no target features of the prompt (Medusa/EAGLE read every prompt row).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import torch


class PrefixCache:
    def __init__(self, block: int = 32, max_bytes: int = 256 << 20):
        if block < 1:
            raise ValueError(f"prefix cache blocks need at least 1 token, got {block}")
        self.block, self.max_bytes = block, max_bytes
        self.blocks: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.bytes = 0
        self.queries = self.hits = 0  # in blocks

    def keys(self, tokens: list[int]) -> list[bytes]:
        """Chain hashes of the blocks of `tokens`, the last one partial if they end inside one."""
        out, prev = [], b""
        for start in range(0, len(tokens), self.block):
            prev = hashlib.sha256(prev + repr(tokens[start : start + self.block]).encode()).digest()
            out.append(prev)
        return out

    def lookup(self, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The cached blocks that begin `tokens`, in order (stops at the first miss); the last may be
        a partial block, when `tokens` end exactly where a stored prompt's did."""
        found = []
        keys = self.keys(tokens)
        self.queries += len(keys)
        for key in keys:
            kv = self.blocks.get(key)
            if kv is None:
                break
            self.blocks.move_to_end(key)
            found.append(kv)
        self.hits += len(found)
        return found

    def store(self, tokens: list[int], read) -> None:
        """Cache the blocks of `tokens` (the last one partial if they end inside one) not cached yet;
        read(start, end) -> (k, v) of those positions."""
        for i, key in enumerate(self.keys(tokens)):
            if key in self.blocks:
                self.blocks.move_to_end(key)
                continue
            k, v = read(i * self.block, min((i + 1) * self.block, len(tokens)))
            self.blocks[key] = (k, v)
            self.bytes += k.numel() * k.element_size() + v.numel() * v.element_size()
            while self.bytes > self.max_bytes and self.blocks:
                old_k, old_v = self.blocks.popitem(last=False)[1]
                self.bytes -= old_k.numel() * old_k.element_size() + old_v.numel() * old_v.element_size()
