"""Speculative decoding of many sequences at once: decoder.py's step, one row per sequence.

The batched core knows nothing of HTTP, queues or text. Each sequence owns a slot of a BatchLM
(batch_model.py) and keeps decoder.py's invariant: its slot holds every committed token but the
last. One `step` is decoder.decode's step for every sequence given:

  1. each drafter proposes up to its k tokens (its policy's k, optionally limited by the caller,
     e.g. the server's load control), cut to the sequence's budget (core/plan.py: plan);
  2. ONE batched target forward over every row [last committed, drafts] (ragged; a tree row with
     its own positions and mask; features for drafters that read them);
  3. per row: the same verification (step.check), rollback (truncate, or keep for a tree), drafter
     feedback and features, and commit (step.commit) as the single-sequence loop.

Sequences join (`admit`: a slot and its cache memory claimed; `start`: prefill) and leave
(`release`) between steps, so a sequence's greedy output is the one it gets alone. Admission claims a
prompt and its next GROW tokens, not its whole max_new_tokens; before each step `reserve` tops the
running sequences' claims up, and where the cache memory runs short it preempts the last admitted:
their slots are emptied, they keep what they generated and prefill it again when they are admitted
anew (vLLM's recompute preemption; Kwon et al. 2023, section 4.5), to the same output.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdecode.backends.batch_model import BatchLM, Row
from specdecode.backends.kv_pool import KVMemoryFull
from specdecode.core.drafter import Drafter
from specdecode.core.plan import plan
from specdecode.core.sampling import Warp
from specdecode.core.verify import check_inputs
from specdecode.decoding.constraints import Constraints
from specdecode.decoding.control import KPolicy
from specdecode.decoding.prefill import PrefillBudget, chunk_cost, chunk_size, keys
from specdecode.decoding.prefix_cache import PrefixCache
from specdecode.decoding.step import Decoding, Step, settle


@dataclass(eq=False)
class Sequence:
    """One sequence's decoding state."""

    prompt: list[int]
    drafter: Drafter
    policy: KPolicy
    params: Warp
    generator: torch.Generator | None
    max_new_tokens: int
    eos_ids: set[int] | frozenset[int] = frozenset()
    slot: int | None = None  # its KV slot while it runs
    context: list[int] = field(default_factory=list)  # every committed token, prompt included
    finished: bool = False
    prefilled: int = 0  # tokens of `filling` in its slot; it decodes once all but the last are
    filling: list[int] = field(default_factory=list)  # what admission fills in: the prompt, or after a
    # preemption everything committed (prompt and output, recomputed)
    preempted: int = 0  # times it gave its slot up to make room for others
    constraints: Constraints | None = None  # penalties and a grammar on the target's distribution
    logprobs: int | None = None  # report each committed token's logprob and this many top ones (0: none)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.filling) - 1

    @property
    def generated(self) -> int:
        return len(self.context) - len(self.prompt)


TREE_SLACK = 64  # cache positions claimed past a sequence's last token: a token tree's nodes
GROW = 256  # new tokens' positions claimed ahead at admission (later ones as the sequence gets there)
PREFILL_ROWS = 512  # prompt tokens in one forward of an unchunked start (start(chunked=False))


def positions(seq: Sequence, grow: int = GROW) -> int:
    """Cache positions admission claims for a sequence: what it fills in (its prompt; after a
    preemption its context), its next `grow` new tokens at most, and a tree's nodes past them."""
    held = len(seq.context or seq.prompt)
    return held + min(seq.max_new_tokens - (held - len(seq.prompt)), grow) + TREE_SLACK


