"""`specdecode monitor`: Prometheus text parsing, α/τ/per-position from recorded vLLM scrapes (with and
without `_total`, two engines, a restart), sliding windows, the drift alert, our own server's
counters, and live scraping of a local HTTP server."""

import http.server
import json
import threading
from pathlib import Path

import pytest

from specdecode import cli
from specdecode.monitor import prom
from specdecode.monitor.tracker import ALL, Tracker, spec_series
from specdecode.monitor.view import render, to_json

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
RECORDED = json.loads((FIXTURES / "metrics.json").read_text())["recordings"]


def scrape(name: str):
    return prom.parse((FIXTURES / name).read_text())


def test_parse_reads_names_labels_values_and_skips_comments():
    text = (
        "# HELP x_total a counter\n# TYPE x_total counter\n"
        'x_total{a="1",b="q\\"uote\\\\ and\\nnewline"} 3.0\n'
        "y 2.5e+01 1700000000\n\n"
        'h_bucket{le="+Inf"} +Inf\n'
    )
    samples = prom.parse(text)
    assert [(s.name, s.value) for s in samples] == [("x_total", 3.0), ("y", 25.0), ("h_bucket", float("inf"))]
    assert samples[0].label("b") == 'q"uote\\ and\nnewline' and samples[0].label("a") == "1"
    with pytest.raises(ValueError, match="line 1"):
        prom.parse('x{a="1" 3')
    with pytest.raises(ValueError, match="bad value"):
        prom.parse("x three")


@pytest.mark.parametrize("name", ["vllm_scrape_2.txt", "vllm_no_total_scrape_2.txt"])
def test_totals_of_a_recorded_vllm_scrape(name):
    """Two engines summed; the gauge, the histogram and the _created series are ignored."""
    expected = RECORDED["vllm_scrape_2.txt"]
    prefix, series = spec_series(scrape(name))
    assert prefix == "vllm:"
    assert len(series) == 2 * (3 + 4)  # two engines x (3 counters + 4 positions)
    total = Tracker().update(0.0, scrape(name)).groups[ALL].total
    assert (total.drafts, total.draft_tokens, total.accepted) == (150, 600, 330)
    assert total.alpha == pytest.approx(330 / 600) and total.tau == pytest.approx(1 + 330 / 150)
    assert total.by_position == pytest.approx([p / 150 for p in expected["per_pos"]])


def test_with_and_without_total_suffix_read_the_same_series():
    assert spec_series(scrape("vllm_scrape_1.txt")) == spec_series(scrape("vllm_no_total_scrape_1.txt"))


def test_window_of_increases_and_a_restart():
    tracker = Tracker(window_s=60, min_draft_tokens=1e9)
    first = tracker.update(0.0, scrape("vllm_scrape_1.txt"))
    assert first.groups[ALL].window is None and first.scrapes == 0
    second = (
        tracker.update(10.0, scrape("vllm_no_total_scrape_2.txt")).groups[ALL].window
    )  # the suffix may change
    assert (second.drafts, second.draft_tokens, second.accepted) == (50, 200, 80)
    assert second.alpha == pytest.approx(0.4) and second.tau == pytest.approx(2.6)
    assert second.by_position == pytest.approx([0.8, 0.5, 0.2, 0.1])
    snap = tracker.update(
        20.0, scrape("vllm_scrape_3_restarted.txt")
    )  # every counter went down: new values count
    window = snap.groups[ALL].window
    assert snap.resets == 1 and snap.scrapes == 2 and snap.window_s == pytest.approx(20)
    assert (window.drafts, window.draft_tokens, window.accepted) == (70, 280, 110)
    assert window.alpha == pytest.approx(110 / 280) and window.tau == pytest.approx(1 + 110 / 70)
    assert snap.groups[ALL].total.drafts == 20  # totals are the counters as scraped


