"""The benchmark harness beyond the basics: Hugging Face peers on the same token ids, the ideal
speedup from a run's own acceptance and measured costs, the temperature sweep, Markdown and plots."""

import json

import pytest

from specdecode.bench.suite import ideal_speedup
from specdecode.cli import main
from specdecode.core.metrics import Stats
from specdecode.decoding.control import CostModel


def test_ideal_speedup_counts_each_step_at_its_own_draft_length():
    cost = CostModel(draft_cost=0.1, verify_ratio={1: 1.1, 2: 1.2, 3: 1.3})
    stats = Stats()
    stats.observe(drafted=2, accepted=1, committed=2)
    stats.observe(drafted=2, accepted=1, committed=2)
    assert ideal_speedup(stats, cost) == pytest.approx(2.0 / (2 * 0.1 + 1.2))  # τ counts committed tokens
    mixed = Stats()
    mixed.observe(drafted=0, accepted=0, committed=1)  # nothing offered: a plain step, cost 1
    mixed.observe(drafted=3, accepted=3, committed=4)
    assert ideal_speedup(mixed, cost) == pytest.approx(2.5 / ((1.0 + 3 * 0.1 + 1.3) / 2))
    tree = Stats()
    tree.observe(drafted=5, accepted=2, committed=3, depth=2)  # 5 nodes over 2 depths: no chain cost
    assert ideal_speedup(tree, cost) is None and ideal_speedup(Stats(), cost) is None


def test_bench_with_hf_peers_sweep_markdown_and_plots(capsys, tiny_model_dir, tiny_draft_dir, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        "\n".join(
            json.dumps({"prompt": p, "category": c})
            for p, c in [("a b c a b c a b", "code"), ("tell a tale of a b c", "creative")]
        )
    )
    out_json, plots = tmp_path / "r.json", tmp_path / "plots"
    peers = f"hf,hf-lookup:3,hf-assist:draft:{tiny_draft_dir}"
    code = main(
        [
            "bench",
            "--prompts",
            str(f),
            "--drafters",
            "ngram",
            "--k",
            "2,4",
            "--adaptive",
            "--k-max",
            "4",
            "--peers",
            peers,
            "--target",
            tiny_model_dir,
            "--max-new-tokens",
            "10",
            "--out",
            str(out_json),
            "--plots",
            str(plots),
            "--sweep-temperatures",
            "0,1",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out_json.read_text())
    rows = {(r["drafter"], r["category"]): r for r in report["rows"]}
    for peer in ("hf", "hf-lookup:3", f"hf-assist:draft:{tiny_draft_dir}"):
        row = rows[(peer, "ALL")]
        # transformers' greedy generate, with or without its own speculation, matches our plain decoding
        assert row["peer"] and row["identical_to_none"] == 1.0, peer
        assert row["acceptance_rate"] is None and row["tokens"] > 0 and row["ttft_ms"] > 0
    ours = rows[("ngram:2-4@k4", "ALL")]
    assert not ours["peer"] and set(ours["speedup_vs_peers"]) == {
        "fp32 hf",
        "fp32 hf-lookup:3",
        f"fp32 hf-assist:draft:{tiny_draft_dir}",
    }
    assert ours["ideal_speedup"] > 0 and ours["measured_over_ideal"] == pytest.approx(
        ours["speedup_vs_none"] / ours["ideal_speedup"], rel=0.01
    )
    assert set(report["costs"]["fp32"]) == {
        "ngram:2-4@k2",
        "ngram:2-4@k4",
        "ngram:2-4+adaptive",
    }  # canonical labels
    sweep = report["alpha_vs_temperature"]["fp32"]
    assert set(sweep) == {"ngram:2-4@k2", "ngram:2-4@k4"} and set(sweep["ngram:2-4@k2"]) == {"0.0", "1.0"}
    assert set(sweep["ngram:2-4@k2"]["0.0"]) == {"code", "creative", "ALL"}
    assert out_json.with_suffix(".md").read_text().startswith("| dtype | drafter |")
    written = sorted(p.name for p in plots.iterdir())
    assert written == sorted(
        f"{n}.png"
        for n in (
            "alpha_by_task",
            "speedup_vs_k",
            "alpha_vs_temperature",
            "ideal_vs_measured",
            "speedup_overall",
        )
    )
    assert all((plots / n).read_bytes()[:4] == b"\x89PNG" for n in written)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--peers", "vllm"], "unknown peer"),
        (["--peers", "hf", "--dtype", "gguf-exact"], "keeps none"),
        (["--peers", "hf-lookup:x"], "must be an integer"),
        (["--peers", "hf-assist:ngram"], "must be a draft model"),
        (["--sweep-temperatures", "0,hot"], "comma-separated numbers"),
        (["--sweep-temperatures", "-1"], ">= 0"),
    ],
)
def test_bench_bad_peer_and_sweep_flags(capsys, tiny_model_dir, argv, message):
    code = main(["bench", "--target", tiny_model_dir, "--prompts", "mtbench:1"] + argv)
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


