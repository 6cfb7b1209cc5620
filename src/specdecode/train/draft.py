"""`specdecode train draft`: distill a small draft model from the target (DistillSpec, Zhou et al.
2024): n decoder layers initialised from target layers spread over its depth (first ... last),
the target's embedding and LM head frozen and shared; forward KL from the target's next-token
distribution on the target's own responses (on-policy data for greedy decoding), computed over
the draft vocabulary (the most frequent tokens) to keep a step cheap on CPU.

Domain fine-tuning: `init` starts from an existing draft checkpoint (a directory, or "shipped")
instead of target layers, and `lora` > 0 trains only rank-`lora` adapters on its linear layers
(lora.py), merged into plain weights at export; data from `train data --prompts domain.jsonl`.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from specdecode.backends import checkpoint
from specdecode.drafters.distilled import build_model
from specdecode.train import features, loop
from specdecode.train import lora as lora_lib
from specdecode.train.corpus import load


def train(
    loaded,
    data_dir,
    out,
    schedule: loop.Schedule = loop.Schedule(),
    *,
    features_dir=None,
    source: features.Source | None = None,
    layers: int = 1,
    vocab: int = 4096,
    batch_tokens: int = 768,
    window: int = 384,
    init: str = "",
    lora: int = 0,
    lora_alpha: float = 0.0,
) -> loop.TrainResult:
    """schedule: steps (default 150), lr (default 5e-4), precision, checkpoints and held-out scoring
    (loop.Schedule). With schedule.val, the draft's top-1 agreement with the target's next token is
    scored on the held-out sequences (data.split)."""
    schedule = schedule.filled(steps=150, lr=5e-4)
    seed, val = schedule.seed, schedule.val
    torch.manual_seed(seed)
    corpus = load(loaded, data_dir, vocab=vocab, features_dir=features_dir, source=source, val=val)
    model, layers, picks = _model(loaded, layers, init)
    model.model.embed_tokens.weight.requires_grad_(False)
    if lora:
        lora_lib.apply(model, lora, lora_alpha or None)
    per_batch = max(1, batch_tokens // window)
    forward = partial(_forward, corpus.feats, corpus.lm_head, window)
    loss_fn, evaluate = loop.sequence_steps(
        forward, corpus.train_ids, corpus.val_ids, per_batch, seed, "top1"
    )
    recipe = {
        "steps": schedule.steps,
        "lr": schedule.lr,
        "amp": schedule.amp,
        "features": str(corpus.source.precision),
        "batch_tokens": batch_tokens,
        "window": window,
        "vocab": len(corpus.token_map),
        "seed": seed,
        "sequences": len(corpus.train_ids),
        "response_tokens": corpus.response_tokens,
        "val": val,
        "val_sequences": len(corpus.val_ids),
        "init": init or None,
        "lora": lora or None,
    }
    config = {
        "kind": "draft",
        "target": corpus.target,
        "num_layers": layers,
        "init_layers": picks,
        "train": recipe,
    }
    result = loop.run(
        model,
        loss_fn,
        partial(_export, config=config),
        out=out,
        schedule=schedule,
        desc="draft",
        evaluate=evaluate if corpus.val_ids else None,
    )
    lora_lib.merge(model)
    hf_dir = result.out / "hf"  # a complete HF model directory (with the embedding): --drafter draft:DIR/hf
    model.save_pretrained(hf_dir)
    loaded.tokenizer.save_pretrained(hf_dir)
    return result


def _model(loaded, layers: int, init: str):
    """The draft model in float32 on the CPU, sharing the target's LM head -> (model, its layer
    count, the target layers it started from): `layers` target layers spread over its depth (first
    ... last) and its final norm, or the `init` checkpoint's ("shipped": the packaged one)."""
    hf = loaded.model.hf
    if init:
        tensors, init_config = checkpoint.load(None if init == "shipped" else init, "draft", loaded)
        layers, picks = init_config["num_layers"], init_config.get("init_layers")
        return build_model(loaded.model, layers, tensors).float().cpu(), layers, picks
    model = build_model(loaded.model, layers).float().cpu()
    picks = torch.linspace(0, hf.config.num_hidden_layers - 1, layers).round().long().tolist()
    with torch.no_grad():
        for mine, theirs in zip(model.model.layers, picks):
            mine.load_state_dict(hf.model.layers[theirs].state_dict())
        model.model.norm.weight.copy_(hf.model.norm.weight)
    return model, layers, picks


def _forward(feats, lm_head: torch.Tensor, window: int, module, pick: list[int]):
    """sequence indices -> loss, top-1 agreement, rows scored: each sequence's last `window` tokens,
    the loss on the rows that predict a response token."""
    t = min(window, max(len(feats.tokens[i]) for i in pick))
    tokens, teacher, mask = [], [], []
    for i in pick:
        n = len(feats.tokens[i])
        rows = torch.arange(max(0, n - t), n)
        tokens.append(F.pad(feats.tokens[i][rows], (0, t - len(rows))))
        teacher.append(F.pad(feats.hidden[i][rows].float() @ lm_head.T, (0, 0, 0, t - len(rows))))
        mask.append(F.pad(rows + 1 >= feats.start[i], (0, t - len(rows))))  # predicts a response token
    hidden = module.model(input_ids=torch.stack(tokens)).last_hidden_state  # [B, T, H], after the norm
    mask = torch.stack(mask)
    loss, agree = loop.kl_loss(hidden @ lm_head.T, torch.stack(teacher), mask)
    return loss, {"top1": float(agree)}, [int(mask.sum())]


def _export(module, directory, *, config: dict) -> None:
    """The draft checkpoint: its weights (LoRA merged) in bf16 without the embedding (the target's)."""
    tensors = {
        k: v.to(torch.bfloat16)
        for k, v in lora_lib.merged_state_dict(module.model).items()
        if k != "embed_tokens.weight"
    }
    checkpoint.save(directory, tensors, config)
