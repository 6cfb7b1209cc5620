"""k = 1..K on a real vLLM with one exported drafter, measured so that a shared machine's noise does not
pick the winner, against the k `specdecode advise --from-metrics` picks.

Servers for different k cannot share one process. As many as memory allows (--alive; small KV
caches, the model in the engine core process) run at once, each started on --start-cpus and then
pinned, every thread, to --taskset; idle ones wait on sockets. When all fit they are started once;
otherwise each round starts its k in groups of --alive, in the round's order. Then
rounds: each round sends the same traffic (the prompts greedy, one client) to every k in a fresh
random order. Per measurement it records the throughput (output tokens / wall seconds), vLLM's own
step time (the increase of its inter-token latency sum / count) and tokens drafted per step, the
acceptance, the server's CPU seconds, the load average before and after, and the outside load on
the measured core: (that core's busy time in /proc/stat - the CPU time of our servers) / wall.
A round in which any measurement saw more than --max-outside-cores of outside load is discarded;
per k the medians over the kept rounds decide the best k (over all rounds, flagged, when fewer than
two rounds are kept). The tokens per server-CPU-second beside it barely move with contention.

Advice, all from vLLM's own figures: acceptance from the largest k's counters (totals); costs from
the step times of (a) every k's final scrape (the CLI: `advise --step-costs-from`; the last
round's servers when they restart per round), (b) the kept
rounds' median step times, (c) the runs at the smallest and largest k only (the cheap recipe: two
servers). Each advised k is scored by its measured median against the best.

  python3 scripts/vllm_k_sweep.py --drafter eagle --ks 1,2,3,4,5,6 --rounds 8 --until 09:45 \\
      --vllm-args=-O0 --out docs/results/X.json
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent / "src")]
from specdecode.decoding.control import best_k  # noqa: E402
from specdecode.decoding.step_fit import StepTiming, fit_step_costs  # noqa: E402
from specdecode.monitor import advice, prom, step_costs  # noqa: E402
from specdecode.monitor.tracker import Tracker  # noqa: E402
from vllm_e2e import ROOT, _chat, _export, load_prompts, vllm_local  # noqa: E402


def cpu_busy_s(cpu: int) -> float:
    """Seconds core `cpu` has been busy since boot (/proc/stat: all but idle and iowait)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            ticks = [int(x) for x in line.split()[1:]]
            return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
    raise SystemExit(f"no cpu{cpu} in /proc/stat")


def available_gib() -> float:
    line = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemAvailable"))
    return int(line.split()[1]) / 2**20


def export_all(args, ks, work: Path) -> None:
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda k: _export(args.drafter, k, work / f"k{k}", args.port + k), ks))


def start_all(args, ks, work: Path, stack: contextlib.ExitStack) -> dict[int, vllm_local.VllmServer]:
    """Start one server per k (exported), in parallel, each pinned to --taskset once it answers."""
    env = vllm_local.cpu_env(args.threads, args.cpus, kv_cache_gib=1)
    del env["VLLM_CPU_KVCACHE_SPACE"]  # it would override --kv-cache-memory-bytes (whole GiB only)
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the model runs in the engine core: one process less
    extra = ("--generation-config", "vllm", "--max-num-seqs", "1", "--kv-cache-memory-bytes", args.kv_cache)
    extra += tuple(args.vllm_args.split())

    def one(k: int):
        cm = vllm_local.started(
            work / f"k{k}" / "serve.sh",
            args.port + k,
            work / f"k{k}.log",
            extra_args=extra,
            env=env,
            taskset=args.start_cpus,
            timeout_s=args.start_timeout,
        )
        return cm, cm.__enter__()

    servers, errors = {}, []
    with ThreadPoolExecutor(len(ks)) as pool:
        for k, future in [(k, pool.submit(one, k)) for k in ks]:
            try:
                cm, server = future.result()
            except Exception as e:  # the others are still stopped by the stack
                errors.append(f"k={k}: {type(e).__name__}: {e}"[-1500:])
                continue
            stack.push(cm.__exit__)
            servers[k] = server
    if errors:
        raise SystemExit("\n".join(errors))
    with httpx.Client(timeout=600) as client:
        for server in servers.values():
            server.pin(args.taskset)
            model = client.get(server.url + "/v1/models").json()["data"][0]["id"]
            _chat(client, server.url, model, "Say hello.", 8)  # warm-up, outside every measurement
    return servers