def test_suite_corpora_gsm_and_bfcl_are_deterministic_and_labelled():
    import sys

    from specdecode.corpora import load_prompts

    suite = load_prompts("suite:1")
    assert [p.category for p in suite[-3:]] == ["code", "gsm", "function-calling"]
    assert len({p.category for p in suite}) == 11 and len({p.id for p in suite}) == len(suite)
    gsm = load_prompts("gsm:3")
    assert [p.prompt for p in gsm] == [p.prompt for p in load_prompts("gsm:3")]  # same templates, same seeds
    assert len({p.prompt for p in gsm}) == 3 and all(p.task == "math" for p in gsm)
    assert "reasoning_gym" not in sys.modules  # its package root (and dependencies) never imported
    call = load_prompts("bfcl:1")[0]
    assert call.task == "structured-json" and '"name": "calculate_triangle_area"' in call.prompt


def test_heldout_set_avoids_the_shipped_drafters_training_prompts():
    """The shipped drafters were trained on MT-bench minus mtbench:1, then HumanEval from the start."""
    from specdecode.corpora import load_prompts

    held = load_prompts("heldout:2")
    trained_on = {p.id for p in load_prompts("mtbench")} - {p.id for p in load_prompts("mtbench:1")}
    trained_on |= {p.id for p in load_prompts("humaneval:10")}
    assert not trained_on & {p.id for p in held}
    assert [p.id for p in held if p.category == "code"] == ["HumanEval/162", "HumanEval/163"]
    assert len(held) == 8 + 2 + 2 + 2 and len({p.category for p in held}) == 11


def test_itl_counts_each_prompts_own_time_to_first_token():
    """Three prompts, one with a long prefill: the median TTFT times three (what the row used before)
    is not the time the walls spent before their first tokens; each prompt's own TTFT is."""
    from specdecode.bench.suite import Cell, _row
    from specdecode.decoding.generation import Result

    cell = Cell()
    for pid, wall, ttft in (("a", 0.5, 0.05), ("b", 0.5, 0.06), ("long", 1.0, 0.9)):
        cell.results[pid] = Result("", list(range(11)), Stats(), "length")
        cell.walls[pid].append(wall)
        cell.ttfts[pid].append(ttft)
    row = _row("fp32", "none", "ALL", ["a", "b", "long"], cell, cell, peer=False)
    assert row["ttft_ms"] == pytest.approx(60.0)  # the median over prompts
    assert row["itl_ms"] == pytest.approx((2.0 - 1.01) / 30 * 1000)  # 30 tokens after the first ones


