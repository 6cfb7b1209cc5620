"""`specdecode train prompts|data|medusa|eagle|draft`: argument parsing only; the work is in the modules."""

from __future__ import annotations

import dataclasses

from specdecode.backends.precision import BF16, FP32, GGUF, GGUF_EXACT
from specdecode.errors import UserError

DEFAULT_EXCLUDE = "mtbench:1"  # the prompts of `bench --prompts mtbench:1`, held out of the shipped data
TRAINS_FROM = (FP32, BF16, GGUF, GGUF_EXACT)  # a trainer's feature sources (--dtype)
SCHEDULE = frozenset(
    ("steps", "lr", "amp", "seed", "resume", "save_every", "stop_after", "val", "eval_every", "patience")
)  # loop.Schedule's fields (tests/test_train.py checks), settable with --set as before


def add_parser(sub, model_args, setup) -> None:
    """model_args(parser) adds --target/--dtype/...; setup(args) applies --threads and logging."""
    t = sub.add_parser("train", help="train drafters for a target by self-distillation")
    tsub = t.add_subparsers(dest="what", required=True)

    d = tsub.add_parser("data", help="generate the target's responses to prompt sets (token ids)")
    _data_args(d)
    model_args(d)
    d.set_defaults(run=cmd_data, setup=setup, exact_auto=True)

    q = tsub.add_parser(
        "prompts", help="chat prompts written by the target itself (Magpie), as JSONL for `train data`"
    )
    _prompts_args(q)
    model_args(q)
    q.set_defaults(run=cmd_prompts, setup=setup, exact_auto=True)

    c = tsub.add_parser(
        "compact", help="rewrite a feature store's float32 final hidden rows in bfloat16 (half their size)"
    )
    c.add_argument("store", help="the feature store (DATA/features, or a trainer's --features)")
    c.set_defaults(run=cmd_compact)

    for name, helptext in (
        ("medusa", "Medusa heads on the target's last hidden state"),
        ("eagle", "an EAGLE-3-style feature-level draft head"),
        ("draft", "a small draft model distilled from the target"),
    ):
        p = tsub.add_parser(name, help=helptext)
        _run_args(p)
        _val_args(p)
        _trainer_args(p, name)
        model_args(p, dtype="fp32")
        p.set_defaults(run=cmd_train, trainer=name, setup=setup)


def _data_args(d) -> None:
    """`train data`: the prompt sets, where the data goes, and how the target answers them."""
    d.add_argument(
        "--prompts",
        default="mtbench,humaneval,summaries",
        help="comma list of built-in sets (mtbench, mtbench2, humaneval, summaries, mixed, bfclall, "
        "reasoning:N, ...) or JSONL files ({'prompt', optional 'response'} per line)",
    )
    d.add_argument("--exclude", default=DEFAULT_EXCLUDE, help="prompt sets to hold out (benchmark prompts)")
    d.add_argument("--out", required=True, help="data directory (appended to; rerun to resume)")
    d.add_argument("--shard-size", type=int, default=256, help="sequences per shard file")
    d.add_argument("--flush-minutes", type=float, default=10.0, help="write a shard at least this often")
    d.add_argument("--max-prompt-tokens", type=int, default=None, help="skip prompts longer than this")
    d.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="DIR",
        help="instead of generating: join these data directories' shards into --out (dedup by id)",
    )
    d.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        metavar="N",
        help="with --merge: stop after N response tokens (the sources' order: a data-scaling subset)",
    )
    d.add_argument(
        "--part",
        default=None,
        metavar="I/N",
        help="answer only worker I's share of N (parallel workers, one core each, may share --out)",
    )
    d.add_argument("--max-new-tokens", type=int, default=256)
    d.add_argument("--minutes", type=float, default=None, help="stop starting new prompts after this long")
    d.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 = greedy responses; above 0 sampled ones, kept as ID@tT beside the greedy answers in --out",
    )
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--drafter", default="ngram", help="speeds generation up; greedy output is unchanged")
    d.add_argument(
        "--capture",
        default=None,
        metavar="LAYERS",
        help="also store the target features the heads train on, taken from the forwards that generate "
        "(no second pass): 'eagle' (EAGLE-3's low, mid and high layers of this target) or layer ids "
        "'2,14,25', with the final hidden rows; in OUT/features, where `train eagle`/`medusa` look",
    )
    d.add_argument(
        "--min-free-gb",
        type=float,
        default=4.0,
        help="stop (everything finished written) once the disk holding --out has less than this free",
    )
    d.add_argument(
        "--batch",
        type=int,
        default=16,
        help="prompts decoded together in the engine (continuous batching); more tokens per CPU-second",
    )


