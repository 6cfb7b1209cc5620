"""Grammar-constrained decoding under speculation (decoding/grammar.py, decoding/constraints.py): drafts
are cut at their first forbidden token, each verified row is masked given its drafted prefix, and greedy
output is token-identical to constrained greedy decoding without drafts, for chains and trees."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from specdecode.core.plan import Plan
from specdecode.core.sampling import Warp
from specdecode.core.tree import Tree
from specdecode.decoding.constraints import Constraints
from specdecode.decoding.decoder import decode
from specdecode.decoding.grammar import Grammars
from specdecode.drafters import NgramDrafter, NoDrafter
from specdecode.errors import UserError

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
REGEX = r"(the |a )?(cat|dog|fox) (sat|ran) on the (mat|dog)\."


@pytest.fixture(scope="module")
def grammars(target):
    return Grammars(target.tokenizer, target.model.vocab_size, target.eos_ids)


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_chain_is_cut_before_its_first_forbidden_token(target, grammars):
    tok = target.tokenizer
    constraints = Constraints([1], grammar=grammars.matcher(grammars.regex(REGEX)))
    good, bad = _ids(tok, "the cat"), _ids(tok, "!")
    drafts = good + bad + good
    planned = Plan(torch.tensor([1] + drafts), None, torch.full((len(drafts), 4), 0.25))
    cut = constraints.cut(planned)
    assert cut.tokens.tolist() == [1] + good and cut.probs.shape == (len(good), 4)
    assert constraints.cut(Plan(torch.tensor([1] + good), None, None)).tokens.tolist() == [1] + good


def test_a_tree_keeps_a_forbidden_node_as_a_sure_rejection_and_drops_what_is_below_it(target, grammars):
    tok = target.tokenizer
    constraints = Constraints([1], grammar=grammars.matcher(grammars.regex(REGEX)))
    the, (bang,) = _ids(tok, "the")[0], _ids(tok, "!")  # "t" may begin the text, "!" may not
    # root -> t (0) -> ! (2) -> t (3); root -> ! (1) -> t (4)
    tree = Tree([the, bang, bang, the, the], [-1, -1, 0, 2, 1])
    cut = constraints.cut(Plan(torch.tensor([1] + tree.tokens), tree, None))
    assert cut.tree.tokens == [the, bang, bang] and cut.tree.parents == [-1, -1, 0]
    # the masked rows give a forbidden node probability 0 at its parent's row
    logits = constraints.process([1], cut, torch.zeros(4, target.model.vocab_size))
    assert logits[0, the] == 0 and logits[0, bang] == float("-inf") and logits[1, bang] == float("-inf")


def _decode(target, drafter, prompt, k, constraints, n=40):
    steps = decode(
        target.model,
        drafter,
        prompt,
        k=k,
        params=Warp(),
        max_new_tokens=n,
        eos_ids=target.eos_ids,
        constraints=constraints,
    )
    tokens, drafted, accepted = [], 0, 0
    for step in steps:
        tokens += step.tokens
        drafted += step.drafted
        accepted += step.accepted
    return tokens, (drafted, accepted)


@pytest.mark.parametrize("kind", ["regex", "schema"])
def test_greedy_constrained_output_is_identical_with_and_without_speculation(target, grammars, kind):
    tok = target.tokenizer
    compiled = grammars.regex(REGEX) if kind == "regex" else grammars.json_schema(SCHEMA)
    prompts = ["the cat sat on the mat. the dog sat on the", '{"name": "Paris", "age": 3} {"name": "']
    drafted_in_all = accepted_in_all = 0
    for text in prompts:
        prompt = _ids(tok, text)
        plain, _ = _decode(
            target, NoDrafter(), prompt, 0, Constraints(prompt, grammar=grammars.matcher(compiled))
        )
        assert plain[-1] in target.eos_ids  # the grammar completed and then allowed only EOS
        out = tok.decode(plain[:-1])
        if kind == "regex":
            assert re.fullmatch(REGEX, out), out
        else:
            jsonschema.validate(json.loads(out), SCHEMA)
        for drafter in (NgramDrafter(min_n=1), NgramDrafter(min_n=1, branches=3)):
            constraints = Constraints(prompt, grammar=grammars.matcher(compiled))
            spec, (drafted, accepted) = _decode(target, drafter, prompt, 4, constraints)
            assert spec == plain, (text, drafter)
            drafted_in_all += drafted
            accepted_in_all += accepted
    assert drafted_in_all > 0 and accepted_in_all > 0  # drafts survived the grammar, some were kept


def test_bad_grammars_are_user_errors(grammars):
    with pytest.raises(UserError, match="regex"):
        grammars.regex("(unclosed")
    with pytest.raises(UserError, match="grammar"):
        grammars.lark("start: undefined_rule")
    with pytest.raises(UserError, match="schema"):
        grammars.json_schema({"type": "no-such-type"})