class BatchDecoder:
    def __init__(
        self,
        model: BatchLM,
        prefix_cache: PrefixCache | None = None,
        budget: PrefillBudget | None = None,
        grow: int = GROW,
    ):
        """prefix_cache: reuse KV blocks of equal prompt prefixes (needs a model that shares blocks);
        budget: how much prompt a step prefills beside the others' decoding (prefill.py); grow: new
        tokens' positions admission claims ahead (`positions`)."""
        self.model, self.grow = model, grow
        self.budget = budget or PrefillBudget()
        self.prefix_cache = prefix_cache.bind(model) if prefix_cache is not None and model.shares_kv else None
        self.free = list(range(model.slots - 1, -1, -1))  # pop() hands out the lowest slot first

    def room(self, prompt: int) -> int:
        """The most new tokens a sequence of this prompt could ever have room for: the context's, or,
        where the cache memory holds less than a context, what it holds with nothing else in it (less
        a tree's slack)."""
        length, capacity = self.model.max_length, self.model.capacity
        return (length if capacity >= length else capacity - TREE_SLACK) - prompt

    def admit(self, seq: Sequence) -> bool:
        """Give the sequence a free slot and claim the cache memory for what it fills in and its next
        GROW tokens (`positions`) -> whether both were there (the prefix cache gives up blocks, least
        recently used first, when that makes room); False leaves nothing claimed."""
        if not self.free:
            return False
        slot = self.free[-1]
        while not self.model.claim(slot, positions(seq, self.grow)):
            if self.prefix_cache is None or not self.prefix_cache.evict():
                return False
        seq.slot = self.free.pop()
        seq.filling, seq.prefilled = list(seq.context or seq.prompt), 0
        return True

    def reserve(self, seqs: list[Sequence]) -> list[Sequence]:
        """Claim cache memory for each started sequence's next step (its context and a tree's slack),
        first come first: where the pool runs short, the prefix cache gives up blocks, then the last of
        `seqs` are preempted (`preempt`) -> the preempted, the last first. Greedy output is unchanged:
        the row kernels give a token's keys the same bits in a prefill as in the step that wrote them."""
        kept, preempted = list(seqs), []
        for seq in seqs:
            if seq in preempted:
                continue
            while not self.model.claim(seq.slot, len(seq.context) + TREE_SLACK):
                if self.prefix_cache is not None and self.prefix_cache.evict():
                    continue
                if len(kept) == 1:  # admission and room() make this unreachable: a bug if it is not
                    raise KVMemoryFull(f"the KV cache cannot hold one sequence of {len(seq.context)} tokens")
                victim = kept.pop()
                self.preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
        return preempted

    def preempt(self, seq: Sequence) -> None:
        """The sequence gives its slot and cache memory up and keeps its context; admitted again, it
        fills in its prompt and output (the prefix cache's blocks where it still has them)."""
        self.release(seq)
        seq.preempted += 1  # admit() sets what it fills in anew

    def start(self, seqs: list[Sequence], chunked: bool = False) -> float:
        """Admit each sequence not admitted yet (an error if it does not fit now) and begin its drafter;
        prefill every prompt but its last token now in batched forwards (features to the drafters
        that read them; forwards of at most PREFILL_ROWS tokens), or, when `chunked`, in chunks inside
        the next steps (as the budget allows: prefill.py) -> seconds taken."""
        t0 = time.perf_counter()
        for seq in seqs:
            if seq.slot is None and not self.admit(seq):
                raise KVMemoryFull(
                    f"no free slot or cache memory for a sequence of {positions(seq, self.grow)} positions"
                )
            seq.context = seq.context or list(seq.prompt)
            seq.drafter.begin(seq.prompt)  # a resumed one catches up with its output as it always does
            self._reuse_prefix(seq)
        while not chunked and any(seq.prefilling for seq in seqs):
            self._prefill(self._pieces(seqs))
        return time.perf_counter() - t0

    def _pieces(self, seqs: list[Sequence]) -> list[tuple[Sequence, int]]:
        """The next forward of an unchunked start: prompts' next tokens, at most PREFILL_ROWS in all,
        shortest rest first (a 5k-token prompt in one forward held ~200 MB of activations on the 135M
        for no gain: the tiles stream the weights once per 8 rows, so 512 rows are as fast a token)."""
        chunks, room = [], PREFILL_ROWS
        for seq in sorted((s for s in seqs if s.prefilling), key=lambda s: len(s.filling) - s.prefilled):
            n = min(len(seq.filling) - 1 - seq.prefilled, room)
            if n < 1:
                break
            chunks.append((seq, n))
            room -= n
        return chunks

    def _prefill(self, chunks: list[tuple[Sequence, int]], rows: list[Row] = ()) -> list:
        """One batched forward over the next `n` prompt tokens of each (seq, n), after `rows` -> the
        outputs of `rows`. Prompt rows feed their features to drafters that read them."""
        prompt_rows = [
            Row(
                seq.slot,
                torch.tensor(seq.filling[seq.prefilled : seq.prefilled + n], dtype=torch.long),
                1,
                seq.drafter.layers,
            )
            for seq, n in chunks
        ]
        outs = self.model.forward(list(rows) + prompt_rows) if rows or prompt_rows else []
        for (seq, n), out in zip(chunks, outs[len(rows) :]):
            seq.prefilled += n
            if out.features is not None:
                seq.drafter.feed(out.features)
            if not seq.prefilling and self.prefix_cache is not None and not seq.drafter.layers:
                done = seq.filling[: seq.prefilled]
                self.prefix_cache.store(done, self.model.blocks_of(seq.slot, len(done)))
        return outs[: len(rows)]

    def _reuse_prefix(self, seq: Sequence) -> None:
        """Start the sequence's slot with the cached blocks that begin its prompt, shared, not copied
        (not for drafters that read the prompt's features: they need every row's)."""
        if self.prefix_cache is None or seq.drafter.layers:
            return
        found = self.prefix_cache.lookup(seq.filling[: len(seq.filling) - 1])  # [(block, tokens in it)]
        if found:
            seq.prefilled = sum(n for _, n in found)
            self.model.share(seq.slot, [block for block, _ in found], seq.prefilled)

    def release(self, seq: Sequence) -> None:
        """The sequence leaves: its slot is emptied and free again."""
        if seq.slot is not None:
            self.model.truncate(seq.slot, 0)
            self.free.append(seq.slot)
            self.free.sort(reverse=True)
            seq.slot = None

    def step(self, seqs: list[Sequence], limit: Callable[[Sequence, int], int] | None = None) -> list[Step]:
        """One speculative step of every sequence (all started, none finished) -> their Steps.
        limit(seq, k): the k to use when its policy asks for k (default: k). A sequence whose drafter
        or verification raises gets a Step with `error` set and is finished; the others go on.
        Sequences still prefilling (start(chunked=True)) get chunks of their prompts in the same
        forward as the others' verification, as much as the budget (prefill.py) allows beside them,
        shortest rest first; their Steps have `prefilling` set and no tokens."""
        failed: dict[int, Exception] = {}
        rows, plans, bases, draft_s = [], {}, {}, {}
        for i, seq in enumerate(seqs):
            if seq.prefilling:
                continue
            t0 = time.perf_counter()
            try:
                k = seq.policy.next_k()
                k = limit(seq, k) if limit is not None and k > 0 else k
                budget = min(k, seq.max_new_tokens - seq.generated - 1)  # a step commits <= budget + 1
                proposal = (
                    seq.drafter.propose(seq.context, budget, seq.params, seq.generator)
                    if budget > 0
                    else None
                )
                plans[i] = plan(seq.context[-1], proposal, budget, seq.policy.tree_nodes)
                if seq.constraints is not None:
                    plans[i] = seq.constraints.cut(plans[i])
                check_inputs(plans[i].tokens, self.model.vocab_size)  # a bad id must not reach the forward
            except Exception as e:  # noqa: BLE001 (one request's drafter must not fail the batch)
                failed[i] = e
                continue
            draft_s[i] = time.perf_counter() - t0
            bases[i] = self.model.length(seq.slot)
            rows.append(
                Row(
                    seq.slot,
                    plans[i].tokens,
                    layers=seq.drafter.layers,
                    **plans[i].tree_args(bases[i]),
                )
            )
        span = self.budget.span(self.model.attention_span)
        decode = [(len(row.tokens), bases[i]) for row, i in zip(rows, bases)]  # (tokens, cached before them)
        decode_work = sum(chunk_cost(n, start, span) for n, start in decode)
        chunks = self._chunks(seqs, self.budget.work(decode_work), span)
        prompt = [(n, seq.prefilled) for seq, n in chunks]
        prompt_work = sum(chunk_cost(n, start, span) for n, start in prompt)
        t0 = time.perf_counter()
        outs = iter(self._prefill(chunks, rows))
        forward_s = time.perf_counter() - t0
        if rows:  # the span is measured beside decoding rows, where it decides a chunk's size
            shape = decode + prompt
            n_rows, n_keys = sum(n for n, _ in shape), sum(keys(n, start) for n, start in shape)
            self.budget.observe(decode_work, prompt_work, forward_s, n_rows, n_keys)
        elif chunks:
            self.budget.observe(decode_work, prompt_work, forward_s)

        steps = []
        for i, seq in enumerate(seqs):
            if i not in plans and i not in failed:  # prefilling (this step's chunk, or waiting for budget)
                steps.append(Step([], 0, 0, 0.0, forward_s, prefilling=True))
                continue
            if i not in failed:
                out = next(outs)
                try:
                    steps.append(self._advance(seq, plans[i], bases[i], out, draft_s[i], forward_s))
                    continue
                except Exception as e:  # noqa: BLE001 (e.g. the verifier refusing a bad draft)
                    self.model.truncate(seq.slot, bases[i])  # the forward's rows leave the cache
                    failed[i] = e
            seq.finished = True
            steps.append(Step([], 0, 0, 0.0, forward_s, finished=True, error=failed[i]))
        return steps

    def _chunks(self, seqs: list[Sequence], budget: float, span: float | None) -> list[tuple[Sequence, int]]:
        """-> (sequence, tokens) of the prompts still going in, as far as `budget` (chunk_cost with this
        `span`) allows: the shortest rest first, so that short prompts arriving while
        a long one goes in start decoding at once instead of waiting for all of it."""
        chunks = []
        for seq in sorted(seqs, key=lambda s: len(s.filling) - s.prefilled):
            if not seq.prefilling or budget <= 0:
                continue
            n = chunk_size(budget, seq.prefilled, len(seq.filling) - 1 - seq.prefilled, span)
            chunks.append((seq, n))
            budget -= chunk_cost(n, seq.prefilled, span)
        return chunks

    def _advance(self, seq: Sequence, planned, base: int, out, draft_s: float, forward_s: float) -> Step:
        """Settle one row (step.settle: verify, roll its slot back, feed its drafter, commit)."""
        row = Decoding(
            _Slot(self.model, seq.slot),
            seq.drafter,
            seq.policy,
            seq.params,
            seq.generator,
            seq.eos_ids,
            constraints=seq.constraints,
            context=seq.context,
            logprobs=seq.logprobs,
        )
        room = seq.max_new_tokens - seq.generated
        step = settle(planned, out, base, row, room=room, draft_s=draft_s, verify_s=lambda: forward_s)
        seq.finished = step.finished
        seq.context.extend(step.tokens)
        return step


@dataclass
class _Slot:
    """One slot of a BatchLM as the cache step.settle rolls back."""

    model: BatchLM
    slot: int

    def truncate(self, length: int) -> None:
        self.model.truncate(self.slot, length)

    def keep(self, length: int, indices: list[int]) -> None:
        self.model.keep(self.slot, length, indices)