def measure(args, prompts, servers, k: int, core: int) -> dict:
    """The prompts, greedy, one client, against the server for k -> one measurement."""
    server = servers[k]
    scrape = lambda: prom.parse(httpx.get(server.url + "/metrics", timeout=30).text)  # noqa: E731
    model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
    load_before, before = os.getloadavg(), step_costs.reading(scrape())
    cpu_before = {j: s.cpu_s() for j, s in servers.items()}
    busy_before, t0 = cpu_busy_s(core), time.perf_counter()
    with httpx.Client(timeout=600) as client:
        answers = [_chat(client, server.url, model, p.prompt, args.max_tokens) for p in prompts]
    wall = time.perf_counter() - t0
    busy = cpu_busy_s(core) - busy_before
    cpu = {j: s.cpu_s() - cpu_before[j] for j, s in servers.items()}
    after, load_after = step_costs.reading(scrape()), os.getloadavg()
    timing = step_costs.timing(after, before, f"k={k}")
    drafts = after.counts.drafts - before.counts.drafts
    accepted = after.counts.accepted - before.counts.accepted
    tokens = sum(a["usage"]["completion_tokens"] for a in answers if "usage" in a)
    return {
        "k": k,
        "errors": sum("error" in a for a in answers),
        "completion_tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 3),
        "step_s": round(timing.step_s, 5),
        "steps": timing.steps,
        "draft_tokens_per_step": round(timing.draft_tokens, 3),
        "tau": round(1 + accepted / drafts, 3) if drafts else None,
        "server_cpu_s": round(cpu[k], 2),
        "tokens_per_server_cpu_s": round(tokens / cpu[k], 3) if cpu[k] > 0 else None,
        "idle_servers_cpu_s": round(sum(v for j, v in cpu.items() if j != k), 2),
        "outside_cores": round(max(0.0, busy - sum(cpu.values())) / wall, 3),
        "load1_before": round(load_before[0], 2),
        "load1_after": round(load_after[0], 2),
    }


def _median(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(values), 4) if values else None


def summary(ks, measurements, kept_rounds) -> dict[int, dict]:
    out = {}
    round_median = {
        r: statistics.median(m["tokens_per_s"] for m in measurements if m["round"] == r)
        for r in {m["round"] for m in measurements}
    }
    for k in ks:
        mine = [m for m in measurements if m["k"] == k]
        kept = [m for m in mine if m["round"] in kept_rounds]
        relative = [m["tokens_per_s"] / round_median[m["round"]] for m in kept or mine]
        out[k] = {
            "k": k,
            "in_medians": len(kept or mine),
            "measured": len(mine),
            "tokens_per_s": _median(kept or mine, "tokens_per_s"),
            "tokens_per_s_all_rounds": _median(mine, "tokens_per_s"),
            "tokens_per_s_min_max": [
                min(m["tokens_per_s"] for m in mine),
                max(m["tokens_per_s"] for m in mine),
            ]
            if mine
            else None,
            "step_s": _median(kept or mine, "step_s"),
            "draft_tokens_per_step": _median(kept or mine, "draft_tokens_per_step"),
            "tau": _median(kept or mine, "tau"),
            "tokens_per_server_cpu_s": _median(kept or mine, "tokens_per_server_cpu_s"),
            "relative_to_round_median": round(statistics.median(relative), 4) if relative else None,
            "outside_cores": _median(mine, "outside_cores"),
        }
    return out


def analyse(ks, measurements, failed, max_outside_cores) -> dict:
    """Measurements -> kept rounds, per-k medians and the best k (by wall-clock tokens/s medians)."""
    rounds = sorted({m["round"] for m in measurements})
    noisy = {m["round"] for m in measurements if m["outside_cores"] > max_outside_cores}
    kept = [r for r in rounds if r not in noisy and r not in {m["round"] for m in failed}]
    per_k = summary(ks, measurements, set(kept) if len(kept) >= 2 else set(rounds))
    best = max((r for r in per_k.values() if r["tokens_per_s"]), key=lambda r: r["tokens_per_s"])
    return {
        "rounds": len(rounds),
        "rounds_kept": kept,
        "medians_over": "kept rounds" if len(kept) >= 2 else "all rounds (fewer than two rounds kept)",
        "per_k": per_k,
        "best": best,
    }