ROW_FIELDS = {
    "dtype",
    "drafter",
    "category",
    "prompts",
    "peer",
    "speculates",
    "acceptance_rate",
    "mean_accepted_length",
    "acceptance_by_position",
    "draft_positions",
    "tokens",
    "tokens_per_s",
    "speedup_vs_none",
    "ideal_speedup",
    "measured_over_ideal",
    "identical_to_none",
    "ttft_ms",
    "itl_ms",
    "time_split_s",
    "peak_rss_mb",
    "reruns_under_load",
}


def _no_single_sequence_loop(monkeypatch):
    """Running the one-sequence loop (decoding/decoder.py, the tests' oracle) fails the test."""
    from specdecode.decoding import decoder, generation

    def refuse(*args, **kwargs):
        raise AssertionError("bench ran the single-sequence loop, not the engine")

    monkeypatch.setattr(decoder, "decode", refuse)
    monkeypatch.setattr(generation, "decode", refuse)


def test_every_bench_row_runs_in_the_engine_and_equals_the_oracles_greedy_tokens(target, monkeypatch):
    """Each row is one request alone in the engine users run; at fp32 greedy every row's tokens (fixed
    and adaptive k) are plain greedy decoding's from the single-sequence oracle, and its timings and
    costs are the engine's."""
    from specdecode import drafters
    from specdecode.bench.suite import Pass, variants
    from specdecode.decoding.generation import generate

    runs = variants([drafters.parse("ngram:1-2")], [2, 4], adaptive=True)
    prompts = [target.tokenizer(p)["input_ids"] for p in ("a b c a b c a b", "The dog. The dog. The")]
    _no_single_sequence_loop(monkeypatch)
    bench = Pass(target, runs, k_max=4)
    results = {
        (label, i): bench.run(label, ids, "code", 16)
        for label in bench.labels
        for i, ids in enumerate(prompts)
    }
    monkeypatch.undo()
    oracle = drafters.build("none", drafters.DrafterContext(target))
    plain = [generate(target, oracle, ids, k=1, max_new_tokens=16).token_ids for ids in prompts]
    for (label, i), result in results.items():
        assert result.token_ids == plain[i], label
        assert result.stats.wall_s >= result.stats.ttft_s > 0 and result.stats.steps > 0
    assert sum(r.stats.drafted for r in results.values()) > 0
    cost = bench.cost("ngram:1-2@k4")
    assert set(cost.verify_ratio) == {1, 2, 3, 4} and cost.step_s > 0
    assert bench.cost("none") is None


def test_the_bench_report_keeps_its_fields_through_the_engine(tiny_model_dir, monkeypatch):
    from specdecode.backends.precision import FP32
    from specdecode.bench import suite
    from specdecode.core.sampling import Warp
    from specdecode.corpora import Prompt
    from specdecode.drafters import parse

    _no_single_sequence_loop(monkeypatch)
    prompts = [Prompt("a b c a b c a b", "0", "code"), Prompt("tell a tale", "1", "creative")]
    report = suite.run(
        prompts,
        [parse("ngram:1-2")],
        target=tiny_model_dir,
        precisions=[FP32],
        device=None,
        ks=[3],
        k_max=4,
        adaptive=True,
        params=Warp(),
        max_new_tokens=10,
        temperatures=[0.0],
        log=lambda message: None,
    )
    assert set(report) == {"rows", "best_plain_tokens_per_s", "costs", "alpha_vs_temperature"}
    labels = {"none", "ngram:1-2", "ngram:1-2+adaptive"}
    assert {(r["drafter"], r["category"]) for r in report["rows"]} == {
        (label, c) for label in labels for c in ("code", "creative", "ALL")
    }
    for row in report["rows"]:
        assert ROW_FIELDS <= set(row), row["drafter"]
        assert row["identical_to_none"] == 1.0 and row["tokens"] > 0  # greedy: lossless
    assert set(report["costs"]["fp32"]) == {"ngram:1-2", "ngram:1-2+adaptive"}
    assert set(report["alpha_vs_temperature"]["fp32"]) == {"ngram:1-2"}
