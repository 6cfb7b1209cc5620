"""`specdecode audit`: for each drafter and temperature, sample the first m tokens of every prompt n
times without speculation and n times with it (each sample its own seed; the two sets' seeds
differ, so the samples are independent), compare the two samples (stats.py: per-position marginals
and the first-two-token joint, permutation p-value), and check greedy identity over the prompts.

Two sources of completions: a loaded target (LocalSource: the Python API, batched core) or a
running server (ServerSource: per-request `speculative` off vs on, docs/server.md). With a format
(structured outputs: JSON schema, regex, grammar) both ways are constrained: the audit then checks that
speculation under the grammar samples exactly what constrained sampling without it does.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from specdecode.api import LLM, SamplingParams, StructuredOutputs
from specdecode.audit import stats
from specdecode.errors import UserError

PLAIN = "none"


@dataclass
class Drawn:
    """One prompt's completions from one source, drafter and temperature."""

    outcomes: list  # token id lists (local) or texts (server)
    drafted: int = 0
    accepted: int = 0


class LocalSource:
    """Completions from a loaded target; each drafter shares its weights, batch core and prefix cache."""

    def __init__(self, llm: LLM, k: int):
        self.llm, self.k, self.llms = llm, k, {}

    def view(self, m: int) -> Callable:
        return stats.token_views(m)

    def _with(self, drafter: str) -> LLM:
        if drafter not in self.llms:
            self.llms[drafter] = self.llm.with_drafter(drafter, self.k)
        return self.llms[drafter]

    def draw(
        self,
        drafter: str,
        prompt: str,
        temperature: float,
        seeds: range,
        m: int,
        chat,
        fmt: StructuredOutputs | None = None,
    ) -> Drawn:
        params = [
            SamplingParams(temperature=temperature, max_tokens=m, seed=s, structured_outputs=fmt)
            for s in seeds
        ]
        outs = self._with(drafter).generate([prompt] * len(params), params, chat=chat)
        return Drawn(
            [o.token_ids for o in outs],
            sum(o.metrics.drafted for o in outs),
            sum(o.metrics.accepted for o in outs),
        )


class ServerSource:
    """Completions from a running specdecode server (/v1/completions), speculation chosen per request."""

    def __init__(self, url: str, api_key: str | None = None, k: int | None = None, concurrency: int = 8):
        self.url, self.api_key, self.k, self.concurrency = url.rstrip("/"), api_key, k, concurrency
        self.model = self._call("GET", "/v1/models")["data"][0]["id"]

    def view(self, m: int) -> Callable:
        return stats.text_view

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise UserError(f"server {self.url}{path}: HTTP {e.code}: {e.read().decode()[:300]}") from None
        except (urllib.error.URLError, OSError) as e:
            raise UserError(f"cannot reach the server at {self.url}: {e}") from None

    def draw(
        self,
        drafter: str,
        prompt: str,
        temperature: float,
        seeds: range,
        m: int,
        chat,
        fmt: StructuredOutputs | None = None,
    ) -> Drawn:
        spec = {"enabled": False} if drafter == PLAIN else {"drafter": drafter}
        if self.k is not None and drafter != PLAIN:
            spec["k"] = self.k
        path = "/v1/chat/completions" if chat else "/v1/completions"
        base = {"model": self.model, "max_tokens": m, "temperature": temperature, "speculative": spec}
        base |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
        if fmt is not None:
            base["response_format"] = fmt.to_response_format()
        with ThreadPoolExecutor(self.concurrency) as pool:
            answers = list(pool.map(lambda s: self._call("POST", path, {**base, "seed": s}), seeds))
        texts = [a["choices"][0]["message"]["content"] if chat else a["choices"][0]["text"] for a in answers]
        used = [a["usage"]["speculative"] for a in answers]
        return Drawn(
            texts, sum(u["num_draft_tokens"] for u in used), sum(u["num_accepted_tokens"] for u in used)
        )


@dataclass
class ReportRow:
    drafter: str
    temperature: float
    drafted: int  # draft tokens over the speculative samples (0: the drafter was never tested)
    accepted: int
    tv: float  # the statistic: mean over prompts of the largest view TV
    views: dict[str, float]  # mean TV per view
    p_value: float
    p_holm: float = 1.0  # adjusted over every row of the report


