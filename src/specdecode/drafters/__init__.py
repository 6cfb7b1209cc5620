"""Drafters by spec: one registered `Kind` per drafter kind (spec.py defines Spec and Kind).

    none                                   no drafting: plain decoding (k = 0)
    ngram[:N|:MIN-MAX][:b=B][:stop=P|auto] prompt lookup; b > 1 proposes a tree of b continuations; stop:
                                           a chain keeps tokens while its odds, from this request's record,
                                           are >= P% (auto: while they pay their rows, chain_stop.py)
    draft                                  the shipped distilled draft model (draft:DIR: a `train draft`
                                           checkpoint)
    draft:[b=B:[nodes=N:]]<model>          a draft model; b: static tree of b branches, nodes: dynamic tree
    draft:[vocab=V:][stop=P|auto:][window=W:]<model>  vocab: the draft's head over its V most frequent
                                           tokens (chains and trees); stop: a chain keeps tokens while its
                                           draft confidence is >= P% (auto: while it pays their rows and
                                           the draft passes, chain_stop.py), a dynamic tree grows while it
                                           is; window: the draft reads a long prompt's first
                                           tokens and last W only (draft_lm.py)
    medusa|eagle[:b=B[:nodes=N]][:DIR]     heads on the target's features (no DIR: the shipped heads)
    eagle[:stop=P|auto][:window=W][:bits=4][:calibrate=0][:DIR]
                                           stop: a chain keeps tokens while the product of the head's
                                           probabilities is >= P% (auto: as draft's), each scaled by the
                                           request's kept over stated odds (calibrate=0: not scaled);
                                           window: the head reads a long prompt's first 4 and last W
                                           positions (eagle.py); bits=4: its linears at 4 bits beside a
                                           GGUF target (default 8)
    suffix[:key=value...][:PATH]           suffix decoding over this request, previous responses and a
                                           corpus (suffix.py)
    ensemble:A+B[+...]                     several drafters' proposals merged into one tree
    fallback:A+B[+...]                     the first member with a proposal drafts the step
    (a member of either may end in :k=N, its own cap on draft tokens a step: fallback:ngram+eagle:k=1)

A model path may contain ':'. To add a drafter: one file with the drafter, then one `register(Kind(...))`
below with its parser, builder and facts.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace

from specdecode.backends.lm import CausalLM
from specdecode.backends.models import LoadedModel
from specdecode.backends.precision import FP32, Precision
from specdecode.core.drafter import Drafter, Proposal
from specdecode.drafters.chain_stop import ChainStop, Rows
from specdecode.drafters.cross_vocab import CrossVocabDrafter
from specdecode.drafters.draft_model import DraftModelDrafter, chain_costs
from specdecode.drafters.draft_tree import DraftTreeDrafter
from specdecode.drafters.draft_vocab import frequent_tokens
from specdecode.drafters.ensemble import EnsembleDrafter
from specdecode.drafters.fallback import FallbackDrafter
from specdecode.drafters.ngram import MAX_N, MIN_N, NgramDrafter
from specdecode.drafters.none import NoDrafter
from specdecode.drafters.spec import KINDS, Kind, Spec, canonical, int_options, parse, register, tree_options
from specdecode.drafters.suffix import DEFAULTS as SUFFIX_DEFAULTS
from specdecode.drafters.suffix import Corpus, SuffixCache, SuffixDrafter, read_responses
from specdecode.errors import UserError


@dataclass
class DrafterContext:
    """What a drafter factory may use: the loaded target and how models are loaded."""

    target: LoadedModel
    precision: Precision = FP32
    device: str | None = None
    backend: str = "auto"
    quant: str = "none"  # of draft models: "int8" quantizes their linear layers (quant.py)
    rows: Rows | None = None  # the target's live verify costs (an engine's), for stop=auto (chain_stop.py)


def build(spec: Spec, ctx: DrafterContext) -> Drafter:
    """The drafter of a parsed spec (drafters.parse: the one validator of a spec's text)."""
    spec = parse(spec)  # a Spec passes through; text is accepted for tests and the Python API
    return spec.info.build(spec, ctx)


# -- none ------------------------------------------------------------------------------------------


def _parse_none(arg: str | None) -> Spec:
    if arg:
        raise UserError(f"drafter none takes no argument, got {arg!r}")
    return Spec("none")


# -- ngram -----------------------------------------------------------------------------------------


def _parse_ngram(arg: str | None) -> Spec:
    """`ngram[:N|:MIN-MAX][:b=B][:stop=P|auto]`."""
    segments = [s.strip() for s in arg.split(":")] if arg else []
    ranges = [s for s in segments if "=" not in s]
    given = dict(int_options([s for s in segments if "=" in s], ("b", "stop"), "ngram", auto=("stop",)))
    b, stop = given.get("b", 1), given.get("stop")
    if len(ranges) > 1:
        raise UserError(f"ngram argument must be N or MIN-MAX (and b=B, stop=P), got {arg!r}")
    if stop not in (None, "auto") and stop >= 100:
        raise UserError(f"ngram option stop=P is a percentage below 100, got {stop}")
    if stop is not None and b > 1:
        raise UserError("ngram option stop=P needs a chain, not a tree of b > 1 branches")
    lo, hi = MIN_N, MAX_N
    if ranges:
        try:
            first, _, last = ranges[0].partition("-")
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise UserError(f"ngram argument must be N or MIN-MAX, got {arg!r}") from None
    if not 1 <= lo <= hi:
        raise UserError(f"ngram needs 1 <= min_n <= max_n, got min_n={lo} max_n={hi}")
    extra = ((("b", b),) if b > 1 else ()) + ((("stop", stop),) if stop is not None else ())
    return Spec("ngram", (("min_n", lo), ("max_n", hi)) + extra)


def _format_ngram(spec: Spec) -> str:
    lo, hi, b, stop = spec.option("min_n"), spec.option("max_n"), spec.option("b", 1), spec.option("stop")
    text = f"ngram:{lo}" + (f"-{hi}" if hi != lo else "") + (f":b={b}" if b > 1 else "")
    return text + (f":stop={stop}" if stop is not None else "")


def _build_ngram(spec: Spec, ctx) -> Drafter:
    stop = _chain_stop(spec, None, ctx, "lookup")  # lookup itself costs ~nothing
    return NgramDrafter(spec.option("max_n"), spec.option("min_n"), spec.option("b", 1), stop)


# -- draft -----------------------------------------------------------------------------------------


def _chain_stop(spec: Spec, draft, ctx: DrafterContext, step: str) -> ChainStop:
    """A chain drafter's `stop` option (chain_stop.py): stop=P as a fraction, or stop=auto: rows priced by
    the engine's live costs where it has them, else at v, and its `step` at c, both measured now over a
    target pass (draft_model.chain_costs; draft None: a step that costs nothing)."""
    stop = spec.option("stop", 0)
    if stop != "auto":
        return ChainStop(fixed=stop / 100)
    c, v = chain_costs(draft, ctx.target.model)
    stop = ChainStop(cost=c, row=v, rows=ctx.rows)
    print(
        f"specdecode: {spec}: {step} costs {100 * c:.1f}% of a target pass; {stop.describe()}",
        file=sys.stderr,
    )
    return stop


def _parse_draft(arg: str | None) -> Spec:
    if arg is None:
        return Spec("draft")  # the shipped distilled draft
    options, path = tree_options(arg, "draft", ("vocab", "stop", "window"), auto=("stop",))
    if not path:
        raise UserError(
            "the draft drafter needs a model: --drafter draft:<path or hub id> "
            "(or `draft` for the shipped one)"
        )
    given = dict(options)  # refused here, before any model loads: a stop of 100% or on a static tree
    stop = given.get("stop")
    if stop not in (None, "auto") and stop >= 100:
        raise UserError(f"draft option stop=P is a percentage below 100, got {stop}")
    if stop is not None and "b" in given and "nodes" not in given:
        raise UserError("draft option stop=P needs a chain or a dynamic tree (b=B:nodes=N), not a static one")
    return Spec("draft", options, path)


def _load_draft(spec: Spec, ctx: DrafterContext) -> tuple[CausalLM, LoadedModel | None]:
    """The draft model of a `draft` spec: a distilled checkpoint (spec.arg None or a `train draft`
    directory) over the target's embedding (-> (model, None)), or any causal LM (-> (model, loaded))."""
    from specdecode.backends import models
    from specdecode.drafters import distilled

    if distilled.is_checkpoint(spec.arg):
        return distilled.load(spec.arg, ctx), None
    hf_beside_gguf = ctx.precision.quantized and not models.is_gguf(spec.arg)  # loads in float32
    precision = FP32 if hf_beside_gguf else ctx.precision
    draft = models.load(spec.arg, precision, ctx.device, ctx.backend, ctx.quant)
    return draft.model, draft


def draft_model(spec: Spec, ctx: DrafterContext) -> CausalLM:
    """The one draft model a spec loads (e.g. for a peer that drafts with it); a clear error otherwise."""
    if len(spec.draft_models) != 1 or spec.members:
        raise UserError(f"{spec} is not a single draft model (draft or draft:...)")
    return _load_draft(spec, ctx)[0]


def _build_draft(spec: Spec, ctx: DrafterContext) -> Drafter:
    """A draft model's drafter; a model with another tokenizer than the target's drafts across
    vocabularies (chains only)."""
    from specdecode.backends.tokenizer_check import compare

    vocab = ctx.target.model.vocab_size
    model, draft = _load_draft(spec, ctx)
    if draft is not None:
        if not compare(ctx.target.tokenizer, draft.tokenizer).compatible:
            if spec.options:
                raise UserError(
                    f"draft model {spec.arg} has another tokenizer than the target; its options "
                    f"({', '.join(k for k, _ in spec.options)}) need the same one: cross-vocabulary "
                    "drafting proposes plain chains (no token trees, draft vocabulary, stop or window)"
                )
            return CrossVocabDrafter(
                draft.model,
                draft.tokenizer,
                ctx.target.tokenizer,
                vocab,
                draft.eos_ids,
                ctx.target.tokenizer.eos_token_id,
            )
    token_map = None
    if spec.option("vocab") is not None:  # FR-Spec: the draft's LM head over its frequent tokens only
        if not hasattr(model, "with_head_rows"):
            raise UserError("draft option vocab=N needs a fast-backend draft model")
        tokenizer = draft.tokenizer if draft is not None else ctx.target.tokenizer
        token_map = frequent_tokens(tokenizer, spec.option("vocab"), min(model.vocab_size, vocab))
        model = model.with_head_rows(token_map)
    stop, window = _chain_stop(spec, model, ctx, "a draft pass"), spec.option("window")
    if spec.option("b") is not None:  # stop: parsed below 100, and only with nodes= (_parse_draft)
        return DraftTreeDrafter(model, vocab, spec.option("b"), spec.option("nodes"), token_map, stop, window)
    return DraftModelDrafter(model, vocab, token_map, stop, window)


# -- medusa, eagle ---------------------------------------------------------------------------------


def _parse_heads(
    kind: str, extra: tuple[str, ...] = (), auto: tuple[str, ...] = (), switches: tuple[str, ...] = ()
):
    def parse_heads(arg: str | None) -> Spec:
        options, path = tree_options(arg or "", kind, extra, auto=auto, switches=switches)
        stop = dict(options).get("stop")
        if stop not in (None, "auto") and stop >= 100:
            raise UserError(f"{kind} option stop=P is a percentage below 100, got {stop}")
        if dict(options).get("bits", 8) not in (4, 8):
            raise UserError(f"{kind} option bits= is 4 or 8 (the head's weights beside a GGUF target)")
        return Spec(kind, options, path or None)

    return parse_heads


def _build_medusa(spec: Spec, ctx: DrafterContext) -> Drafter:
    from specdecode.drafters import medusa  # imported on first use: torch.nn heads

    return medusa.load(spec.arg, ctx.target, spec.option("b", 1), spec.option("nodes"))


def _build_eagle(spec: Spec, ctx: DrafterContext) -> Drafter:
    from specdecode.drafters import eagle

    bits = spec.option("bits", 8)
    if bits != 8 and not ctx.target.model.int8_activations:
        raise UserError("eagle option bits=4 needs a --dtype gguf target (the head runs on its 8-bit path)")
    drafter = eagle.load(
        spec.arg, ctx.target, spec.option("b", 1), spec.option("nodes"), spec.option("window"), bits
    )
    drafter.stop = _chain_stop(spec, eagle.HeadSteps(drafter), ctx, "a head step")  # timed on it
    drafter.calibrate = bool(spec.option("calibrate", 1))
    return drafter


# -- suffix ----------------------------------------------------------------------------------------

_SUFFIX_KEYS = {
    "max_tree_depth": int,
    "max_cached_requests": int,
    "max_spec_factor": float,
    "min_token_prob": float,
    "tree": int,
    "b": int,
    "min_match": int,
}


def _parse_suffix(arg: str | None) -> Spec:
    """`suffix[:key=value...][:PATH]`, keys as vLLM's suffix method (suffix.DEFAULTS) plus tree=0|1 and b;
    PATH: a corpus of past responses (a `train data` directory or JSONL), after the options."""
    values = dict(SUFFIX_DEFAULTS)
    segments = (arg or "").split(":")
    n_options = next(i for i, seg in enumerate(segments + ["/"]) if "=" not in seg and seg.strip())
    corpus = ":".join(segments[n_options:]).strip() or None
    for item in (s.strip() for s in segments[:n_options] if s.strip()):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in _SUFFIX_KEYS:
            raise UserError(f"suffix options are key=value with keys {', '.join(_SUFFIX_KEYS)}; got {item!r}")
        try:
            values[key.strip()] = _SUFFIX_KEYS[key.strip()](value.strip())
        except ValueError:
            raise UserError(f"suffix option {key.strip()} needs a number, got {value!r}") from None
    if not 2 <= values["max_tree_depth"] <= 64 or values["max_cached_requests"] < 0 or values["b"] < 1:
        raise UserError(
            f"suffix needs 2 <= max_tree_depth <= 64, max_cached_requests >= 0 and b >= 1: {arg!r}"
        )
    if values["min_match"] < 1:
        raise UserError(f"suffix needs min_match >= 1: {arg!r}")
    if (
        not values["max_spec_factor"] > 0
        or not 0 <= values["min_token_prob"] <= 1
        or values["tree"] not in (0, 1)
    ):
        raise UserError(
            f"suffix needs max_spec_factor > 0, 0 <= min_token_prob <= 1 and tree 0 or 1: {arg!r}"
        )
    return Spec("suffix", tuple(values.items()), corpus)


def _format_suffix(spec: Spec) -> str:
    changed = [f"{key}={value}" for key, value in spec.options if value != SUFFIX_DEFAULTS[key]]
    return ":".join(["suffix", *changed, *([spec.arg] if spec.arg else [])])


def _build_suffix(spec: Spec, ctx) -> Drafter:
    o = dict(spec.options)
    cache = SuffixCache(o["max_tree_depth"], o["max_cached_requests"])
    corpus = Corpus(read_responses(spec.arg, ctx.target.tokenizer), o["max_tree_depth"]) if spec.arg else None
    return SuffixDrafter(
        cache,
        o["max_tree_depth"],
        o["max_spec_factor"],
        o["min_token_prob"],
        bool(o["tree"]),
        o["b"],
        o["min_match"],
        corpus,
    )


# -- ensemble, fallback ----------------------------------------------------------------------------

CAP = re.compile(r"(.*):\s*k\s*=\s*(\d+)\s*")


def _member(text: str, kind: str) -> Spec:
    """One member of a composite: a drafter spec, optionally ending in `:k=N` (its cap)."""
    cap = None
    if match := CAP.fullmatch(text):
        text, cap = match.group(1), int(match.group(2))
        if cap < 1:
            raise UserError(f"{kind} member {text!r}: k=N needs N >= 1")
    member = parse(text)
    if not member.speculates or member.members:
        raise UserError(f"{kind} members cannot be {text!r}")
    return replace(member, cap=cap)


def _parse_members(kind: str):
    def parse_members(arg: str | None) -> Spec:
        """`kind:A+B[+...]`, members being drafter specs (a '+' inside a draft model's path is kept when
        the text after it does not start with a drafter name)."""
        pieces: list[str] = []
        for piece in (arg or "").split("+"):
            if pieces and pieces[-1].startswith("draft:") and piece.partition(":")[0] not in KINDS:
                pieces[-1] += "+" + piece
            else:
                pieces.append(piece)
        if len(pieces) < 2 or not all(p.strip() for p in pieces):
            raise UserError(
                f"{kind} needs two or more drafters joined by '+', e.g. {kind}:ngram+draft:<model>; "
                f"got {arg!r}"
            )
        return Spec(kind, members=tuple(_member(p.strip(), kind) for p in pieces))

    return parse_members


def _build_members(composite):
    def build_members(spec: Spec, ctx: DrafterContext) -> Drafter:
        return composite(
            [build(replace(m, cap=None), ctx) for m in spec.members], [m.cap for m in spec.members]
        )

    return build_members


def _format_members(spec: Spec) -> str:
    return f"{spec.kind}:" + "+".join(map(str, spec.members))


register(
    Kind(
        "none",
        _parse_none,
        lambda spec, ctx: NoDrafter(),
        weightless=True,
        speculates=False,
        trees=lambda spec: False,
        tree_nodes=lambda spec, k: 0,
    )
)
register(Kind("ngram", _parse_ngram, _build_ngram, weightless=True, format=_format_ngram))
register(Kind("draft", _parse_draft, _build_draft, draft_models=lambda spec: (spec.arg,)))
register(
    Kind(
        "ensemble",
        _parse_members("ensemble"),
        _build_members(EnsembleDrafter),
        weightless=True,
        trees=lambda spec: True,
        tree_nodes=lambda spec, k: sum(m.tree_nodes(m.k(k)) for m in spec.members),
        format=_format_members,
    )
)
register(
    Kind(
        "fallback",
        _parse_members("fallback"),
        _build_members(FallbackDrafter),
        weightless=True,
        trees=lambda spec: any(m.trees for m in spec.members),
        tree_nodes=lambda spec, k: max(m.tree_nodes(m.k(k)) for m in spec.members),
        format=_format_members,
    )
)
register(Kind("medusa", _parse_heads("medusa"), _build_medusa, uses_features=True))
register(
    Kind(
        "eagle",
        _parse_heads("eagle", ("stop", "window", "bits", "calibrate"), ("stop",), ("calibrate",)),
        _build_eagle,
        uses_features=True,
    )
)
register(
    Kind(
        "suffix",
        _parse_suffix,
        _build_suffix,
        weightless=True,
        learns=True,
        format=_format_suffix,
        trees=lambda spec: spec.option("tree") == 1,
        tree_nodes=lambda spec, k: min(k, spec.option("max_tree_depth")),
    )
)


__all__ = [
    "CrossVocabDrafter",
    "Drafter",
    "DrafterContext",
    "DraftModelDrafter",
    "DraftTreeDrafter",
    "EnsembleDrafter",
    "FallbackDrafter",
    "KINDS",
    "Kind",
    "NgramDrafter",
    "NoDrafter",
    "Proposal",
    "Spec",
    "SuffixCache",
    "SuffixDrafter",
    "build",
    "canonical",
    "draft_model",
    "parse",
]
