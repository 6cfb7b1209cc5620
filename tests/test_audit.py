"""`specdecode audit`: its statistic separates equal from different distributions, it flags a
deliberately biased verifier (p < 0.01) and passes the real one on the same setup (the negative
control), free and under a grammar (structured outputs), and the CLI reports and exits accordingly."""

import json
import re

import numpy as np
import pytest
import torch

from specdecode import LLM, StructuredOutputs
from specdecode.audit import stats
from specdecode.audit.run import PLAIN, LocalSource, ServerSource, audit, render
from specdecode.cli import main
from specdecode.core.verify import Verdict
from specdecode.decoding import step

PROMPTS = ["the cat sat on the mat", "def fibonacci(n):"]


def draws(probs, n, seed, m=3):
    g = np.random.default_rng(seed)
    return [list(g.choice(len(probs), size=m, p=probs)) for _ in range(n)]


def test_the_permutation_test_separates_equal_from_shifted_distributions():
    view, rng = stats.token_views(3), np.random.default_rng(0)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = np.array([0.25, 0.3, 0.2, 0.25])  # TV(p, q) = 0.15
    same = stats.compare([draws(p, 300, 1)], [draws(p, 300, 2)], view, 300, rng)
    shifted = stats.compare([draws(p, 300, 1)], [draws(q, 300, 2)], view, 300, rng)
    assert same.p_value > 0.05 and shifted.p_value < 0.01
    assert shifted.tv > same.tv and set(shifted.views) == {"token 1", "token 2", "token 3", "tokens 1-2"}


def test_the_joint_view_sees_a_bias_the_marginals_cannot():
    """First two tokens equal (0,0)/(1,1) vs crossed (0,1)/(1,0): every marginal is uniform in both."""
    g = np.random.default_rng(3)
    equal = [[int(a), int(a)] for a in g.integers(0, 2, 300)]
    crossed = [[int(a), 1 - int(a)] for a in g.integers(0, 2, 300)]
    c = stats.compare([equal], [crossed], stats.token_views(2), 300, np.random.default_rng(0))
    assert c.views["token 1"] < 0.1 and c.views["tokens 1-2"] > 0.9 and c.p_value < 0.01


def test_text_views_and_holm():
    c = stats.compare([["a"] * 50], [["b"] * 50], stats.text_view, 100, np.random.default_rng(0))
    assert c.tv == 1.0 and c.p_value < 0.02
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def accept_everything(draft, q, p, generator) -> Verdict:
    """A biased verifier: every draft is kept, so the output follows the drafter wherever it drafts."""
    return Verdict(len(draft), int(torch.multinomial(p[len(draft)], 1, generator=generator)))


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_dir):
    return LLM(tiny_model_dir, "none", max_batch=16)


def run_audit(llm, drafter, prompts=PROMPTS, fmt=None, source=LocalSource, samples=100):
    report = audit(
        source(llm, 2),
        prompts,
        [drafter],
        [1.0],
        samples=samples,
        tokens=3,
        greedy_tokens=12,
        permutations=200,
        fmt=fmt,
        name="tiny",
    )
    return report


def test_audit_flags_a_biased_verifier_and_passes_the_real_one(tiny_llm, tiny_draft_dir, monkeypatch):
    drafter = f"draft:{tiny_draft_dir}"
    honest = run_audit(tiny_llm, drafter)
    (row,) = honest.rows
    assert row.drafted > 0 and row.p_value > 0.05 and honest.passed
    assert honest.greedy[drafter] == [True, True]

    monkeypatch.setattr(step, "verify_rejection", accept_everything)
    biased = run_audit(tiny_llm, drafter)
    (row,) = biased.rows
    assert row.p_value < 0.01 and not biased.passed
    assert "DIFFERS" in render(biased) and "FAILED" in render(biased)


