"""The operations kit (issue 19): Prometheus rules pass `promtool check rules` and a promtool unit test
(alpha, tau, fallback share, alerts firing), and every metric the Grafana dashboard and the rules query
is one the server exports or a rule records. promtool comes with Debian's `prometheus` package; the
promtool tests are skipped where it is absent, except in CI (.ci/run installs it)."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from serving import MODEL, serve

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "specdecode-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "specdecode-dashboard.json"
PROMTOOL = shutil.which("promtool")
NAME = re.compile(r"specdecode:[a-z0-9_:]+")


@pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"),
    reason="promtool not installed (apt-get install prometheus)",
)
def test_rules_pass_promtool_check_and_unit_tests():
    assert PROMTOOL, "CI installs promtool (.ci/run): the rules claim is tested there"
    check = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [PROMTOOL, "test", "rules", "specdecode-rules-test.yml"],
        cwd=ROOT / "tests" / "fixtures",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_every_queried_metric_is_exported_or_recorded(target):
    rules = yaml.safe_load(RULES.read_text())["groups"]
    recorded = {r["record"] for g in rules for r in g["rules"] if "record" in r}
    exprs = [r["expr"] for g in rules for r in g["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    with serve(target, max_batch=2, load_control=False) as srv:
        httpx.post(
            srv.url + "/v1/completions",
            json={"model": MODEL, "prompt": "Hello Hello Hello", "max_tokens": 6, "temperature": 0},
            timeout=60,
        )
        exported = {
            line.split("{")[0].split(" ")[0]
            for line in httpx.get(srv.url + "/metrics").text.splitlines()
            if line and not line.startswith("#")
        }
    queried = {name for e in exprs for name in NAME.findall(e)}
    assert queried - recorded, "the rules query no exported metric"
    missing = {q for q in queried - recorded if q not in exported}
    assert not missing, f"queried but not exported: {sorted(missing)}"
    assert len(dashboard["panels"]) >= 6 and all(p["targets"] for p in dashboard["panels"])
