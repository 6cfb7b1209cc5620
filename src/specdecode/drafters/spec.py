"""Drafter specs, parsed once.

A spec string names a drafter kind and its argument: `none`, `ngram:2-4:b=3`,
`draft:b=4:nodes=24:/path/to/model`, `ensemble:ngram+draft:<model>`, `fallback:ngram+eagle:k=1`
(drafters/__init__.py lists the forms). `parse` turns it into a `Spec`: the kind, its options
(`key=value` integers) in the kind's canonical order, its argument (a model path, a checkpoint
directory) and, for an ensemble, the member specs (a member may carry `k=N`, its cap). `str(spec)` is
the canonical form: `ngram:02-4`, `ngram: 2-4` and `ngram` all read as `ngram:2-4`, so equal
drafters have equal strings (metric labels, caches, config keys).

Each kind registers one `Kind`: how to parse and build it, and the facts other modules ask about
it (weightless, proposes trees, drafts from the target's features, which draft models it loads).
Code outside the registry asks the spec (`spec.weightless`, `spec.k(4)`) and never compares a
drafter's name.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from specdecode.errors import UserError


@dataclass(frozen=True)
class Spec:
    kind: str
    options: tuple[tuple[str, int | str], ...] = ()  # key=value options, in the kind's canonical order
    # (an int; `auto` where the kind measures the value when it builds the drafter: draft's stop)
    arg: str | None = None  # a model path / hub id / checkpoint directory; None: the shipped one, or none
    members: tuple["Spec", ...] = ()  # ensemble / fallback members
    cap: int | None = None  # a member's `k=N`: at most N draft tokens a step, whatever the step's k

    def __str__(self) -> str:
        return KINDS[self.kind].format(self) + (f":k={self.cap}" if self.cap else "")

    def option(self, key: str, default: int | None = None) -> int | str | None:
        return dict(self.options).get(key, default)

    @property
    def info(self) -> "Kind":
        return KINDS[self.kind]

    @property
    def speculates(self) -> bool:
        """False for a kind that never proposes anything (`none`): plain decoding."""
        return self.info.speculates

    def k(self, requested: int) -> int:
        """Draft tokens per step to run this spec with: `none` runs with k = 0, whatever was asked; a
        member with a cap at most its cap."""
        return min(requested, self.cap or requested) if self.speculates else 0

    @property
    def weightless(self) -> bool:
        """Builds without loading any weights or files (cheap enough to build per request)."""
        return self.info.weightless and self.arg is None and all(m.weightless for m in self.members)

    @property
    def learns(self) -> bool:
        """Proposes from the responses of earlier requests (suffix decoding): a rerun of the same prompt
        would find its own answer."""
        return self.info.learns or any(m.learns for m in self.members)

    @property
    def uses_features(self) -> bool:
        """Drafts from the target's hidden states (Medusa, EAGLE heads)."""
        return self.info.uses_features or any(m.uses_features for m in self.members)

    @property
    def trees(self) -> bool:
        """Proposes token trees (b > 1, dynamic trees, ensembles), not only chains."""
        return self.info.trees(self)

    def tree_nodes(self, k: int) -> int:
        """The most draft tokens one step may verify at depth k (k for a chain)."""
        return self.info.tree_nodes(self, k)

    @property
    def heads(self) -> tuple["Spec", ...]:
        """The specs, this one or its members, that draft from trained heads on the target's features."""
        return tuple(s for s in (self, *self.members) if s.info.uses_features)

    @property
    def draft_models(self) -> tuple[str | None, ...]:
        """The separate draft models this spec loads (None: the shipped distilled draft)."""
        return self.info.draft_models(self) + tuple(m for s in self.members for m in s.draft_models)


def _tree_option(spec: Spec) -> bool:
    return spec.option("b", 1) > 1 or spec.option("nodes") is not None


def _tree_nodes(spec: Spec, k: int) -> int:
    return spec.option("nodes") or spec.option("b", 1) * k


