"""Drafters by name. A spec is `name` or `name:argument`, e.g. `none`, `ngram`, `draft:/path/to/model`.

Options are `key=value` segments separated by ':' (before a model path): `ngram:2-4:b=3`,
`draft:b=4:nodes=24:/path/to/model`; `ensemble:A+B` joins drafter specs."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass

from specdecode.drafters.base import Drafter, Proposal
from specdecode.drafters.cross_vocab import CrossVocabDrafter
from specdecode.drafters.draft_model import DraftModelDrafter
from specdecode.drafters.draft_tree import DraftTreeDrafter
from specdecode.drafters.ensemble import EnsembleDrafter
from specdecode.drafters.ngram import NgramDrafter
from specdecode.drafters.none import NoDrafter
from specdecode.errors import UserError
from specdecode.models import LoadedModel


@dataclass
class DrafterContext:
    """What a drafter factory may use: the loaded target and how models are loaded."""

    target: LoadedModel
    dtype: str = "fp32"
    device: str | None = None
    backend: str = "auto"
    quant: str = "none"  # of draft models: "int8" quantizes their linear layers (quant.py)


def _options(segments: list[str], known: set[str], what: str) -> dict[str, int]:
    """`key=value` segments of a spec argument -> {key: positive int}."""
    options = {}
    for segment in segments:
        key, _, value = segment.partition("=")
        if key not in known:
            raise UserError(f"unknown {what} option {key!r}; known: {', '.join(sorted(known))}")
        try:
            options[key] = int(value)
        except ValueError:
            raise UserError(f"{what} option {key} needs an integer, got {value!r}") from None
        if options[key] < 1:
            raise UserError(f"{what} option {key} must be >= 1, got {options[key]}")
    return options


def _ngram(arg: str | None, ctx: DrafterContext) -> Drafter:
    """`ngram[:N|:MIN-MAX][:b=B]`: b > 1 proposes a tree of up to b continuations."""
    segments = arg.split(":") if arg else []
    ranges = [s for s in segments if "=" not in s]
    options = _options([s for s in segments if "=" in s], {"b"}, "ngram")
    if len(ranges) > 1:
        raise UserError(f"ngram argument must be N or MIN-MAX (and b=B), got {arg!r}")
    kwargs = {"branches": options.get("b", 1)}
    if ranges:
        try:
            lo, _, hi = ranges[0].partition("-")
            kwargs.update(max_n=int(hi or lo), min_n=int(lo))
        except ValueError:
            raise UserError(f"ngram argument must be N or MIN-MAX, got {arg!r}") from None
    return NgramDrafter(**kwargs)


def _draft(arg: str | None, ctx: DrafterContext) -> Drafter:
    """`draft:[b=B:[nodes=N:]]<model>`: b gives a static tree of b branches, nodes a dynamic
    (EAGLE-2) tree of that many nodes grown b children at a time. The model path may contain ':'.
    A model with another tokenizer than the target's drafts across vocabularies (chains only)."""
    from specdecode import models
    from specdecode.drafters import distilled
    from specdecode.tokenizer_check import compare

    if arg == "":
        raise UserError("the draft drafter needs a model: --drafter draft:<path or hub id> "
                        "(or `draft` for the shipped one)")
    if distilled.is_checkpoint(arg):  # none: the shipped distilled draft; or a `train draft` checkpoint
        return distilled.load(arg, ctx)
    options, path = draft_options(arg)
    draft = models.load(path, ctx.dtype, ctx.device, ctx.backend, ctx.quant)
    if not compare(ctx.target.tokenizer, draft.tokenizer).compatible:
        if options:
            raise UserError(f"draft model {path} has another tokenizer than the target; token trees (b=, nodes=) "
                            "need the same one: cross-vocabulary drafting proposes chains")
        return CrossVocabDrafter(draft.model, draft.tokenizer, ctx.target.tokenizer, ctx.target.model.vocab_size,
                                 draft.eos_ids, ctx.target.tokenizer.eos_token_id)
    if "b" in options:
        return DraftTreeDrafter(draft.model, ctx.target.model.vocab_size, options["b"], options.get("nodes"))
    return DraftModelDrafter(draft.model, ctx.target.model.vocab_size)