def cli_advice(args, scrapes: dict[int, Path], acceptance_from: Path, cost_ks, name: str) -> dict:
    """`specdecode advise --from-metrics <largest k> --step-costs-from <the scrapes at cost_ks>`."""
    out = acceptance_from.parent / f"advice_{name}"
    argv = [sys.executable, "-m", "specdecode", "advise", "--from-metrics", str(acceptance_from)]
    argv += ["--window", "0", "--drafter", args.drafter, "--k-max", str(max(scrapes)), "--dtype", "fp32"]
    argv += ["--step-costs-from", ",".join(str(scrapes[k]) for k in cost_ks)]
    argv += ["--out", str(out.with_suffix(".config.json")), "--report", str(out.with_suffix(".json"))]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    if done.returncode:
        return {"error": done.stderr[-2000:]}
    report = json.loads(out.with_suffix(".json").read_text())
    return {"argv": " ".join(argv[2:]), "stdout": done.stdout, **report}


def kept_rounds_advice(acceptance_from: Path, per_k: dict[int, dict], k_max: int) -> dict:
    """The same choice in-process, with costs from the kept rounds' median step times."""
    samples = prom.parse(acceptance_from.read_text())
    prof = advice.profile(Tracker().update(0.0, samples).groups["all"].total)
    timings = [StepTiming(r["draft_tokens_per_step"], r["step_s"]) for r in per_k.values() if r["step_s"]]
    fit = fit_step_costs(timings)
    k, speedup = best_k(prof.acceptance, fit.cost_model(), k_max)
    return {"k": k, "predicted_tokens_per_s": round(speedup / fit.base_s, 3), "fit": fit.to_json()}


def scored(advised: dict, per_k: dict[int, dict], best: dict) -> dict:
    """The advised k's medians as fractions of the best k's: wall-clock tokens/s (the goal's figure),
    and, as cross-checks less moved by contention, the tokens/s relative to each round's median and
    the tokens per server CPU second (each against the best k by that figure)."""
    k = advised.get("k")
    row = per_k.get(k)
    if row is None or not row["tokens_per_s"]:
        return {"k": k, "tokens_per_s": None, "of_best": None}
    top = lambda key: max(r[key] for r in per_k.values() if r[key])  # noqa: E731
    return {
        "k": k,
        "tokens_per_s": row["tokens_per_s"],
        "of_best": round(row["tokens_per_s"] / best["tokens_per_s"], 3),
        "of_best_relative_to_round": round(
            row["relative_to_round_median"] / top("relative_to_round_median"), 3
        ),
        "of_best_per_server_cpu_s": round(row["tokens_per_server_cpu_s"] / top("tokens_per_server_cpu_s"), 3),
    }


