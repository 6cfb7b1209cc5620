"""`draft:<model>` whose tokenizer differs from the target's: drafting across vocabularies, after
Timor et al. 2025, "Accelerating LLM Inference with Lossless Speculative Decoding Algorithms for
Heterogeneous Vocabularies" (ICML 2025, arXiv 2502.05202).

The draft model reads the committed context in its own tokens: the target's tokens are decoded to
text and re-encoded with the draft's tokenizer (the prompt once, with the draft's own BOS; the
generated text at every step), and its KV cache rolls back to the prefix it shares with that.

- greedy, SLEM (string-level exact match, the paper's Algorithm 2): the draft continues greedily in
  its own tokens; their text is re-encoded with the target's tokenizer right after the committed
  tokens, and those target ids are proposed (one-hot q) and verified as usual, so the output is the
  target's own greedy output. Drafting goes on until the text holds one target token more than is
  proposed: the last target token of a text could still change when more text arrives. (Proposing
  it anyway saves a draft forward but lowered α from 0.63 to 0.60 for SmolLM2 drafting Gemma-3-270M
  at k = 4, for the same speed.)
- sampling, TLI (token-level intersection, the paper's Algorithm 4): the draft's distribution
  restricted to the tokens whose text is also a single target token (renormalised by the same warp)
  is a distribution q over target ids; standard rejection sampling against p is then lossless.
"""

from __future__ import annotations

import torch

from specdecode.backends.models import CausalLM
from specdecode.backends.tokenizer_check import token_bytes
from specdecode.core.drafter import Proposal
from specdecode.core.sampling import Warp, argmax, sample, warp
from specdecode.drafters.draft_lm import DraftLM

WINDOW = 32  # committed tokens re-encoded together with new text, so that the boundary tokenizes right


def intersection(
    draft_tok, target_tok, draft_vocab_size: int, draft_eos: set[int], target_eos: int | None
) -> torch.Tensor:
    """-> [draft_vocab_size] long: the target id whose text equals draft token i's, -1 where none;
    the draft's end-of-sequence ids map to target_eos. Where the target has several tokens for the
    same bytes (a byte-fallback <0xNN> and a plain piece), the plain piece is taken."""
    plain_last = sorted(
        token_bytes(target_tok).items(),
        key=lambda item: not target_tok.convert_ids_to_tokens(item[0]).startswith("<0x"),
    )
    by_bytes = {b: i for i, b in plain_last}
    out = torch.full((draft_vocab_size,), -1, dtype=torch.long)
    for i, b in token_bytes(draft_tok).items():
        if i < draft_vocab_size and b in by_bytes:
            out[i] = by_bytes[b]
    if target_eos is not None:
        out[[i for i in draft_eos if i < draft_vocab_size]] = target_eos
    return out


class CrossVocabDrafter(DraftLM):
    def __init__(
        self,
        model: CausalLM,
        draft_tok,
        target_tok,
        target_vocab_size: int,
        draft_eos: set[int],
        target_eos: int | None,
    ):
        super().__init__(model, target_vocab_size)
        self.dtok, self.ttok = draft_tok, target_tok
        self.draft_eos, self.target_eos = draft_eos, target_eos
        self.to_target = intersection(draft_tok, target_tok, model.vocab_size, draft_eos, target_eos).to(
            model.device
        )
        self.outside = self.to_target < 0  # [V_draft] tokens TLI may not draft
        self.shared = (~self.outside).nonzero().flatten()  # [S] draft ids in the intersection
        self.prompt_len, self.prompt_ids = 0, []

    def begin(self, prompt):
        super().begin(prompt)
        self.prompt_len = len(prompt)
        self.prompt_ids = self.dtok(self.ttok.decode(prompt))["input_ids"]

    def _draft_ids(self, context: list[int]) -> list[int]:
        """The committed context (target ids) in the draft's tokens."""
        generated = self.ttok.decode(context[self.prompt_len :])
        return self.prompt_ids + self.dtok(generated, add_special_tokens=False)["input_ids"]

    def _step(self, token: int) -> torch.Tensor:
        """Feed one draft token -> the draft's logits [V_draft] after it."""
        self.cached.append(token)
        return self.model.extend(torch.tensor([token]), num_logits=1)[-1]

    def propose(self, context, k, params: Warp, generator):
        ids = self._draft_ids(context)
        logits = self.sync(ids)
        if params.greedy:
            return self._slem(context, ids, logits, k)
        return self._tli(logits, k, params, generator)

    def _slem(self, context: list[int], ids: list[int], logits: torch.Tensor, k: int) -> Proposal:
        tail = context[-WINDOW:]
        tail_text = self.ttok.decode(tail)
        base = self.dtok.decode(ids[-WINDOW:])
        new: list[int] = []
        proposal: list[int] = []
        for _ in range(2 * k + 4):  # draft tokens per step, whatever their text holds
            token = int(argmax(logits))
            if token in self.draft_eos and self.target_eos is not None:
                return _chain(
                    (proposal + [self.target_eos])[:k]
                )  # the text is complete: every token is final
            new.append(token)
            full = self.dtok.decode(ids[-WINDOW:] + new)
            text = (full[len(base) :] if full.startswith(base) else self.dtok.decode(new)).rstrip("\ufffd")
            proposal = self._target_ids(tail, tail_text, text)
            if len(proposal) > k:
                break
            logits = self._step(token)
        return _chain(proposal[: min(k, len(proposal) - 1)])

    def _target_ids(self, tail: list[int], tail_text: str, text: str) -> list[int]:
        """Target ids that continue the committed `tail` with `text`: the re-encoding of tail text +
        text after the tail, or, where that does not reproduce the tail (the target's tokens differ
        from its own encoding, or a token would span the boundary), the encoding of text alone."""
        ids = self.ttok(tail_text + text, add_special_tokens=False)["input_ids"]
        if ids[: len(tail)] == tail:
            return ids[len(tail) :]
        return self.ttok(text, add_special_tokens=False)["input_ids"]

    def _tli(self, logits: torch.Tensor, k: int, params: Warp, generator) -> Proposal:
        tokens, probs = [], []
        targets = self.to_target[self.shared]  # [S]
        for i in range(k):
            q = warp(logits.masked_fill(self.outside, float("-inf")), params)  # [V_draft], zero outside
            token = sample(q, generator)
            tokens.append(int(self.to_target[token]))
            probs.append(q.new_zeros(self.vocab_size).index_add_(0, targets, q[self.shared]))  # [V_target]
            if i < k - 1:
                logits = self._step(token)
        return Proposal(torch.tensor(tokens, dtype=torch.long), torch.stack(probs))


def _chain(tokens: list[int]) -> Proposal:
    return Proposal(torch.tensor(tokens, dtype=torch.long))
