"""vllm_local: the vLLM environment is found by $VLLM_VENV; a server script is waited for on /health
(bounded), its whole process group stopped afterwards, and a script that dies is a clear error with
its log's tail. Stand-in scripts, no vLLM needed."""

import os
import socket
import sys
import textwrap

import httpx
import pytest

from specdecode.errors import UserError
from specdecode.export import vllm_local


@pytest.fixture
def venv(tmp_path, monkeypatch):
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setenv(vllm_local.VENV_VARIABLE, str(tmp_path / "venv"))
    return tmp_path / "venv"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_venv_is_none_without_a_python(tmp_path, monkeypatch):
    monkeypatch.setenv(vllm_local.VENV_VARIABLE, str(tmp_path / "nowhere"))
    assert vllm_local.venv() is None
    with pytest.raises(UserError, match="install_vllm.sh"):
        with vllm_local.serving(tmp_path / "serve.sh", 1, tmp_path / "log"):
            pass


def test_serving_waits_for_health_and_stops_the_process_group(venv, tmp_path):
    port = _port()
    server = textwrap.dedent(f"""
        import http.server, os
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers(); self.wfile.write(str(os.getpid()).encode())
        http.server.HTTPServer(("127.0.0.1", {port}), H).serve_forever()
    """)
    (tmp_path / "server.py").write_text(server)
    script = tmp_path / "serve.sh"
    script.write_text(f'sleep 1; exec "$VLLM_VENV/bin/python" {tmp_path / "server.py"} "$@"\n')
    with vllm_local.serving(script, port, tmp_path / "log", extra_args=("--x",), timeout_s=30) as url:
        pid = int(httpx.get(url + "/health").text)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_server_that_dies_is_an_error_with_its_log(venv, tmp_path):
    script = tmp_path / "serve.sh"
    script.write_text('echo "ValueError: Following weights were not initialized"; exit 3\n')
    with pytest.raises(UserError, match="exited with 3(.|\n)*not initialized"):
        with vllm_local.serving(script, _port(), tmp_path / "log", timeout_s=30):
            pass


def test_started_server_reports_its_processes_memory_cpu_time_and_can_be_pinned(venv, tmp_path):
    port = _port()
    busy = textwrap.dedent(f"""
        import http.server, time
        t = time.process_time()
        while time.process_time() - t < 0.3:  # some CPU time to account for
            pass
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()
        http.server.HTTPServer(("127.0.0.1", {port}), H).serve_forever()
    """)
    (tmp_path / "server.py").write_text(busy)
    script = tmp_path / "serve.sh"
    script.write_text(f'"$VLLM_VENV/bin/python" {tmp_path / "server.py"} & wait\n')  # a child in its group
    with vllm_local.started(script, port, tmp_path / "log", timeout_s=30) as server:
        pids = server.pids()
        assert server.pgid in pids and len(pids) == 2
        assert server.cpu_s() >= 0.25 and 0 < server.pss_gib() < 1
        server.pin("0")
        assert all(os.sched_getaffinity(pid) == {0} for pid in pids)
    assert server.pids() == []
