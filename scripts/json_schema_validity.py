"""Does JSON-schema-constrained output validate, and is it the same with speculation as without?

For 10 JSON schemas x 5 requests (50 chat prompts; --schemas N: the first N schemas) on the target
(default SmolLM2-135M-Instruct, --dtype fp32; gguf: the default serving path),
greedy decoding under the schema's grammar (decoding/grammar.py) runs without drafts and with the n-gram
drafter as a chain and as a tree (k=4). Reported: how many outputs parse and validate against their
schema, how many are token-identical across the three, and the grammar's cost per committed token
(cut + masks, decoding/constraints.py) beside the whole step's. The first masks applied in a process pay
one-time work: llguidance's `apply_token_bitmask_inplace` is a torch.compile'd kernel, compiled on its
first call (seconds) and again for the first batch of more than one row (torch specializes size 1).
Both are done before the timed runs and reported apart (warmup_s), so neither is charged to whichever
drafter runs first.

    python3 scripts/json_schema_validity.py --out docs/results/json_schema_validity_smollm2_zen4.json
    python3 scripts/json_schema_validity.py --dtype gguf --threads 1 --schemas 4 \
        --out docs/results/json_schema_grammar_share_smollm2_gguf_zen4_1thread.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import jsonschema
import torch

from specdecode.backends import models
from specdecode.backends.precision import Precision
from specdecode.core.sampling import Warp
from specdecode.decoding.constraints import Constraints
from specdecode.decoding.decoder import decode
from specdecode.decoding.grammar import Grammars
from specdecode.drafters import NgramDrafter, NoDrafter


def _s(n: int) -> dict:
    return {"type": "string", "maxLength": n}


def _i(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _obj(**props) -> dict:
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


SCHEMAS = [
    ("a person", _obj(name=_s(24), age=_i(0, 120), city=_s(24))),
    ("a book", _obj(title=_s(40), author=_s(30), year=_i(1000, 2030))),
    ("a weather forecast", _obj(city=_s(24), unit={"enum": ["celsius", "fahrenheit"]}, high=_i(-50, 60))),
    (
        "a product",
        _obj(
            name=_s(30),
            price={"type": "number", "minimum": 0, "maximum": 10000},
            in_stock={"type": "boolean"},
        ),
    ),
    ("a movie review", _obj(movie=_s(40), stars=_i(1, 5), summary=_s(60))),
    (
        "a recipe",
        _obj(dish=_s(30), ingredients={"type": "array", "items": _s(20), "maxItems": 5}, minutes=_i(1, 600)),
    ),
    (
        "a meeting",
        _obj(
            topic=_s(40),
            day={"enum": ["monday", "tuesday", "wednesday", "thursday", "friday"]},
            hour=_i(0, 23),
        ),
    ),
    ("a country", _obj(country=_s(30), capital=_s(30), population_millions=_i(0, 2000))),
    (
        "a todo item",
        _obj(task=_s(50), done={"type": "boolean"}, priority={"enum": ["low", "medium", "high"]}),
    ),
    ("a flight", _obj(origin=_s(3), destination=_s(3), passengers=_i(1, 9))),
]
SUBJECTS = ["about Paris", "for a child", "that is funny", "from history", "about the sea"]


class TimedConstraints(Constraints):
    """Constraints that add up the time spent in the grammar (cut and process)."""

    seconds = 0.0

    def cut(self, plan):
        t0 = time.perf_counter()
        out = super().cut(plan)
        TimedConstraints.seconds += time.perf_counter() - t0
        return out

    def process(self, context, plan, logits):
        t0 = time.perf_counter()
        out = super().process(context, plan, logits)
        TimedConstraints.seconds += time.perf_counter() - t0
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="fp32", help="the target's dtype (models.load): fp32, gguf, ...")
    ap.add_argument("--schemas", type=int, default=len(SCHEMAS), help="the first N schemas (5 prompts each)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not 1 <= args.schemas <= len(SCHEMAS):
        ap.error(f"--schemas: 1..{len(SCHEMAS)}")
    schemas = SCHEMAS[: args.schemas]
    target = models.load(args.target, Precision.parse(args.dtype), "cpu")
    tok = target.tokenizer
    grammars = Grammars(tok, target.model.vocab_size, target.eos_ids)
    drafters = {
        "none": (NoDrafter(), 0),
        "ngram": (NgramDrafter(), 4),
        "ngram:b=3": (NgramDrafter(branches=3), 4),
    }
    valid = identical = finished = tokens = 0
    grammar_s = {name: 0.0 for name in drafters}
    warmup_s = []
    for rows in (1, 2):  # the compiled mask kernel: one row, then any number of rows
        t0 = time.perf_counter()
        grammars.matcher(grammars.json_object()).apply(
            torch.zeros(rows, target.model.vocab_size), [[]] * rows
        )
        warmup_s.append(time.perf_counter() - t0)
    wall_s = {name: 0.0 for name in drafters}
    new_tokens = {name: 0 for name in drafters}
    failures = []
    for what, schema in schemas:
        compiled = grammars.json_schema(schema)
        for subject in SUBJECTS:
            question = f"Describe {what} {subject} as JSON with the fields {', '.join(schema['properties'])}."
            text = tok.apply_chat_template(
                [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
            )
            prompt = tok(text, add_special_tokens=False)["input_ids"]
            outs = {}
            for name, (drafter, k) in drafters.items():
                TimedConstraints.seconds = 0.0
                constraints = TimedConstraints(prompt, grammar=grammars.matcher(compiled))
                t0 = time.perf_counter()
                steps = decode(
                    target.model,
                    drafter,
                    prompt,
                    k=k,
                    params=Warp(),
                    max_new_tokens=args.max_new_tokens,
                    eos_ids=target.eos_ids,
                    constraints=constraints,
                )
                outs[name] = [t for s in steps for t in s.tokens]
                wall_s[name] += time.perf_counter() - t0
                grammar_s[name] += TimedConstraints.seconds
                new_tokens[name] += len(outs[name])
            out = outs["none"]
            tokens += len(out)
            identical += all(o == out for o in outs.values())
            done = bool(out) and out[-1] in target.eos_ids
            finished += done
            answer = tok.decode(out[:-1] if done else out)
            try:
                jsonschema.validate(json.loads(answer), schema)
                valid += 1
            except (ValueError, jsonschema.ValidationError) as e:
                failures.append({"question": question, "answer": answer, "error": str(e)[:200]})
            print(f"{what} {subject}: {answer}", flush=True)
    n = len(schemas) * len(SUBJECTS)
    result = {
        "what": f"JSON-schema constrained greedy output (llguidance masks), {target.name} {args.dtype}",
        "machine": f"{platform.machine()} AMD EPYC Zen 4, {args.threads} threads, shared with other jobs",
        "prompts": n,
        "max_new_tokens": args.max_new_tokens,
        "valid": valid,
        "finished_at_eos": finished,
        "identical_none_ngram_chain_tree": identical,
        "tokens": tokens,
        "warmup_s": warmup_s,
        "per_drafter": {
            name: {
                "ms_per_token": 1e3 * wall_s[name] / max(new_tokens[name], 1),
                "grammar_ms_per_token": 1e3 * grammar_s[name] / max(new_tokens[name], 1),
                "grammar_share": grammar_s[name] / wall_s[name] if wall_s[name] else None,
            }
            for name in drafters
        },
        "failures": failures,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
            f.write("\n")


if __name__ == "__main__":
    main()
