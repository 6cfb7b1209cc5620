"""Automatic prefix caching: KV blocks of prompt prefixes shared across requests.

A prompt's tokens are cut into the cache's blocks (the batched model's, kv_pool.py); block i is keyed
by a hash of its tokens and of block i-1's key (a chain: equal keys mean equal whole prefixes, as
vLLM's automatic prefix caching). After a sequence's prefill its blocks are stored: the cache holds
them (a reference, not a copy), so they outlive the sequence; a later prompt starting with the same
blocks gets them into its slot's block table and prefills only the rest. The part after the last full
block is stored too, keyed by the chain and its tokens, and found only by a prompt that goes on
exactly as far: a repeated prompt (an agent's retry, a replayed request) prefills nothing. A block
written after it is shared (the first decoded token after a partial one) is copied first
(kv_pool.KVPool.writable). Blocks are let go least recently used beyond `max_bytes`, and when
admission needs their memory. Only for models that share blocks (the fused Llama batch) and
drafters that need no target features of the prompt (Medusa/EAGLE read every prompt row).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict


class PrefixCache:
    def __init__(self, max_bytes: int = 256 << 20):
        self.max_bytes = max_bytes
        self.blocks: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # key -> (cache block, its tokens)
        self.queries = self.hits = 0  # in blocks
        self.model = None

    def bind(self, model) -> PrefixCache:
        """The batched model whose blocks it holds (BatchLM with shares_kv): blocks, hold, unhold."""
        self.model, self.block = model, model.block
        self.block_bytes = model.block_bytes
        return self

    @property
    def bytes(self) -> int:
        return len(self.blocks) * self.block_bytes

    def keys(self, tokens: list[int]) -> list[bytes]:
        """Chain hashes of the blocks of `tokens`, the last one partial if they end inside one."""
        out, prev = [], b""
        for start in range(0, len(tokens), self.block):
            prev = hashlib.sha256(prev + repr(tokens[start : start + self.block]).encode()).digest()
            out.append(prev)
        return out

    def lookup(self, tokens: list[int]) -> list[tuple[int, int]]:
        """The cached blocks that begin `tokens`, in order (stops at the first miss) -> (block, tokens
        in it); the last may be a partial block, when `tokens` end exactly where a stored prompt's did."""
        found = []
        keys = self.keys(tokens)
        self.queries += len(keys)
        for key in keys:
            entry = self.blocks.get(key)
            if entry is None:
                break
            self.blocks.move_to_end(key)
            found.append(entry)
        self.hits += len(found)
        return found

    def store(self, tokens: list[int], blocks: list[int]) -> None:
        """Hold the blocks of `tokens` (the last one partial if they end inside one) not cached yet;
        blocks: the cache blocks holding them, in order."""
        for i, key in enumerate(self.keys(tokens)):
            if key in self.blocks:
                self.blocks.move_to_end(key)
                continue
            self.model.hold([blocks[i]])
            self.blocks[key] = (blocks[i], min(self.block, len(tokens) - i * self.block))
            while self.bytes > self.max_bytes and self.evict():
                pass

    def evict(self) -> bool:
        """Let the least recently used block go -> whether there was one."""
        if not self.blocks:
            return False
        block, _ = self.blocks.popitem(last=False)[1]
        self.model.unhold([block])
        return True
