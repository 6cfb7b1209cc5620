"""τ is defined once (metrics.py, vLLM's: 1 + accepted / drafts): `generate --json`, the bench JSON
and the server's /metrics (read as the monitor reads it) report the same τ for the same greedy
requests on the tiny model, including steps where the n-gram drafter found nothing to propose
(the case where 1 + accepted / steps and 1 + accepted / drafts differ)."""

import json

import httpx

from serving import MODEL, serve
from specdecode.backends.precision import FP32
from specdecode.bench import suite as bench
from specdecode.cli import main
from specdecode.core.sampling import Warp
from specdecode.corpora import Prompt
from specdecode.drafters import parse
from specdecode.monitor import prom
from specdecode.monitor.tracker import group_counts, spec_series

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Hello, world! How are you today?",
    "One two three four five six seven eight nine ten. One two three",
    "The dog. The dog. The dog.",
]
MAX_NEW, K, DRAFTER = 40, 4, "ngram:1-2"  # the random tiny model rarely repeats: 1-grams find some matches


def test_tau_from_generate_bench_and_metrics_agree(capsys, tmp_path, tiny_model_dir, target):
    prompt_file = tmp_path / "prompts.jsonl"
    prompt_file.write_text(
        "".join(json.dumps({"prompt": p, "id": str(i)}) + "\n" for i, p in enumerate(PROMPTS))
    )

    assert (
        main(
            [
                "generate",
                "--prompt-file",
                str(prompt_file),
                "--target",
                tiny_model_dir,
                "--drafter",
                DRAFTER,
                "--k",
                str(K),
                "--max-new-tokens",
                str(MAX_NEW),
                "--json",
            ]
        )
        == 0
    )
    cli = [json.loads(line)["stats"] for line in capsys.readouterr().out.strip().splitlines()]
    drafts, accepted = sum(s["drafts"] for s in cli), sum(s["accepted"] for s in cli)
    steps = sum(s["target_forwards"] - 1 for s in cli)
    assert (
        0 < drafts < steps and accepted > 0
    )  # some steps drafted nothing: the two candidate definitions differ
    tau = 1 + accepted / drafts
    assert 1 + accepted / steps < tau
    for s in cli:
        assert s["mean_accepted_length"] == round(1 + s["accepted"] / s["drafts"], 4)

    report = bench.run(
        [Prompt(p, str(i)) for i, p in enumerate(PROMPTS)],
        [parse(DRAFTER)],
        target=tiny_model_dir,
        precisions=[FP32],
        device=None,
        ks=[K],
        params=Warp(),
        max_new_tokens=MAX_NEW,
        log=lambda message: None,
    )
    row = next(r for r in report["rows"] if r["drafter"] == DRAFTER and r["category"] == "ALL")
    assert row["mean_accepted_length"] == round(tau, 4)

    with serve(target, drafter=DRAFTER, k=K, load_control=False) as srv:
        for p in PROMPTS:
            response = httpx.post(
                srv.url + "/v1/chat/completions",
                timeout=60,
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": p}],
                    "max_tokens": MAX_NEW,
                    "temperature": 0,
                },
            )
            assert response.status_code == 200, response.text
        scrape = httpx.get(srv.url + "/metrics").text
        stats = httpx.get(srv.url + "/stats").json()["spec_decode"]
    _, series = spec_series(prom.parse(scrape))
    counts = group_counts(series, None)["all"]
    assert (counts.drafts, counts.accepted) == (drafts, accepted)
    assert round(counts.tau, 4) == round(tau, 4) == stats["mean_acceptance_length"]
