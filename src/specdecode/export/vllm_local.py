"""A vLLM server on this machine, from the separate environment scripts/install_vllm.sh makes.

Used by the end-to-end checks (scripts/vllm_e2e.py), the load comparison (scripts/peer_load.py) and
the vLLM test: find the environment, run an export's serve.sh, wait (bounded) until it answers, and
stop it however the caller leaves. vLLM never runs inside specdecode's own environment: its pins
(transformers among them) differ from ours.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from specdecode.errors import UserError

VENV_VARIABLE = "VLLM_VENV"
DEFAULT_VENV = "/work/venvs/vllm"  # scripts/install_vllm.sh's default
START_TIMEOUT_S = 300.0  # vLLM CPU takes minutes to start on a small machine (docs/deployment.md)


def venv() -> Path | None:
    """The vLLM environment ($VLLM_VENV, else /work/venvs/vllm), or None when it has no python."""
    path = Path(os.environ.get(VENV_VARIABLE, DEFAULT_VENV))
    return path if (path / "bin" / "python").is_file() else None


def cpu_env(threads: int, cpus: str | None, kv_cache_gib: float) -> dict[str, str]:
    """vLLM CPU's environment: OpenMP threads bound to `cpus` (e.g. "1" or "0-1"), KV cache size."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "OMP_NUM_THREADS": str(threads)}
    env["VLLM_CPU_OMP_THREADS_BIND"] = cpus or "auto"
    return env


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass(frozen=True)
class VllmServer:
    url: str  # http://127.0.0.1:PORT
    pgid: int  # its process group: the API server, the engine core and their workers

    def pids(self) -> list[int]:
        """The processes of the server's group now alive."""
        return _group_pids(self.pgid)

    def cpu_s(self) -> float:
        """CPU seconds (user + system) its live processes have used, threads included."""
        tick, total = os.sysconf("SC_CLK_TCK"), 0.0
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        return total

    def pss_gib(self) -> float:
        """Its proportional set size (memory shared between processes counted once), GiB."""
        kib = 0
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError, StopIteration):
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                kib += int(next(ln for ln in rollup if ln.startswith("Pss:")).split()[1])
        return kib / 2**20

    def pin(self, cpus: str) -> None:
        """Move every thread of every process of the server onto `cpus` (e.g. "1")."""
        for pid in self.pids():
            subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True, check=False)


@contextlib.contextmanager
def serving(serve_sh: Path, port: int, log: Path, **options):
    """`started` -> its base URL only."""
    with started(serve_sh, port, log, **options) as server:
        yield server.url


@contextlib.contextmanager
def started(
    serve_sh: Path,
    port: int,
    log: Path,
    *,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    taskset: str | None = None,
    timeout_s: float = START_TIMEOUT_S,
):
    """Run `serve_sh` (an export's serve.sh, its --port given as `port`) until the block ends -> VllmServer.
    Raises UserError with the log's tail when it exits or does not answer /health within timeout_s."""
    where = venv()
    if where is None:
        raise UserError(
            f"no vLLM environment at ${VENV_VARIABLE} or {DEFAULT_VENV}: run scripts/install_vllm.sh"
        )
    argv = ["bash", str(serve_sh), *extra_args]
    if taskset:
        argv = ["taskset", "-c", taskset, *argv]
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, VENV_VARIABLE: str(where), **(env or {})},
            start_new_session=True,  # its own process group: stopped whole, workers included
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-25:])
                why = (
                    f"exited with {proc.returncode}"
                    if proc.poll() is not None
                    else f"no answer in {timeout_s:.0f} s"
                )
                raise UserError(f"vLLM ({serve_sh}) {why}; the end of {log}:\n{tail}")
            time.sleep(2)
        yield VllmServer(url, proc.pid)
    finally:
        _stop(proc)


def _group_pids(pgid: int) -> list[int]:
    """The live processes of group `pgid` (zombies, dead but not yet reaped, left out)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the name: state, ppid, pgrp, ...
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                out.append(int(stat.parent.name))
    return out


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 20 s; returns once every process of the
    group is gone (the leader's children outlive it by a moment: they are no longer its to wait for)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    for sig, grace_s in ((signal.SIGKILL, 20.0), (None, 10.0)):  # wait grace_s for the group, then send sig
        deadline = time.monotonic() + grace_s
        while (proc.poll() is None or _group_pids(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if proc.poll() is not None and not _group_pids(proc.pid):
            return
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
    proc.wait(timeout=1)