def options_then_arg(spec: Spec) -> str:
    """`kind[:key=value...][:arg]`: the form of kinds whose argument is a path (it may hold ':')."""
    parts = [spec.kind, *(f"{key}={value}" for key, value in spec.options)]
    return ":".join(parts + ([spec.arg] if spec.arg is not None else []))


@dataclass(frozen=True)
class Kind:
    """One drafter kind: its parser and builder, and the facts the rest of the code may ask."""

    name: str
    parse: Callable[[str | None], Spec]  # the text after `name:` (None: no ':') -> Spec
    build: Callable  # (Spec, DrafterContext) -> Drafter
    weightless: bool = False
    speculates: bool = True
    uses_features: bool = False
    learns: bool = (
        False  # proposals depend on earlier requests' responses (a benchmark must not replay to it)
    )
    trees: Callable[[Spec], bool] = _tree_option
    tree_nodes: Callable[[Spec, int], int] = _tree_nodes
    draft_models: Callable[[Spec], tuple[str | None, ...]] = field(default=lambda spec: ())
    format: Callable[[Spec], str] = options_then_arg


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    KINDS[kind.name] = kind
    return kind


def parse(text: str | Spec) -> Spec:
    """A spec string -> Spec (a Spec passes through); a clear UserError names what is wrong."""
    if isinstance(text, Spec):
        return text
    name, sep, arg = text.strip().partition(":")
    name = name.strip()
    if name not in KINDS:
        raise UserError(f"unknown drafter {text!r}; known: {', '.join(KINDS)}")
    return KINDS[name].parse(arg.strip() if sep else None)


def canonical(text: str) -> str:
    """The canonical string of a spec: `ngram:02-4` and `ngram: 2-4` -> `ngram:2-4`."""
    return str(parse(text))


# -- helpers for the kinds' parsers --------------------------------------------------------------

OPTION = re.compile(r"\s*[a-z_]+\s*=[^:]*")


def int_options(
    segments: list[str],
    known: tuple[str, ...],
    what: str,
    auto: tuple[str, ...] = (),
    switches: tuple[str, ...] = (),
) -> tuple[tuple[str, int | str], ...]:
    """`key=value` segments -> ((key, positive int), ...) in the order of `known`; the keys in `auto`
    also take the word `auto` (kept as the string, resolved when the drafter is built), those in
    `switches` take 0 or 1 only."""
    options: dict[str, int | str] = {}
    for segment in segments:
        key, _, value = (s.strip() for s in segment.partition("="))
        if key not in known:
            raise UserError(f"unknown {what} option {key!r}; known: {', '.join(sorted(known))}")
        if key in auto and value == "auto":
            options[key] = value
            continue
        try:
            options[key] = int(value)
        except ValueError:
            words = " or auto" if key in auto else ""
            raise UserError(f"{what} option {key} needs an integer{words}, got {value!r}") from None
        if key in switches:
            if options[key] not in (0, 1):
                raise UserError(f"{what} option {key} is 0 or 1, got {options[key]}")
        elif options[key] < 1:
            raise UserError(f"{what} option {key} must be >= 1, got {options[key]}")
    return tuple((key, options[key]) for key in known if key in options)


def tree_options(
    arg: str,
    what: str,
    extra: tuple[str, ...] = (),
    auto: tuple[str, ...] = (),
    switches: tuple[str, ...] = (),
) -> tuple[tuple[tuple[str, int | str], ...], str]:
    """`[b=B:[nodes=N:]]REST` -> ((("b", B), ("nodes", N)), REST: a model path, hub id or checkpoint);
    extra: the kind's other options (draft: vocab, stop); auto: those that may be `auto`; switches:
    those that are 0 or 1."""
    segments = arg.split(":")
    n_options = next(i for i, s in enumerate(segments + [""]) if not OPTION.fullmatch(s))
    options = int_options(segments[:n_options], ("b", "nodes", *extra), what, auto, switches)
    if "nodes" in dict(options) and "b" not in dict(options):
        raise UserError(f"{what} option nodes=N needs b=B (children per expanded node)")
    return options, ":".join(segments[n_options:]).strip()