def test_window_slides():
    tracker = Tracker(window_s=10, min_draft_tokens=1e9)
    for t, name in [(0, "vllm_scrape_1.txt"), (10, "vllm_scrape_2.txt"), (20, "vllm_scrape_3_restarted.txt")]:
        snap = tracker.update(float(t), scrape(name))
    window = snap.groups[ALL].window
    assert snap.scrapes == 1 and (window.drafts, window.draft_tokens, window.accepted) == (20, 80, 30)
    assert window.alpha == pytest.approx(0.375) and window.tau == pytest.approx(2.5)


def _samples(drafts, tokens, accepted, per_pos=(), engine="0", prefix="vllm:"):
    lines = [
        f'{prefix}spec_decode_num_drafts_total{{engine="{engine}"}} {drafts}',
        f'{prefix}spec_decode_num_draft_tokens_total{{engine="{engine}"}} {tokens}',
        f'{prefix}spec_decode_num_accepted_tokens_total{{engine="{engine}"}} {accepted}',
    ]
    lines += [
        f'{prefix}spec_decode_num_accepted_tokens_per_pos_total{{engine="{engine}",position="{i}"}} {v}'
        for i, v in enumerate(per_pos)
    ]
    return "\n".join(lines) + "\n"


def test_reset_is_per_series():
    """Engine 1 restarts, engine 0 keeps counting: only engine 1's new value replaces its delta."""
    tracker = Tracker(window_s=100, min_draft_tokens=1e9)
    tracker.update(0.0, prom.parse(_samples(100, 400, 200, engine="0") + _samples(50, 200, 100, engine="1")))
    snap = tracker.update(
        5.0, prom.parse(_samples(110, 440, 230, engine="0") + _samples(4, 16, 6, engine="1"))
    )
    window = snap.groups[ALL].window
    assert snap.resets == 1
    assert (window.drafts, window.draft_tokens, window.accepted) == (10 + 4, 40 + 16, 30 + 6)


def test_drift_alert_uses_the_adaptive_threshold():
    """Baseline: the first full window's α; alert while the windowed α is below baseline × (1 − 0.25)."""
    tracker = Tracker(window_s=10, min_draft_tokens=40)
    drafts = tokens = accepted = 0
    alerts = []
    # per 10 s: 10 drafts of 4 tokens; α 0.6, then 0.45 (= 0.75 × 0.6: not below), then 0.3
    for t, acc in [(0, 0), (10, 24), (20, 24), (30, 18), (40, 12), (50, 12)]:
        if t:
            drafts, tokens, accepted = drafts + 10, tokens + 40, accepted + acc
        snap = tracker.update(float(t), prom.parse(_samples(drafts, tokens, accepted)))
        alerts.append((snap.groups[ALL].baseline_alpha, snap.groups[ALL].drift_alert))
    assert alerts[1] == (pytest.approx(0.6), False)
    assert [a for _, a in alerts] == [False, False, False, False, True, True]
    assert to_json(snap, "x")["drift_alert"] is True


def test_no_alert_on_thin_windows_and_a_given_baseline():
    tracker = Tracker(window_s=10, baseline_alpha=0.9, min_draft_tokens=100)
    tracker.update(0.0, prom.parse(_samples(0, 0, 0)))
    snap = tracker.update(10.0, prom.parse(_samples(10, 40, 4)))  # α 0.1 but only 40 draft tokens
    assert snap.groups[ALL].baseline_alpha == 0.9 and not snap.groups[ALL].drift_alert
    snap = tracker.update(20.0, prom.parse(_samples(40, 160, 16)))
    assert snap.groups[ALL].drift_alert