@dataclass
class Report:
    source: str
    prompts: int
    samples: int
    tokens: int
    permutations: int
    seed: int
    alpha: float
    response_format: dict | None = None  # both ways constrained by this format (None: free text)
    rows: list[ReportRow] = field(default_factory=list)
    greedy: dict[str, list[bool]] = field(default_factory=dict)  # drafter -> per prompt: identical to plain

    @property
    def passed(self) -> bool:
        return all(r.p_holm >= self.alpha for r in self.rows) and all(all(v) for v in self.greedy.values())

    def to_json(self) -> dict:
        return asdict(self) | {"passed": self.passed}


def audit(
    source: LocalSource | ServerSource,
    prompts: list[str],
    drafters: list[str],
    temperatures: list[float],
    *,
    samples: int = 200,
    tokens: int = 4,
    greedy_tokens: int = 32,
    permutations: int = 1000,
    seed: int = 0,
    alpha: float = 0.01,
    chat: bool | None = False,
    fmt: StructuredOutputs | None = None,
    name: str = "",
    log: Callable[[str], None] = lambda m: None,
) -> Report:
    """The audit of every drafter at every temperature (> 0) on `prompts`, plus greedy identity; fmt:
    structured outputs both ways (the draws are then constrained sampling with and without speculation)."""
    if samples < 2 or tokens < 1 or permutations < 1:
        raise UserError("audit: --samples >= 2, --tokens >= 1 and --permutations >= 1")
    if not prompts or not drafters:
        raise UserError("audit: no prompts or no drafters")
    report = Report(name, len(prompts), samples, tokens, permutations, seed, alpha)
    report.response_format = fmt.to_response_format() if fmt is not None else None
    rng = np.random.default_rng(seed)
    plain_seeds = range(seed, seed + samples)
    spec_seeds = range(seed + samples, seed + 2 * samples)  # disjoint: the two samples are independent
    for t in [t for t in temperatures if t > 0]:
        plain = [source.draw(PLAIN, p, t, plain_seeds, tokens, chat, fmt).outcomes for p in prompts]
        for drafter in drafters:
            drawn = [source.draw(drafter, p, t, spec_seeds, tokens, chat, fmt) for p in prompts]
            c = stats.compare(plain, [d.outcomes for d in drawn], source.view(tokens), permutations, rng)
            row = ReportRow(
                drafter,
                t,
                sum(d.drafted for d in drawn),
                sum(d.accepted for d in drawn),
                round(c.tv, 4),
                {k: round(v, 4) for k, v in c.views.items()},
                c.p_value,
            )
            report.rows.append(row)
            log(f"audit: {drafter} at T={t}: TV {c.tv:.3f}, p {c.p_value:.3f} ({row.drafted} drafted)")
    for row, adjusted in zip(report.rows, stats.holm([r.p_value for r in report.rows])):
        row.p_holm = round(adjusted, 4)
    if greedy_tokens > 0:
        plain = [source.draw(PLAIN, p, 0.0, range(1), greedy_tokens, chat, fmt).outcomes[0] for p in prompts]
        for drafter in drafters:
            spec = [
                source.draw(drafter, p, 0.0, range(1), greedy_tokens, chat, fmt).outcomes[0] for p in prompts
            ]
            report.greedy[drafter] = [a == b for a, b in zip(plain, spec)]
    return report


def render(report: Report) -> str:
    lines = [
        f"audit of {report.source}: {report.prompts} prompts, {report.samples} samples of the first "
        f"{report.tokens} tokens each way, {report.permutations} permutations"
        + (
            f", both ways constrained by {json.dumps(report.response_format)}"
            if report.response_format
            else ""
        ),
        "",
        "| drafter | T | drafted | α | TV (max view) | TV by view | p | p (Holm) | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.rows:
        alpha = f"{r.accepted / r.drafted:.2f}" if r.drafted else "-"
        by_view = ", ".join(f"{k} {v:.3f}" for k, v in r.views.items())
        verdict = "DIFFERS" if r.p_holm < report.alpha else ("same" if r.drafted else "untested (no drafts)")
        lines.append(
            f"| {r.drafter} | {r.temperature:g} | {r.drafted} | {alpha} | {r.tv:.3f} | {by_view} | "
            f"{r.p_value:.3f} | {r.p_holm:.3f} | {verdict} |"
        )
    if report.greedy:
        lines += [
            "",
            "greedy: " + "; ".join(f"{d} {sum(v)}/{len(v)} identical" for d, v in report.greedy.items()),
        ]
    lines += ["", "PASSED" if report.passed else f"FAILED (alpha {report.alpha}, Holm-adjusted)"]
    return "\n".join(lines)
