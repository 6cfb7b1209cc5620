"""`generate --show` / `--show-html`: the marked tokens are exactly the drafts the verifier accepted,
as the decoding loop's own Steps report them."""

import pytest
import torch

from conftest import _save, make_llama
from specdecode import drafters
from specdecode.api import show
from specdecode.api.outputs import CompletionOutput
from specdecode.backends import models
from specdecode.backends.precision import FP32
from specdecode.cli import main
from specdecode.core.sampling import Warp
from specdecode.decoding.decoder import decode

PROMPT = "the cat sat on the mat"
TOKENS = 30


@pytest.fixture(scope="module")
def near_draft_dir(tmp_path_factory, tiny_tokenizer) -> str:
    """The target with noise on its output layer: it agrees with the target often, not always (on
    PROMPT: some drafts accepted, most rejected), so the marks have both kinds to separate."""
    model = make_llama(seed=0, eos_id=tiny_tokenizer.eos_token_id)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=g) * 0.4)
    return _save(tmp_path_factory.mktemp("near_draft"), model, tiny_tokenizer)


def loop_account(target, drafter, ids: list[int]) -> tuple[list[int], list[bool]]:
    """The decoding loop's own account: the completion's tokens and, per token, whether it was an
    accepted draft (a step commits its accepted drafts, then one target token)."""
    tokens, flags = [], []
    for step in decode(target.model, drafter, ids, k=3, params=Warp(), max_new_tokens=TOKENS, eos_ids=set()):
        tokens += step.tokens
        flags += [i < step.accepted for i in range(len(step.tokens))]
    return tokens, flags


def test_show_marks_exactly_the_accepted_drafts(capsys, tiny_model_dir, near_draft_dir, tmp_path):
    target = models.load(tiny_model_dir, FP32, "cpu")
    drafter = drafters.build(f"draft:{near_draft_dir}", drafters.DrafterContext(target))
    tokens, flags = loop_account(target, drafter, target.tokenizer(PROMPT)["input_ids"])
    assert 0 < sum(flags) < len(flags) // 2  # both kinds present
    text = target.tokenizer.decode(tokens)

    page = tmp_path / "show.html"
    argv = ["generate", PROMPT, "--target", tiny_model_dir, "--drafter", f"draft:{near_draft_dir}"]
    argv += ["--k", "3", "--max-new-tokens", str(TOKENS), "--no-chat", "--show", "--show-html", str(page)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    marked = out.rstrip("\n")  # not a terminal: plain markers
    expected = show.terminal(
        target.tokenizer, CompletionOutput(0, text, tokens, "length", flags), color=False
    )
    assert marked == expected and marked.replace("⟦", "").replace("⟧", "") == text
    assert "accepted draft tokens" in err

    html = page.read_text()
    assert html.count('<span class="d"') == marked.count("⟦") and PROMPT in html


def test_api_provenance_is_the_loop_account(tiny_model_dir, near_draft_dir):
    from specdecode import LLM
    from specdecode import SamplingParams as Params

    llm = LLM(tiny_model_dir, f"draft:{near_draft_dir}", k=3)
    drafter = drafters.build(f"draft:{near_draft_dir}", llm.engine.pool.ctx)
    tokens, flags = loop_account(llm.target, drafter, llm.tokenizer(PROMPT)["input_ids"])
    out = llm.generate(PROMPT, Params(temperature=0, max_tokens=TOKENS, ignore_eos=True))[0]
    assert out.token_ids == tokens and out.outputs[0].from_draft == flags
    assert sum(flags) == out.metrics.accepted


def test_terminal_colours_and_split_characters():
    class Bytes:  # a tokenizer of single UTF-8 bytes: "é" is two tokens, the first decodes to U+FFFD
        def decode(self, ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", errors="replace")

    ids = list("aé b".encode())  # a, 0xC3, 0xA9, space, b
    done = CompletionOutput(0, "aé b", ids, "length", [False, True, True, False, True])
    assert show.pieces(Bytes(), done) == [("a", False), ("", True), ("é", True), (" ", False), ("b", True)]
    assert show.terminal(Bytes(), done, color=False) == "a⟦é⟧ ⟦b⟧"
    assert (
        show.terminal(Bytes(), done, color=True)
        == f"a{show.DRAFT_COLOR}é{show.RESET} {show.DRAFT_COLOR}b{show.RESET}"
    )