def test_reads_our_own_server_counters_per_task():
    from specdecode.engine.metrics import ServerMetrics

    m = ServerMetrics("tiny")
    for task, drafted, accepted in [("code", 4, 4), ("code", 4, 2), ("qa", 3, 0), ("qa", 2, 1)]:
        m.observe_step(task, "ngram", drafted, accepted, accepted + 1)
    snap = Tracker(by="task").update(0.0, prom.parse(m.prometheus_text().decode()))
    stats = m.stats()
    assert snap.prefix == "specdecode:"
    total = snap.groups[ALL].total
    assert total.alpha == pytest.approx(stats["spec_decode"]["acceptance_rate"], abs=1e-4)
    assert total.tau == pytest.approx(stats["spec_decode"]["mean_acceptance_length"], abs=1e-4)
    assert snap.groups["code"].total.alpha == pytest.approx(6 / 8)
    assert snap.groups["qa"].total.tau == pytest.approx(1 + 1 / 2)
    assert snap.groups["code"].total.by_position == pytest.approx([1.0, 1.0, 0.5, 0.5])


def test_live_view_renders_the_numbers_and_the_alert():
    from rich.console import Console

    tracker = Tracker(window_s=10, baseline_alpha=0.9, min_draft_tokens=1)
    tracker.update(0.0, scrape("vllm_scrape_1.txt"))
    snap = tracker.update(10.0, scrape("vllm_scrape_2.txt"))
    console = Console(record=True, width=140)
    console.print(render(snap, "http://gpu:8000/metrics"))
    text = console.export_text()
    assert "0.400" in text and "2.60" in text and "0.550" in text and "ALERT" in text and "vllm:" in text


class _Server(http.server.ThreadingHTTPServer):
    """Serves the recorded scrapes in order (the last one repeated) at /metrics."""

    def __init__(self, texts):
        self.texts, self.served = texts, 0
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/metrics":
            self.send_error(404)
            return
        body = self.server.texts[min(self.server.served, len(self.server.texts) - 1)].encode()
        self.server.served += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    texts = [
        (FIXTURES / n).read_text()
        for n in ("vllm_scrape_1.txt", "vllm_scrape_2.txt", "vllm_scrape_3_restarted.txt")
    ]
    srv = _Server(texts)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_monitor_scrapes_a_live_http_endpoint(server, capsys):
    host, port = server.server_address
    code = cli.main(
        ["monitor", f"{host}:{port}", "--json", "--count", "3", "--interval", "0.05", "--window", "60"]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and server.served == 3 and len(lines) == 3
    assert lines[0]["window"] is None and lines[0]["total"]["acceptance_rate"] == pytest.approx(0.625)
    assert lines[1]["window"]["acceptance_rate"] == pytest.approx(0.4)
    assert lines[1]["window"]["mean_acceptance_length"] == pytest.approx(2.6)
    assert lines[1]["window"]["acceptance_by_position"] == pytest.approx([0.8, 0.5, 0.2, 0.1])
    assert lines[2]["resets"] == 1 and lines[2]["window"]["num_draft_tokens"] == 280
    assert lines[2]["source"] == f"{host}:{port}"


def test_a_failed_scrape_mid_run_is_reported_and_monitoring_continues(server, capsys):
    host, port = server.server_address
    url = f"http://{host}:{port}/metrics"
    server.texts[1] = "not prometheus {"
    code = cli.main(["monitor", url, "--json", "--count", "3", "--interval", "0.05"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and "not Prometheus text" in lines[1]["error"]
    assert lines[2]["resets"] == 1  # scrape 3 (restarted) compared with scrape 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["monitor", "http://127.0.0.1:9/metrics", "--once", "--timeout", "2"], "cannot scrape"),
        (["monitor", str(FIXTURES / "speculative_config.json"), "--once"], "not Prometheus text"),
        (["monitor", str(FIXTURES / "vllm_scrape_1.txt"), "--once", "--drift-drop", "1.5"], "--drift-drop"),
    ],
)
def test_user_errors(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_once_without_spec_decode_counters_is_an_error(tmp_path, capsys):
    (tmp_path / "m.txt").write_text('vllm:num_requests_running{engine="0"} 1.0\n')
    assert cli.main(["monitor", f"file://{tmp_path / 'm.txt'}", "--once"]) == 2
    assert "no spec_decode counters" in capsys.readouterr().err