def reanalyse(path: Path, max_outside_cores: float) -> None:
    """A result file's measurements analysed again (the summary's figures, a threshold), advice kept."""
    result = json.loads(path.read_text())
    ks = [r["k"] for r in result["per_k"]]
    found = analyse(ks, result["measurements"], result["failed"], max_outside_cores)
    result["conditions"]["max_outside_cores"] = max_outside_cores
    result.update({**found, "per_k": list(found["per_k"].values())})
    result["advised"] = {n: scored(a, found["per_k"], found["best"]) for n, a in result["advice"].items()}
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"best": found["best"], "advised": result["advised"]}, indent=1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", default="eagle")
    p.add_argument("--ks", default="1,2,3,4,5,6")
    p.add_argument("--prompts", default="heldout:1")
    p.add_argument("--n-prompts", type=int, default=8, help="the first N prompts of the set")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--until", help="UTC HH:MM: start no round after it")
    p.add_argument("--max-outside-cores", type=float, default=0.25, help="outside load that discards a round")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cpus", default="1", help="vLLM's OpenMP thread binding")
    p.add_argument("--taskset", default="1", help="the one core every server is pinned to once started")
    p.add_argument("--start-cpus", default="0-1", help="where servers start (in parallel)")
    p.add_argument(
        "--kv-cache", default="256M", help="each server's KV cache (4096 tokens of the default target)"
    )
    p.add_argument("--gib-per-server", type=float, default=2.5, help="memory one server needs")
    p.add_argument(
        "--alive", type=int, default=0, help="servers running at once (0: as many as memory allows)"
    )
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--port", type=int, default=8130, help="the server for k listens on port + k")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vllm-args", default="", help="more vllm serve arguments, e.g. -O0 (no torch.compile)")
    p.add_argument("--machine", default="", help="the machine, in words, for the result file")
    p.add_argument("--out", required=True)
    p.add_argument("--reanalyse", action="store_true", help="analyse --out's measurements again, run nothing")
    args = p.parse_args()
    if args.reanalyse:
        return reanalyse(Path(args.out), args.max_outside_cores) or 0
    if not args.taskset.isdigit():
        raise SystemExit("--taskset must be one core (the outside load is measured on it)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on kill too
    prompts = load_prompts(args.prompts)[: args.n_prompts]
    ks = [int(k) for k in args.ks.split(",")]
    until = None
    if args.until:
        now = datetime.datetime.now(datetime.timezone.utc)
        h, m = (int(x) for x in args.until.split(":"))
        until = now.replace(hour=h, minute=m, second=0, microsecond=0).timestamp()
    alive = args.alive or max(1, min(len(ks), int((available_gib() - 3) / args.gib_per_server)))
    work = Path(tempfile.mkdtemp(prefix="vllm_sweep_"))
    rng, measurements, failed, orders = random.Random(args.seed), [], [], []
    conditions = {"load1_at_start": os.getloadavg()[0], "servers_alive_at_once": alive, "starts": []}
    export_all(args, ks, work)
    scrapes: dict[int, Path] = {}

    def measure_all(servers, r: int, order: list[int], first: int) -> None:
        for i, k in enumerate(order, first):
            try:
                m = {"round": r, "position": i, **measure(args, prompts, servers, k, int(args.taskset))}
                measurements.append(m)
            except Exception as e:  # recorded; its round is not kept
                m = {"round": r, "position": i, "k": k, "error": f"{type(e).__name__}: {e}"[-1000:]}
                failed.append(m)
            print(json.dumps(m), file=sys.stderr, flush=True)
        for k in order:  # totals since the server started (the last round's, when restarted per round)
            scrapes[k] = work / f"k{k}.metrics.txt"
            scrapes[k].write_text(httpx.get(servers[k].url + "/metrics").text)

    def start(group, stack) -> dict[int, vllm_local.VllmServer]:
        t0 = time.monotonic()
        servers = start_all(args, group, work, stack)
        conditions["starts"].append(
            {
                "ks": group,
                "start_s": round(time.monotonic() - t0, 1),
                "memory_available_gib": round(available_gib(), 1),
                "server_pss_gib": {k: round(s.pss_gib(), 2) for k, s in servers.items()},
            }
        )
        return servers

    with contextlib.ExitStack() as keep:
        servers = start(ks, keep) if alive >= len(ks) else None  # all alive: started once
        for r in range(args.rounds):
            if until and time.time() > until:
                break
            if available_gib() < 1.5:  # never push the machine's other workers into the OOM killer
                conditions["stopped"] = f"round {r}: {available_gib():.1f} GiB available"
                break
            order = rng.sample(ks, len(ks))
            orders.append(order)
            if servers:
                measure_all(servers, r, order, 0)
                continue
            for first in range(0, len(order), alive):  # groups of `alive` servers, started for this round
                with contextlib.ExitStack() as stack:
                    group = order[first : first + alive]
                    measure_all(start(group, stack), r, group, first)
    found = analyse(ks, measurements, failed, args.max_outside_cores)
    per_k, best, k_max = found["per_k"], found["best"], max(ks)
    Path(args.out).with_suffix(".measurements.json").write_text(json.dumps(measurements + failed, indent=1))
    advices = {}
    for name, make in [
        ("all_scrapes_cli", lambda: cli_advice(args, scrapes, scrapes[k_max], ks, "all")),
        ("kept_rounds_medians", lambda: kept_rounds_advice(scrapes[k_max], per_k, k_max)),
        ("two_runs_cli", lambda: cli_advice(args, scrapes, scrapes[k_max], [min(ks), k_max], "two")),
    ]:
        try:
            advices[name] = make()
        except Exception as e:
            advices[name] = {"error": f"{type(e).__name__}: {e}"}
    result = {
        "drafter": args.drafter,
        "prompts": f"{args.prompts} (first {len(prompts)})",
        "n_prompts": len(prompts),
        "clients": 1,
        "max_tokens": args.max_tokens,
        "vllm_threads": args.threads,
        "taskset": args.taskset,
        "vllm_args": args.vllm_args,
        "machine": args.machine,
        "design": __doc__.split("\n\n")[1].replace("\n", " "),
        "conditions": {
            **conditions,
            "load1_at_end": os.getloadavg()[0],
            "max_outside_cores": args.max_outside_cores,
        },
        **found,
        "orders": orders,
        "per_k": list(per_k.values()),
        "advice": advices,
        "advised": {name: scored(a, per_k, best) for name, a in advices.items()},
        "measurements": measurements,
        "failed": failed,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"best": best, "advised": result["advised"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
