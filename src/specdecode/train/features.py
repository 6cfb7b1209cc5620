"""The target's features for training: one teacher-forced forward per sequence.

For each sequence: the final hidden state of every position (after the final norm; the target's
next-token distribution is lm_head(hidden)) and the outputs of the `layers` an EAGLE-3 head fuses.
Distributions are not stored: a trainer computes them from `hidden` over its draft vocabulary.
The layers' outputs are kept in bfloat16 (an EAGLE input; 2,304 floats a token in float32 would
hold 8 GB for 900k tokens), the final hidden states, which make the teacher's logits, in float32.
The result is cached in the data directory per target fingerprint and layer set, so the trainers
that follow (and a resumed run) skip the forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdecode.shards import Sequence


@dataclass
class Features:
    tokens: list[torch.Tensor]  # per sequence [n] token ids
    start: list[int]  # per sequence: index of the first response token (= prompt length)
    hidden: list[torch.Tensor]  # per sequence [n, H] final hidden (after the norm)
    layers: list[torch.Tensor]  # per sequence [n, len(layer ids) * H] bf16 captured layer outputs, concatenated


def compute(model, seqs: list[Sequence], layer_ids: tuple[int, ...] = ()) -> Features:
    """model: a CausalLM (FastLlama or HFModel), asked for its final hidden rows and the layers `layer_ids`."""
    from tqdm import tqdm

    model = teacher(model)
    out = Features([], [], [], [])
    try:
        for s in tqdm(seqs, desc="target features", unit="seq"):
            tokens = torch.tensor(s.tokens, dtype=torch.long)
            model.reset()
            feats = model.forward(tokens, num_logits=1, layers=(-1, *layer_ids)).features  # [n, (1 + layers) H]
            width = feats.shape[1] // (1 + len(layer_ids))
            hidden, layers = feats[:, :width], feats[:, width:]  # the final hidden rows, the layers' concatenated
            out.tokens.append(tokens)
            out.start.append(len(s.prompt_ids))
            out.hidden.append(hidden.float().cpu().clone())  # clone: a normal (not inference) tensor
            out.layers.append(layers.to(torch.bfloat16).cpu().clone())
    finally:
        model.reset()
    return out


def teacher(model):
    """The forward for whole teacher-forced sequences: Hugging Face's where the model keeps its float
    weights (its oneDNN/MKL GEMMs ran a 600-token sequence in 1.8 s against 3.6 s in our row-invariant
    kernels, one thread, AMD EPYC Zen 3; features are training data, not a decode step's bits), else
    the model itself (a GGUF target that released its float linears)."""
    from specdecode.backends.models import HFModel

    hf = getattr(model, "hf", None)
    if hf is None or isinstance(model, HFModel) or any(p.numel() == 0 for p in hf.parameters()):
        return model
    return HFModel(hf)


def cached(data_dir: str | Path, model, seqs: list[Sequence], fingerprint: str,
           layer_ids: tuple[int, ...] = ()) -> Features:
    """compute(), memoized in data_dir: the final hidden states in one file and each layer set in
    another, so a Medusa run reuses what an EAGLE run computed."""
    base = Path(data_dir) / f"features-{fingerprint}-{len(seqs)}"
    hidden_path = base.with_name(base.name + "-hidden.pt")
    layers_path = base.with_name(base.name + "-layers-" + ("_".join(map(str, layer_ids)) or "none") + ".pt")
    if hidden_path.exists() and (layers_path.exists() or not layer_ids):
        stored = torch.load(hidden_path)
        layers = torch.load(layers_path) if layer_ids else [h.new_zeros(len(h), 0) for h in stored["hidden"]]
        return Features(stored["tokens"], stored["start"], stored["hidden"], layers)
    feats = compute(model, seqs, layer_ids)
    _save_atomic({"tokens": feats.tokens, "start": feats.start, "hidden": feats.hidden}, hidden_path)
    if layer_ids:
        _save_atomic(feats.layers, layers_path)
    return feats


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)