def _prompts_args(q) -> None:
    """`train prompts`: how many prompts, and how the target writes them."""
    q.add_argument("--out", required=True, help="JSONL file (appended to; rerun to resume)")
    q.add_argument("--count", type=int, required=True, help="prompts the file should hold")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--temperature", type=float, default=1.0)
    q.add_argument("--top-p", type=float, default=1.0)
    q.add_argument("--max-tokens", type=int, default=96, help="longer samples are dropped (cut mid-request)")
    q.add_argument("--min-words", type=int, default=4, help="shorter samples are dropped")
    q.add_argument(
        "--prefix",
        default="self",
        help="ids are PREFIX-ATTEMPT: give each target's file its own, so `train data` can read several",
    )


def _run_args(p) -> None:
    """A trainer's data, checkpoint and features directories, and its run: precision, steps, learning
    rate, batch, seed, resume and checkpoint interval."""
    p.add_argument("--data", required=True, help="directory written by `train data`")
    p.add_argument("--out", required=True, help="checkpoint directory")
    p.add_argument(
        "--features",
        default=None,
        metavar="DIR",
        help="the target-feature store, shareable across data sets and trainers (default: "
        "DATA/features); holds only what was computed, per sequence",
    )
    p.add_argument(
        "--amp",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: the forward under bfloat16 autocast, ~2x faster on CPUs with bf16 dot "
        "products (AVX512-BF16, AMX); fp32 master weights either way",
    )
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: per trainer)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--batch-tokens", type=int, default=None, help="tokens per optimizer step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out")
    p.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps")


def _val_args(p) -> None:
    """Held-out scoring: the fraction held out, how often it is scored, when to stop."""
    p.add_argument(
        "--val",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="hold out this fraction of the sequences (by id) and score the drafter there "
        "(teacher-forced top-1 agreement per position); the best is written to OUT/best",
    )
    p.add_argument("--eval-every", type=int, default=200, help="with --val: score every N steps")
    p.add_argument(
        "--patience",
        type=int,
        default=0,
        help="with --val: stop after N scores without a better one (0: run every step)",
    )


def _trainer_args(p, name: str) -> None:
    """The drafter's own: vocabulary, hyperparameters (--set), and where draft and eagle start from."""
    p.add_argument("--vocab", type=int, default=None, help="draft vocabulary size (most frequent tokens)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a trainer hyperparameter (see docs/drafters.md), repeatable",
    )
    if name in ("draft", "eagle"):
        p.add_argument(
            "--init",
            default=None,
            help=f"train this {name} checkpoint further (a directory, or "
            "'shipped') on --data instead of starting from target layers",
        )
    if name == "draft":
        p.add_argument(
            "--lora",
            type=int,
            default=None,
            metavar="RANK",
            help="train only rank-RANK LoRA adapters (merged into the weights at export)",
        )


def _load_target(args, generate_only: bool = False):
    """fp32; for `train data` also gguf-exact (the same bits from the file's quantized blocks, faster) or
    gguf (the precision users run: its batched rows have a decoding step's bits on every ISA's tiles).
    A trainer's --dtype picks its feature source instead (_feature_source): its weights are fp32."""
    from specdecode.backends import models

    if generate_only and not (args.precision.exact or args.precision == GGUF):
        raise UserError(
            f"train data uses the target in fp32, gguf-exact or gguf (--dtype {args.precision} given)"
        )
    return models.load(args.target, args.precision if generate_only else FP32, args.device, args.backend)


def _feature_source(args, loaded):
    """The target a trainer learns features from, loaded as the drafter will serve it (--dtype): the fp32
    copy itself, or a second load in bf16 or gguf (the head then matches that target's hidden rows)."""
    from specdecode.backends import models
    from specdecode.train import features

    precision = args.precision
    if precision.exact:  # gguf-exact computes fp32's bits
        return features.Source(loaded.model, precision)
    model = models.load(args.target, precision, args.device, args.backend).model
    return features.Source(model, precision, _source_rows(precision))


def _source_rows(precision):
    """Source.rows for features of a target served at `precision` (8-bit activations: decoding's calls)."""
    from specdecode.backends import kernels

    return kernels.DENSE_ROWS if precision.int8_activations else None


def _capture(args, loaded):
    """--capture -> the features.Writer of the data directory's store (under the key _feature_source's
    Source gives this target and --dtype), or None."""
    if not args.capture:
        return None
    from pathlib import Path

    from specdecode.backends import checkpoint
    from specdecode.train import eagle, features

    num_layers = loaded.model.hf.config.num_hidden_layers
    if args.capture == "eagle":
        layer_ids = eagle.default_layers(num_layers)
    else:
        try:
            layer_ids = tuple(int(x) for x in args.capture.split(","))
        except ValueError:
            raise UserError(
                f"--capture expects 'eagle' or layer ids like 2,14,25, got {args.capture!r}"
            ) from None
        if not all(0 <= i < num_layers for i in layer_ids):
            raise UserError(f"--capture {args.capture}: this target has layers 0..{num_layers - 1}")
    key = features.Source(loaded.model, args.precision, _source_rows(args.precision)).key(
        checkpoint.describe(loaded)["fingerprint"]
    )
    return features.Writer(Path(args.out) / "features", key, layer_ids)


