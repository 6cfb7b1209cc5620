"""Drafter checkpoints: a directory with `model.safetensors` and a small `config.json` that names the
target it was trained for (name + fingerprint of its architecture and embedding). Loading a
checkpoint for any other target is a clear error. Files are written atomically (temp + rename).
Shipped checkpoints live in the package: the default target's under `shipped/<kind>/`, another target's
under `shipped/<kind>-<its name>/`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from specdecode.errors import UserError
from specdecode.files import write_atomic

SHIPPED = Path(__file__).parent.parent / "shipped"


def fingerprint(model) -> str:
    """sha256 over the architecture numbers and a bf16 sample of the input embedding (so the same
    weights loaded in fp32 or bf16, on CPU or CUDA, give the same fingerprint)."""
    cfg = model.hf.config
    h = hashlib.sha256()
    for key in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        h.update(f"{key}={getattr(cfg, key, None)};".encode())
    rows = model.embedding.shape[0]
    sample = model.embedding(torch.arange(0, rows, max(1, rows // 512)))  # [<=513, H]
    sample = sample.detach().to("cpu", torch.bfloat16).view(torch.int16)
    h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


def describe(loaded) -> dict:
    """loaded: models.LoadedModel -> {"name", "fingerprint"} for a checkpoint's config."""
    return {"name": loaded.name, "fingerprint": fingerprint(loaded.model)}


def check(trained_for: dict, loaded, what: str, mine: str) -> None:
    """Raise UserError unless the checkpoint `what` was trained for this target (of fingerprint `mine`)."""
    if trained_for.get("fingerprint") != mine:
        raise UserError(
            f"{what} was trained for target {trained_for.get('name')!r} (fingerprint "
            f"{trained_for.get('fingerprint')}), not for {loaded.name!r} (fingerprint {mine}); "
            "train one for this target with `specdecode train`"
        )


def save(directory: str | Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """Weights (as given: the caller picks bf16) and config.json; config last, so a directory
    with a config always has the weights it describes."""
    from safetensors.torch import save_file

    directory = Path(directory)
    tensors = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    write_atomic(directory / "model.safetensors", lambda tmp: save_file(tensors, tmp))
    write_atomic(directory / "config.json", lambda tmp: Path(tmp).write_text(json.dumps(config, indent=1)))


def checkpoint_dir(spec: str | None, kind: str, target: str | None = None) -> Path:
    """Where a `kind` checkpoint lives: the directory spec names, or None: the shipped one for the target
    of fingerprint `target` (`shipped/<kind>-<name>/`, its config naming that fingerprint), else the
    default target's (`shipped/<kind>/`)."""
    if spec:
        return Path(spec).expanduser()
    for directory in sorted(SHIPPED.glob(f"{kind}-*")) if target else ():
        config = directory / "config.json"
        if config.is_file() and json.loads(config.read_text()).get("target", {}).get("fingerprint") == target:
            return directory
    return SHIPPED / kind


def load(spec: str | None, kind: str, loaded) -> tuple[dict[str, torch.Tensor], dict]:
    """spec: a checkpoint directory, or None for the shipped one -> (tensors, config), after checking
    that it is a `kind` checkpoint trained for the loaded target."""
    from safetensors.torch import load_file

    mine = fingerprint(loaded.model)
    directory = checkpoint_dir(spec, kind, None if spec else mine)
    if not (directory / "config.json").is_file():
        where = spec or f"the shipped {kind} drafter ({directory})"
        raise UserError(f"no {kind} checkpoint at {where}: train one with `specdecode train {kind}`")
    config = json.loads((directory / "config.json").read_text())
    if config.get("kind") != kind:
        raise UserError(f"{directory} holds a {config.get('kind')!r} checkpoint, not {kind!r}")
    check(config.get("target", {}), loaded, f"the {kind} drafter in {directory}", mine)
    return load_file(directory / "model.safetensors"), config