def tree_options(arg: str, what: str) -> tuple[dict[str, int], str]:
    """`[b=B:[nodes=N:]]REST` -> ({"b": B, "nodes": N}, REST: a model path, hub id or checkpoint)."""
    segments = arg.split(":")
    n_options = next(i for i, s in enumerate(segments + [""]) if not _OPTION.fullmatch(s))
    options = _options(segments[:n_options], {"b", "nodes"}, what)
    if "nodes" in options and "b" not in options:
        raise UserError(f"{what} option nodes=N needs b=B (children per expanded node)")
    return options, ":".join(segments[n_options:])


def draft_options(arg: str) -> tuple[dict[str, int], str]:
    """`[b=B:[nodes=N:]]<model>` -> ({"b": B, "nodes": N}, model path or hub id)."""
    options, path = tree_options(arg, "draft")
    if not path:
        raise UserError("the draft drafter needs a model: --drafter draft:<path or hub id>")
    return options, path


def _ensemble(arg: str | None, ctx: DrafterContext) -> Drafter:
    """`ensemble:A+B[+...]`, members being drafter specs (a '+' inside a draft model's path is kept
    when the text after it does not start with a drafter name)."""
    members: list[str] = []
    for piece in (arg or "").split("+"):
        in_path = members and members[-1].startswith("draft:") and piece.partition(":")[0] not in FACTORIES
        if in_path:
            members[-1] += "+" + piece
        else:
            members.append(piece)
    if len(members) < 2 or not all(members):
        raise UserError(f"ensemble needs two or more drafters joined by '+', e.g. ensemble:ngram+draft:<model>; got {arg!r}")
    for spec in members:
        if check_spec(spec) in ("ensemble", "none"):
            raise UserError(f"ensemble members cannot be {spec!r}")
    return EnsembleDrafter([build(spec, ctx) for spec in members])


_OPTION = re.compile(r"[a-z]+=[^:]*")


def _heads(kind: str) -> Callable[[str | None, DrafterContext], Drafter]:
    """`medusa|eagle[:b=B[:nodes=N]][:DIR]`: heads on the target's features; b > 1 proposes trees."""

    def factory(arg: str | None, ctx: DrafterContext) -> Drafter:
        module = importlib.import_module(f"specdecode.drafters.{kind}")
        options, path = tree_options(arg or "", kind)
        return module.load(path or None, ctx.target, options.get("b", 1), options.get("nodes"))

    return factory


FACTORIES: dict[str, Callable[[str | None, DrafterContext], Drafter]] = {
    "none": lambda arg, ctx: NoDrafter(),
    "ngram": _ngram,
    "draft": _draft,  # draft (shipped, distilled), draft:CHECKPOINT, draft:[b=B:[nodes=N:]]<HF model>
    "ensemble": _ensemble,
    "medusa": _heads("medusa"),  # medusa[:b=B[:nodes=N]][:DIR]: no DIR = the shipped heads for the default target
    "eagle": _heads("eagle"),  # eagle[:b=B[:nodes=N]][:DIR]: likewise
}


def check_spec(spec: str) -> str:
    """Validate a drafter spec's name before anything is loaded; returns the name."""
    name = spec.partition(":")[0]
    if name not in FACTORIES:
        raise UserError(f"unknown drafter {spec!r}; known: {', '.join(FACTORIES)}")
    return name


def build(spec: str, ctx: DrafterContext) -> Drafter:
    name, sep, arg = spec.partition(":")
    check_spec(spec)
    return FACTORIES[name](arg if sep else None, ctx)


__all__ = ["CrossVocabDrafter", "Drafter", "DrafterContext", "DraftModelDrafter", "DraftTreeDrafter", "EnsembleDrafter",
           "NgramDrafter", "NoDrafter", "Proposal", "build", "check_spec", "draft_options", "tree_options",
           "FACTORIES"]
