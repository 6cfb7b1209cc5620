"""`advise --from-metrics SCRAPE.txt`: a saved scrape is read once, its totals, without waiting out a
window (two scrapes of an unchanging file would only sleep, then hold no drafts)."""

import json
import time
from pathlib import Path

import pytest

from specdecode import cli
from specdecode.errors import UserError
from specdecode.monitor import advice

SCRAPE = Path(__file__).parent / "fixtures" / "vllm" / "v032" / "eagle3_k6_scrape.txt"  # 385 drafts


@pytest.fixture
def no_sleep(monkeypatch):
    def sleep(seconds):
        raise AssertionError(f"slept {seconds} s over a saved scrape")

    monkeypatch.setattr(time, "sleep", sleep)


@pytest.mark.parametrize("source", [str(SCRAPE), f"file://{SCRAPE}"])
def test_a_saved_scrape_gives_its_totals_at_once_whatever_the_window(source, no_sleep):
    counts, span = advice.read(source, 60.0)
    assert span == 0.0
    assert (counts.drafts, counts.draft_tokens, counts.accepted) == (385, 2310, 287)
    assert advice.profile(counts).served_k == 6


def test_a_saved_scrape_without_drafts_says_so_and_not_send_traffic(tmp_path, no_sleep):
    empty = tmp_path / "idle.txt"
    empty.write_text(
        "vllm:spec_decode_num_drafts_total 0\nvllm:spec_decode_num_draft_tokens_total 0\n"
        "vllm:spec_decode_num_accepted_tokens_total 0\n"
    )
    with pytest.raises(UserError, match="holds no drafts") as error:
        advice.read(str(empty), 60.0)
    assert "send traffic" not in str(error.value)


def test_cli_on_a_saved_scrape_with_the_default_window_says_totals(tmp_path, capsys, no_sleep):
    """The default --window (60 s) and no model loaded (--step-costs-from: costs from step times)."""
    sources = []
    for k in (1, 2):
        path = tmp_path / f"k{k}.txt"
        path.write_text(
            f"vllm:spec_decode_num_drafts_total 100\nvllm:spec_decode_num_draft_tokens_total {100 * k}\n"
            f"vllm:inter_token_latency_seconds_sum {100 * (0.1 + 0.01 * k)}\n"
            "vllm:inter_token_latency_seconds_count 100\n"
        )
        sources.append(str(path))
    argv = [
        "advise",
        "--from-metrics",
        str(SCRAPE),
        "--drafter",
        "eagle",
        "--step-costs-from",
        ",".join(sources),
    ]
    report = tmp_path / "report.json"
    assert cli.main([*argv, "--out", str(tmp_path / "cfg.json"), "--report", str(report)]) == 0
    assert f"{SCRAPE} (saved scrape, totals): 385 drafts" in capsys.readouterr().out
    rep = json.loads(report.read_text())
    assert rep["window_s"] == 0.0 and rep["counters"]["num_drafts"] == 385