# Words the tiny target's corpus knows, any number from one to eight, each after a space; prompts whose
# continuation inside the grammar repeats their text, so prompt lookup drafts from the first new token.
WORDS = StructuredOutputs(regex=r"( (the|cat|dog|fox|sat|on|mat)){1,8}")
WORD_PROMPTS = ["cat dog cat dog cat dog cat", "the fox sat on the mat the fox sat on the mat the fox"]


class OneSided(LocalSource):
    """The negative control for the grammar: only the plain side is constrained."""

    def draw(self, drafter, prompt, temperature, seeds, m, chat, fmt=None):
        return super().draw(drafter, prompt, temperature, seeds, m, chat, fmt if drafter == PLAIN else None)


def test_constrained_sampling_passes_the_audit_and_its_controls_fail(tiny_llm, monkeypatch):
    """Sampled (T = 1) under a regex, speculation gives constrained sampling's distribution; the audit
    sees a verifier that keeps every draft, and a grammar missing on the speculative side."""
    honest = run_audit(tiny_llm, "ngram", WORD_PROMPTS, WORDS)
    (row,) = honest.rows
    assert row.drafted > 0 and row.accepted > 0 and row.p_value > 0.05 and honest.passed
    assert honest.greedy["ngram"] == [True, True]
    assert honest.response_format == {"type": "regex", "pattern": WORDS.regex}
    assert "constrained by" in render(honest)

    one_sided = run_audit(tiny_llm, "ngram", WORD_PROMPTS, WORDS, source=OneSided, samples=30)
    assert one_sided.rows[0].p_value < 0.01 and not one_sided.passed

    monkeypatch.setattr(step, "verify_rejection", accept_everything)
    biased = run_audit(tiny_llm, "ngram", WORD_PROMPTS, WORDS)
    (row,) = biased.rows
    assert row.drafted > 0 and row.p_value < 0.01 and not biased.passed


def test_a_server_audit_sends_the_format_both_ways(target):
    """Against the real server: constrained completions with and without speculation, same answers."""
    from serving import serve

    with serve(target, load_control=False) as running:
        report = audit(
            ServerSource(running.url, k=2),
            WORD_PROMPTS,
            ["ngram"],
            [1.0],
            samples=30,
            tokens=3,
            greedy_tokens=12,
            permutations=200,
            fmt=WORDS,
        )
        (row,) = report.rows
        assert (
            row.drafted > 0
            and row.p_value > 0.05
            and report.passed
            and report.greedy["ngram"] == [True, True]
        )
        source = ServerSource(running.url, k=2)
        texts = source.draw("ngram", WORD_PROMPTS[0], 1.0, range(5), 40, False, WORDS).outcomes
    assert all(re.fullmatch(WORDS.regex, t) for t in texts), texts


def test_audit_cli_writes_its_report(capsys, tiny_model_dir, tmp_path):
    out = tmp_path / "audit.json"
    argv = ["audit", "--target", tiny_model_dir, "--drafters", "ngram", "--temperatures", "1.0"]
    argv += ["--samples", "20", "--tokens", "2", "--permutations", "50", "--greedy-tokens", "6"]
    assert main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["passed"] and report["rows"][0]["drafter"] == "ngram" and report["greedy"]["ngram"]
    assert "PASSED" in capsys.readouterr().out and out.with_suffix(".md").exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--temperatures", "0"], "temperatures > 0"),
        (["--temperatures", "x"], "comma-separated numbers"),
        (["--drafters", "telepathy"], "unknown drafter"),
        (["--samples", "1"], "--samples >= 2"),
        (["--response-format", "{json"], "--response-format: response_format is not valid JSON"),
        (["--response-format", '{"type": "xml"}'], "--response-format: response_format type 'xml'"),
        (["--response-format", '{"type": "regex"}'], "needs 'pattern'"),
        (["--response-format", "@/no/such/file.json"], "--response-format: cannot read"),
        (["--response-format", '{"type": "regex", "pattern": "("}'], "invalid regex"),
    ],
)
def test_audit_bad_arguments(capsys, tiny_model_dir, argv, message):
    assert main(["audit", "--target", tiny_model_dir, *argv]) == 2
    assert message in capsys.readouterr().err
