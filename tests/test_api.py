"""The Python API (specdecode.LLM): batched generation equals one request at a time and plain decoding
(greedy, fp32), streaming equals generate, chat applies the template, stats and draft provenance add
up, the CLI gives the API's results, and README's example runs as written."""

import json
import re
from pathlib import Path

import pytest

import specdecode
from specdecode import LLM, SamplingParams, UserError
from specdecode.cli import main

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["the cat sat on the mat", "def fibonacci(n):", "Hello, world! How are you"]


@pytest.fixture(scope="module")
def llm(tiny_model_dir, tiny_draft_dir):
    return LLM(tiny_model_dir, f"draft:{tiny_draft_dir}", k=3, max_batch=2)


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    return LLM(tiny_model_dir, "none")


def test_import_specdecode_exposes_the_api():
    assert specdecode.LLM is LLM and specdecode.SamplingParams is SamplingParams
    with pytest.raises(AttributeError):
        specdecode.no_such_name  # noqa: B018


def test_batched_greedy_generation_equals_plain_decoding_and_one_at_a_time(llm, plain):
    greedy = SamplingParams(temperature=0, max_tokens=20)
    batched = llm.generate(PROMPTS, greedy)  # 3 prompts through 2 slots: one joins as another leaves
    alone = [llm.generate(p, greedy)[0] for p in PROMPTS]
    reference = plain.generate(PROMPTS, greedy)
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone] == [o.token_ids for o in reference]
    assert all(o.metrics.drafted == 0 for o in reference)
    for out in batched:
        m = out.metrics
        assert m.drafted > 0 and m.new_tokens == len(out.token_ids) == 20
        assert m.target_forwards == m.steps + 1
        assert sum(out.outputs[0].from_draft) == m.accepted  # no stop string cut these completions
        assert out.text == llm.tokenizer.decode(out.token_ids, skip_special_tokens=True)
        assert out.finish_reason == "length" and out.prompt in PROMPTS


def test_stop_auto_chains_priced_by_the_engines_live_costs_equal_plain_decoding(
    tiny_model_dir, tiny_draft_dir, plain
):
    """`stop=auto` through the engine: the drafters price their rows by the engine's measured r(n) (the
    context's live costs, read at each proposal), and greedy output stays plain decoding's (fp32)."""
    spec = f"fallback:ngram:stop=auto+draft:stop=auto:{tiny_draft_dir}"
    priced = LLM(tiny_model_dir, spec, k=4, max_batch=2)
    greedy = SamplingParams(temperature=0, max_tokens=20)
    outs = priced.generate(PROMPTS, greedy)
    assert [o.token_ids for o in outs] == [o.token_ids for o in plain.generate(PROMPTS, greedy)]
    assert sum(o.metrics.drafted for o in outs) > 0
    members = priced._engine.pool.template(priced.spec).members
    for member in members:
        ratios = member.stop.rows()  # the engine's own costs, not a start-up figure
        assert member.stop.rows is not None and ratios[0] == 1.0 and len(ratios) == 5


def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(llm):
    params = [SamplingParams(temperature=0.9, seed=s, max_tokens=12) for s in (1, 2, 3)]
    batched = llm.generate(PROMPTS, params)
    alone = [llm.generate(p, sp)[0] for p, sp in zip(PROMPTS, params)]
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]
    other_seed = llm.generate(PROMPTS[0], SamplingParams(temperature=0.9, seed=99, max_tokens=12))[0]
    assert other_seed.token_ids != batched[0].token_ids


def test_token_id_prompts_equal_their_text(llm):
    ids = llm.tokenizer(PROMPTS[1])["input_ids"]
    greedy = SamplingParams(temperature=0, max_tokens=8)
    by_ids = llm.generate([ids, ids], greedy)
    by_text = llm.generate(PROMPTS[1], greedy)[0]
    assert by_ids[0].token_ids == by_ids[1].token_ids == by_text.token_ids
    assert by_ids[0].prompt is None and by_ids[0].prompt_token_ids == ids


def test_stream_yields_the_completion_of_generate(llm):
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=16, stop=["\n\n"])
    deltas = list(llm.stream(PROMPTS[0], params))
    final = deltas[-1].output
    assert final is not None and all(d.output is None for d in deltas[:-1])
    assert "".join(d.text for d in deltas) == final.text
    assert final.token_ids == llm.generate(PROMPTS[0], params)[0].token_ids
    provenance = [flag for d in deltas for flag in d.from_draft]
    assert provenance[: len(final.token_ids)] == final.outputs[0].from_draft


def test_chat_applies_the_template(llm):
    greedy = SamplingParams(temperature=0, max_tokens=8)
    out = llm.chat([{"role": "user", "content": "hello"}], greedy)[0]
    assert out.prompt.startswith("<|user|>hello") and out.prompt.endswith("<|assistant|>")
    assert out.token_ids == llm.generate("hello", greedy, chat=True)[0].token_ids
    two = llm.chat([[{"role": "user", "content": "hello"}], [{"role": "user", "content": "bye"}]], greedy)
    assert len(two) == 2 and two[0].token_ids == out.token_ids


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda m: m.generate([]), "no prompts"),
        (lambda m: m.generate([[1, 2, 99999]]), "outside the vocabulary"),
        (lambda m: m.generate(["a", "b"], [SamplingParams()]), "1 sampling_params for 2 prompts"),
        (lambda m: m.generate("a", SamplingParams(max_tokens=100000)), "exceeds the model's context"),
        (lambda m: m.generate("   "), "empty prompt"),
        (lambda m: m.chat([{"role": "user"}]), "messages"),
    ],
)
def test_bad_requests_are_named(llm, call, message):
    with pytest.raises(UserError, match=message):
        call(llm)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top-p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_sampling_params_are_named(kwargs, message):
    with pytest.raises(UserError, match=message):
        SamplingParams(**kwargs)


