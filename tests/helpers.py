"""Plain helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import torch

from specdecode.backends.batch_model import Row, batched
from specdecode.backends.lm import Output
from specdecode.core.sampling import Warp, warp
from specdecode.decoding.generation import generate


class TableModel:
    """A CausalLM (models.CausalLM protocol) whose next-token logits depend only on the last token:
    logits(next | ..., t) = table[t]. It records the tokens its "KV cache" holds, so tests can check
    the decoder's cache invariants (truncate only shrinks; the cache holds what was committed)."""

    device = torch.device("cpu")

    def __init__(self, table: torch.Tensor, max_length: int = 1 << 20):
        self.table = table.float()
        self.vocab_size = table.shape[-1]
        self.max_length = max_length
        self.tokens: list[int] = []

    @classmethod
    def random(cls, vocab: int, seed: int, scale: float = 1.5) -> "TableModel":
        g = torch.Generator().manual_seed(seed)
        return cls(torch.randn(vocab, vocab, generator=g) * scale)

    @property
    def length(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        self.tokens = []

    def fork(self) -> "TableModel":
        twin = copy.copy(self)
        twin.tokens = []
        return twin

    def extend(self, tokens: torch.Tensor, num_logits: int = 0) -> torch.Tensor:
        assert tokens.dim() == 1 and tokens.dtype == torch.long and tokens.numel() > 0
        self.tokens += tokens.tolist()
        assert len(self.tokens) <= self.max_length
        if num_logits:
            tokens = tokens[-num_logits:]
        return self.table.index_select(0, tokens)

    def forward(self, tokens, *, num_logits=0, layers=(), positions=None, tree_mask=None) -> Output:
        assert not layers, "a table has no hidden states"
        if tree_mask is not None:
            return Output(self.extend_tree(tokens, positions, tree_mask))
        return Output(self.extend(tokens, num_logits))

    def truncate(self, length: int) -> None:
        assert 0 <= length <= len(self.tokens), (length, len(self.tokens))
        del self.tokens[length:]

    def extend_tree(
        self, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor
    ) -> torch.Tensor:
        """Logits depend on the last token only, so a tree needs no mask: node i gets table[tokens[i]]."""
        assert tokens.shape == positions.shape and tree_mask.shape[0] == tokens.shape[0] <= tree_mask.shape[1]
        assert bool(
            tree_mask[
                torch.arange(len(tokens)), tree_mask.shape[1] - len(tokens) + torch.arange(len(tokens))
            ].all()
        )
        return self.extend(tokens)

    def keep(self, length: int, indices: list[int]) -> None:
        assert indices == sorted(indices) and all(length <= i < len(self.tokens) for i in indices)
        self.tokens = self.tokens[:length] + [self.tokens[i] for i in indices]


class ScriptModel(TableModel):
    """A CausalLM whose greedy continuation is a fixed token script: the token at history position
    `start + i` is predicted to be script[i]; everywhere else token 0 (EOS in the test tokenizers).
    It reads the position, not the text: a drafter that feeds it a non-canonical tokenization of the
    script's text gets wrong predictions, as a real model would get worse ones."""

    def __init__(self, vocab: int, start: int, script: list[int]):
        super().__init__(torch.zeros(1, vocab))
        self.start, self.script = start, script

    def extend(self, tokens: torch.Tensor, num_logits: int = 0) -> torch.Tensor:
        first = len(self.tokens)
        self.tokens += tokens.tolist()
        logits = torch.zeros(tokens.shape[0], self.vocab_size)
        for row, position in enumerate(range(first + 1, first + 1 + tokens.shape[0])):
            i = position - self.start
            logits[row, self.script[i] if 0 <= i < len(self.script) else 0] = 10.0
        return logits[-num_logits:] if num_logits else logits


DELTA = 1e-6


def tv_bound(support: int, n: int, delta: float = DELTA) -> float:
    """Total-variation radius t with P(TV(p̂_n, p) >= t) <= delta, for the empirical distribution
    p̂_n of n i.i.d. draws from a distribution p with `support` possible outcomes.

    Weissman, Ordentlich, Seroussi, Verdú, Weinberger (2003), "Inequalities for the L1 deviation of
    the empirical distribution": P(||p̂_n - p||_1 >= ε) <= (2^m - 2) exp(-n ε² / 2). With
    TV = ||.||_1 / 2 (ε = 2t) and 2^m - 2 < 2^m, setting the right side to delta gives
    t = sqrt((m ln 2 + ln(1/delta)) / (2n)). With delta = 1e-6 a correct sampler exceeds t about
    once in a million seeds; the tests are seeded, so they are deterministic anyway."""
    return math.sqrt((support * math.log(2) + math.log(1 / delta)) / (2 * n))


def tv(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Total variation between the empirical distribution of `counts` and `probs` (same shape)."""
    counts = counts.double().flatten()
    return 0.5 * float((counts / counts.sum() - probs.double().flatten()).abs().sum())


def joint_two(table: torch.Tensor, last: int, params: Warp) -> torch.Tensor:
    """Exact P(first, second new token) of a TableModel target after `last`: p1(a) * p2(b | a)."""
    p1 = warp(table[last], params).double()  # [V]
    p2 = warp(table, params).double()  # [V, V]: row a is p(. | a)
    return p1[:, None] * p2


def record_proposals(drafter) -> list:
    """Wrap drafter.propose so that every proposal it returns is also appended to the returned list."""
    proposals, propose = [], drafter.propose

    def recorded(*args):
        proposal = propose(*args)
        proposals.append(proposal)
        return proposal

    drafter.propose = recorded
    return proposals


def assert_lossless(
    target, plain, drafter, prompts: list[str], k: int, max_new_tokens: int, min_accepted: int = 1
):
    """Greedy decoding with `drafter` gives `plain`'s tokens on every prompt (target: a LoadedModel)
    -> (plain decoding's token ids per prompt, tokens drafted in all). Speculation must have happened:
    drafts proposed and at least `min_accepted` accepted, or the identity would hold with speculation
    switched off (0 only where the caller checks the accepting path with another drafter)."""
    outputs, drafted, accepted = [], 0, 0
    for prompt in prompts:
        ids = target.tokenizer(prompt)["input_ids"]
        a = generate(target, plain, ids, max_new_tokens=max_new_tokens)
        b = generate(target, drafter, ids, k=k, max_new_tokens=max_new_tokens)
        assert a.token_ids == b.token_ids, prompt
        outputs.append(a.token_ids)
        drafted += b.stats.drafted
        accepted += b.stats.accepted
    assert drafted > 0 and accepted >= min_accepted, f"drafted {drafted}, accepted {accepted}"
    return outputs, drafted


def assert_stack_is_per_op(model, ids: torch.Tensor) -> None:
    """The native stack's logits and captured layer outputs equal the per-op path's bit for bit: a
    prefill, a decoding step, a chain, a tree, batched rows of two slots."""
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    last = len(model.layers) - 1

    def run():
        model.reset()
        outs = [
            model.forward(ids[:30], layers=(0, last)),
            model.forward(ids[30:31]),
            model.forward(ids[31:34]),
        ]
        outs.append(
            model.forward(ids[34:37], positions=torch.tensor([34, 35, 35]), tree_mask=tree, layers=(1,))
        )
        lm = batched(model, 2)
        outs += lm.forward([Row(0, ids[:20]), Row(1, ids[40:45], layers=(0,))])
        outs += lm.forward([Row(0, ids[20:25]), Row(1, ids[45:46])])
        return [o.logits for o in outs] + [o.features for o in outs if o.features is not None]

    native = run()
    model.stack, stack = None, model.stack
    per_op = run()
    model.stack = stack
    assert len(native) == len(per_op) == 11  # 8 logits, 3 feature tensors
    assert all(torch.equal(a, b) for a, b in zip(native, per_op))
    model.reset()  # and a verification chain's rows are those of decoding steps
    model.forward(ids[:31])
    assert torch.equal(torch.cat([model.forward(ids[i : i + 1]).logits for i in range(31, 34)]), native[2])


def load_script(name: str):
    """scripts/NAME.py as a module, for the tests of a script's functions."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
