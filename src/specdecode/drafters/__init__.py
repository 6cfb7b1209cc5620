"""Drafters by name. A spec is `name` or `name:argument`, e.g. `none`, `ngram`, `draft:/path/to/model`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdecode.drafters.base import Drafter, Proposal
from specdecode.drafters.draft_model import DraftModelDrafter
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


def _ngram(arg: str | None, ctx: DrafterContext) -> Drafter:
    if arg is None:
        return NgramDrafter()
    try:
        lo, _, hi = arg.partition("-")
        return NgramDrafter(max_n=int(hi or lo), min_n=int(lo))
    except ValueError:
        raise UserError(f"ngram argument must be N or MIN-MAX, got {arg!r}") from None


def _draft(arg: str | None, ctx: DrafterContext) -> Drafter:
    from specdecode import models
    from specdecode.drafters import distilled
    from specdecode.tokenizer_check import compare

    if arg == "":
        raise UserError("the draft drafter needs a model: --drafter draft:<path or hub id> "
                        "(or `draft` for the shipped one)")
    if distilled.is_checkpoint(arg):  # none: the shipped distilled draft; or a `train draft` checkpoint
        return distilled.load(arg, ctx)
    draft = models.load(arg, ctx.dtype, ctx.device, ctx.backend)
    report = compare(ctx.target.tokenizer, draft.tokenizer)
    if not report.compatible:
        raise UserError(
            f"draft model {arg} does not share the target's tokenizer: "
            + report.summary(ctx.target.name, arg).replace("\n", " | ")
        )
    return DraftModelDrafter(draft.model, ctx.target.model.vocab_size)


def _medusa(arg: str | None, ctx: DrafterContext) -> Drafter:
    from specdecode.drafters import medusa

    return medusa.load(arg, ctx.target)


def _eagle(arg: str | None, ctx: DrafterContext) -> Drafter:
    from specdecode.drafters import eagle

    return eagle.load(arg, ctx.target)


FACTORIES: dict[str, Callable[[str | None, DrafterContext], Drafter]] = {
    "none": lambda arg, ctx: NoDrafter(),
    "ngram": _ngram,
    "draft": _draft,  # draft (shipped, distilled), draft:CHECKPOINT or draft:<HF model>
    "medusa": _medusa,  # medusa[:DIR]: trained heads; no DIR = the shipped ones for the default target
    "eagle": _eagle,  # eagle[:DIR]: likewise
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


__all__ = ["Drafter", "DrafterContext", "Proposal", "build", "check_spec", "FACTORIES"]
