"""What the commands share: the model, quantization, decoding and control arguments, their checks,
and the process set-up (threads, logging) before a model loads."""

from __future__ import annotations

import argparse
import os
import sys

from specdecode.errors import UserError

DRAFTERS_HELP = (  # every registered kind (drafters/__init__.py; tests/test_readme.py checks the list)
    "none, ngram[:N|:MIN-MAX][:b=B], suffix[:key=value...][:PATH], draft[:<model>], medusa[:DIR], "
    "eagle[:DIR], ensemble:A+B, fallback:A+B (docs/drafters.md)"
)


def model_args(p: argparse.ArgumentParser, dtype: str = "auto", dtype_list: bool = False) -> None:
    """--target, --dtype (dtype_list: a comma-separated list, one run each), --device, --threads,
    --backend; parse_precision reads --dtype before the command runs."""
    p.add_argument(
        "--target", default=None, help="model dir, .gguf file or hub id (default: SmolLM2-135M-Instruct)"
    )
    p.add_argument(
        "--dtype",
        default=dtype,
        help="fp32, bf16, gguf (a GGUF file's blocks kept quantized, 8-bit activations), gguf-exact (the "
        "same blocks, float32 activations: the bits of fp32) or auto: gguf for GGUF targets on "
        "CPU, else fp32 (bench: comma-separated list)",
    )
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "fast", "hf"],
        help="forward implementation: fast (lean Llama), hf (transformers), auto (fast when supported)",
    )
    p.set_defaults(dtype_list=dtype_list)


def quant_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target-quant",
        default="none",
        choices=["none", "int8"],
        help="int8: the target's linear layers in int8 (torch dynamic quantization, CPU)",
    )
    p.add_argument(
        "--drafter-quant",
        default="none",
        choices=["none", "int8"],
        help="int8: the draft model's linear layers in int8 (draft drafters)",
    )


def check_quant(args, drafter_specs: list) -> None:
    """Validate --target-quant / --drafter-quant (of parsed drafter specs) before any model is loaded."""
    from specdecode.backends import quant

    for precision in args.precisions:
        quant.check(args.target_quant, precision, args.device)
        quant.check(args.drafter_quant, precision, args.device)
    if args.drafter_quant != "none" and not any(spec.draft_models for spec in drafter_specs):
        raise UserError(
            "--drafter-quant applies to draft models (draft, draft:<model>); "
            f"none among {', '.join(map(str, drafter_specs))}"
        )


DEFAULT_SPECULATION = (
    "default: the target's measured best where the registry names one (qwen2.5-coder-1.5b: n-gram "
    "lookup, then its shipped EAGLE head, k 8), else ngram at k 4"
)


def decode_args(p: argparse.ArgumentParser, drafter_default: str | None, k_list: bool = False) -> None:
    """drafter_default None: the target's measured best (speculation())."""
    more = f"; {DEFAULT_SPECULATION}" if drafter_default is None else ""
    p.add_argument("--drafter", default=drafter_default, help=f"{DRAFTERS_HELP} (bench: comma list){more}")
    if k_list:
        p.add_argument("--k", default="4", help="draft tokens per step (comma list: one run per value)")
    else:
        p.add_argument("--k", type=int, default=None, help="draft tokens per step (default: as --drafter's)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="apply the model's chat template (default: when it has one)",
    )


def control_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--adaptive", action="store_true", help="choose k per step (up to --k) from live α and costs"
    )
    p.add_argument(
        "--task", help="task label for routing and per-task stats (default: classified from the prompt)"
    )
    routing_args(p)


def routing_args(p: argparse.ArgumentParser) -> None:
    """A config's routes per task, learned routing and the per-task history (generate, serve)."""
    p.add_argument("--config", help="speculation config from `specdecode advise`: routes per task")
    p.add_argument(
        "--routing",
        choices=["config", "auto"],
        default="config",
        help="auto: learn the best drafter per task (among the config's candidates) from measured speedups",
    )
    p.add_argument("--state", help="per-task α history file (JSON), kept across runs and restarts")


def free_cores() -> int:
    """Cores not busy with other work, from the 1-minute load average (at least 1)."""
    try:
        busy = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return os.cpu_count() or 1
    return max(1, (os.cpu_count() or 1) - round(busy))


def speculation(args) -> None:
    """args.drafter and args.k, where not given, from the target (registry.speculation), said once."""
    from specdecode.backends import registry

    args.drafter, args.k, why = registry.speculation(args.target, args.drafter, args.k)
    if why:
        print(f"specdecode: {why}", file=sys.stderr)


def setup(args) -> None:
    import torch

    if args.threads is not None:
        if args.threads < 1:
            raise UserError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    elif (free := free_cores()) < torch.get_num_threads():
        # a thread waiting for a busy core stalls every parallel region (it waits for its slowest
        # thread): two threads beside a busy core run far slower than one (README, --threads)
        print(
            f"specdecode: {os.cpu_count() - free} of {os.cpu_count()} cores busy (load average "
            f"{os.getloadavg()[0]:.1f}): using {free} thread(s); --threads N to choose",
            file=sys.stderr,
        )
        torch.set_num_threads(free)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def sampling(args):
    from specdecode.core.sampling import Warp

    if args.max_new_tokens <= 0:
        raise UserError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
    return Warp(args.temperature, args.top_k, args.top_p)


def parse_precision(args) -> None:
    """--dtype, parsed once (commands with model_args): args.precisions, the list `bench` takes (one
    precision for every other command), and args.precision, its first.

    auto -> gguf for a GGUF target on CPU with the fused kernels, else fp32. Commands that promise
    fp32's tokens take gguf-exact instead (exact_auto): `train data`, whose data is fp32's output, and
    `serve` where its batched rows could round differently from a single request's (harmless in
    float32, enough to move an 8-bit activation across a rounding step): everywhere but on the VNNI
    kernels, where every row gets the same bits in any call (kernels.rows_exact_int8)."""
    if getattr(args, "dtype", None) is None:
        return
    from specdecode.backends.precision import Precision

    texts = [t for t in args.dtype.split(",") if t] if getattr(args, "dtype_list", False) else [args.dtype]
    precisions = [Precision.parse(text) for text in texts]
    if any(p.auto for p in precisions):
        picked = _auto(args)
        precisions = [picked if p.auto else p for p in precisions]
    args.precisions, args.precision = precisions, (precisions[0] if precisions else None)


def _auto(args):
    """What --dtype auto means for this command's target, device and quantization."""
    from specdecode.backends import models
    from specdecode.backends.precision import FP32, GGUF, GGUF_EXACT

    try:
        picked = models.auto_dtype(
            args.target, args.device, getattr(args, "target_quant", "none"), args.backend
        )
    except UserError:  # a target that cannot be read: said where it is loaded, after the cheaper checks
        return FP32
    if picked == GGUF and getattr(args, "exact_auto", False):
        from specdecode.backends import kernels

        rows_exact = args.exact_auto == "unless-rows-exact" and kernels.rows_exact_int8()
        return GGUF if rows_exact else GGUF_EXACT
    return picked