def test_bad_llm_arguments_fail_before_loading():
    with pytest.raises(UserError, match="unknown drafter"):
        LLM("/no/such/model", "telepathy")
    with pytest.raises(UserError, match="k must be"):
        LLM("/no/such/model", k=0)


def test_the_cli_gives_the_api_results(capsys, llm, tiny_model_dir, tiny_draft_dir, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    argv = ["generate", "--prompt-file", str(f), "--target", tiny_model_dir, "--drafter"]
    argv += [f"draft:{tiny_draft_dir}", "--k", "3", "--temperature", "0.7", "--seed", "4"]
    assert main([*argv, "--max-new-tokens", "10", "--json"]) == 0
    cli = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    api = llm.generate(PROMPTS, SamplingParams(temperature=0.7, seed=4, max_tokens=10), chat=None)
    assert [c["token_ids"] for c in cli] == [a.token_ids for a in api]
    assert [c["stats"]["accepted"] for c in cli] == [a.metrics.accepted for a in api]
    assert [c["text"] for c in cli] == [a.text for a in api]


def readme_example() -> str:
    """The README's Python example: the ```python block after the 'Python API' heading."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_as_written(capsys):
    code = readme_example()
    assert "specdecode.LLM" in code or "LLM(" in code
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "α" in out and "tokens" in out


def test_a_model_without_a_batched_forward_runs_its_slots_in_turn(llm, tiny_model_dir, tiny_draft_dir):
    hf = LLM(tiny_model_dir, f"draft:{tiny_draft_dir}", k=3, backend="hf", max_batch=2)
    greedy = SamplingParams(temperature=0, max_tokens=12)
    assert [o.token_ids for o in hf.generate(PROMPTS, greedy)] == [
        o.token_ids for o in llm.generate(PROMPTS, greedy)
    ]


def test_with_drafter_shares_the_target(llm, plain):
    other = plain.with_drafter("ngram", k=2)
    assert other.target is plain.target and other.spec.kind == "ngram" and other.k == 2
    greedy = SamplingParams(temperature=0, max_tokens=12)
    assert other.generate(PROMPTS[0], greedy)[0].token_ids == plain.generate(PROMPTS[0], greedy)[0].token_ids


WORDS = r"( (the|cat|dog|fox|sat|on|mat)){1,6}"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}


def test_structured_outputs_follow_their_grammar_with_and_without_speculation(llm, plain):
    """Sampled and greedy, every completion matches the regex whole (it ends where the grammar
    completes) or validates against the schema; greedy output equals plain constrained decoding."""
    import jsonschema

    regex = specdecode.StructuredOutputs(regex=WORDS)
    sampled = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=40, structured_outputs=regex) for s in range(6)
    ]
    for out in llm.generate([PROMPTS[0]] * 6, sampled) + plain.generate([PROMPTS[0]] * 6, sampled):
        assert re.fullmatch(WORDS, out.text) and out.finish_reason == "stop", out.text
    schema = specdecode.StructuredOutputs.from_response_format(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    )
    greedy = SamplingParams(temperature=0, max_tokens=40, structured_outputs=schema)
    spec, reference = llm.generate(PROMPTS, greedy), plain.generate(PROMPTS, greedy)
    assert [o.token_ids for o in spec] == [o.token_ids for o in reference]
    for out in spec:
        jsonschema.validate(json.loads(out.text), SCHEMA)


@pytest.mark.parametrize(
    "fmt,message",
    [
        ("{", "not valid JSON"),
        ({"kind": "json_object"}, 'with a "type"'),
        ({"type": "yaml"}, "type 'yaml' is not one of"),
        ({"type": "json_object", "pattern": "a"}, "takes no pattern"),
        ({"type": "regex"}, "needs 'pattern'"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, 'needs {"schema"'),
    ],
)
def test_bad_response_formats_are_named(fmt, message):
    with pytest.raises(UserError, match=re.escape(message)):
        specdecode.StructuredOutputs.from_response_format(fmt)


def test_bad_structured_outputs_are_named(llm):
    with pytest.raises(UserError, match="exactly one of json, json_object, regex, grammar"):
        specdecode.StructuredOutputs(regex="a", json_object=True)
    with pytest.raises(UserError, match="ignore_eos"):
        SamplingParams(ignore_eos=True, structured_outputs=specdecode.StructuredOutputs(json_object=True))
    with pytest.raises(UserError, match="structured_outputs must be a StructuredOutputs"):
        SamplingParams(structured_outputs={"type": "json_object"})
    with pytest.raises(UserError, match="invalid regex"):
        llm.generate("a", SamplingParams(structured_outputs=specdecode.StructuredOutputs(regex="(")))
    assert specdecode.StructuredOutputs.from_response_format('{"type": "text"}') is None