def cmd_prompts(args) -> None:
    from specdecode.train import prompts

    args.setup(args)
    loaded = _load_target(args, generate_only=True)
    rows = prompts.write_prompts(
        loaded,
        args.out,
        args.count,
        seed=args.seed,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        min_words=args.min_words,
        prefix=args.prefix,
    )
    print(f"{len(rows)} prompts in {args.out}")


def cmd_data(args) -> None:
    from specdecode import drafters
    from specdecode.backends import checkpoint
    from specdecode.core.sampling import Warp
    from specdecode.train import data

    if args.merge:
        seqs = data.merge(args.merge, args.out, args.shard_size, args.max_tokens)
        print(f"{len(seqs)} sequences, {data.response_tokens(seqs)} response tokens in {args.out}")
        return

    sources: dict[str, str] = {}
    prompts, tag = data.collect_prompts(args.prompts, args.exclude, sources), ""
    if args.part:
        prompts, tag = data.part(prompts, args.part)
    spec = drafters.parse(args.drafter)  # before loading anything; generate_data builds it
    args.setup(args)
    loaded = _load_target(args, generate_only=True)
    context = drafters.DrafterContext(loaded, FP32, args.device, args.backend)
    meta = {
        "target": checkpoint.describe(loaded),
        "prompts": args.prompts,
        "exclude": args.exclude,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
    }
    seqs = data.generate_data(
        loaded,
        prompts,
        args.out,
        drafter=spec,
        context=context,
        params=Warp(args.temperature),
        max_new_tokens=args.max_new_tokens,
        minutes=args.minutes,
        seed=args.seed,
        batch=args.batch,
        meta=meta,
        shard_size=args.shard_size,
        flush_minutes=args.flush_minutes,
        max_prompt_tokens=args.max_prompt_tokens,
        tag=tag,
        sources=sources,
        features=_capture(args, loaded),
        min_free_gb=args.min_free_gb,
    )
    print(f"{len(seqs)} sequences, {data.response_tokens(seqs)} response tokens in {args.out}")


def cmd_compact(args) -> None:
    from specdecode.train import features

    files, before, after = features.compact(args.store)
    print(f"{files} chunk files rewritten in bfloat16: {before / 2**30:.2f} -> {after / 2**30:.2f} GB")


def _overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UserError(f"--set expects KEY=VALUE, got {pair!r}")
        try:
            out[key] = int(value)
        except ValueError:
            try:
                out[key] = float(value)
            except ValueError:
                out[key] = value
    return out


def _schedule(args, overrides: dict):
    """The run's loop.Schedule from the flags (steps and lr left unset take the trainer's defaults)
    and the --set keys that name one of its fields (e.g. --set stop_after=10)."""
    from specdecode.train import loop

    flags = loop.Schedule(
        steps=args.steps,
        lr=args.lr,
        amp=args.amp,
        seed=args.seed,
        resume=args.resume,
        save_every=args.save_every,
        val=args.val,
        eval_every=args.eval_every,
        patience=args.patience,
    )
    return dataclasses.replace(flags, **{k: v for k, v in overrides.items() if k in SCHEDULE})


def cmd_train(args) -> None:
    import importlib
    import inspect

    from specdecode.train import loop

    trainer = importlib.import_module(f"specdecode.train.{args.trainer}")
    overrides = _overrides(args.set)
    params = inspect.signature(trainer.train).parameters.items()
    own = {name for name, p in params if p.kind is p.KEYWORD_ONLY} - {"features_dir", "source"}
    known = own | SCHEDULE  # features_dir and source are --features and --dtype
    if unknown := sorted(set(overrides) - known):
        raise UserError(
            f"--set {', '.join(unknown)}: not a setting of `train {args.trainer}` "
            f"(its settings: {', '.join(sorted(known))})"
        )
    plan = _schedule(args, overrides)
    if plan.resume:
        loop.check_resumable(args.out)  # before loading the target and its feature pass
    if args.precision not in TRAINS_FROM:  # before loading anything
        raise UserError(
            f"training learns from the target in {', '.join(map(str, TRAINS_FROM))} "
            f"(--dtype {args.precision} given)"
        )
    args.setup(args)
    loaded = _load_target(args)
    source = _feature_source(args, loaded)
    opts = {
        k: v
        for k, v in dict(
            batch_tokens=args.batch_tokens,
            vocab=args.vocab,
            init=getattr(args, "init", None),
            lora=getattr(args, "lora", None),
        ).items()
        if v is not None
    }
    result = trainer.train(
        loaded,
        args.data,
        args.out,
        plan,
        features_dir=args.features,
        source=source,
        **opts,
        **{k: v for k, v in overrides.items() if k in own},
    )
    print(result.summary())
