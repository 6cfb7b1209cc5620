"""What every trainer starts from: the sequences `train data` wrote, the target they belong to, its
features (features.py), the split into training and held-out sequences (data.split), the draft
vocabulary (data.token_map over the training sequences) and the target's LM head over it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdecode.backends import checkpoint
from specdecode.shards import Record
from specdecode.train import data, features


@dataclass(frozen=True)
class TrainingSet:
    seqs: list[Record]
    target: dict  # checkpoint.describe: the target a checkpoint names
    source: features.Source  # the target as the features were computed from (its dtype)
    feats: features.Features
    train_ids: list[int]  # indices into seqs
    val_ids: list[int]  # held out: never drawn for a batch
    token_map: torch.Tensor  # [Vd] the draft vocabulary's target ids
    lm_head: torch.Tensor  # [Vd, H] float32 on the CPU: the target's LM head rows of the draft vocabulary

    @property
    def response_tokens(self) -> int:
        """Response tokens of the training sequences (what a data-scaling curve counts)."""
        return data.response_tokens([self.seqs[i] for i in self.train_ids])


def load(
    loaded,
    data_dir,
    *,
    vocab: int,
    features_dir=None,
    source: features.Source | None = None,
    val: float = 0.0,
    layer_ids: tuple[int, ...] = (),
) -> TrainingSet:
    """loaded: the fp32 target; data_dir: `train data`'s directory; vocab: the draft vocabulary's size;
    features_dir: the feature store (default: DATA/features); source: the target the features come
    from (default: loaded itself); val: the held-out fraction; layer_ids: the layers whose outputs
    the features also keep (EAGLE)."""
    seqs = data.read(data_dir)
    target = checkpoint.describe(loaded)
    source = source or features.Source(loaded.model)
    store = features_dir or Path(data_dir) / "features"
    feats = source.features(store, seqs, target["fingerprint"], layer_ids)
    train_ids, val_ids = data.split(seqs, val)
    token_map = data.token_map([seqs[i] for i in train_ids], loaded.model.vocab_size, vocab)
    lm_head = loaded.model.output_weight().detach().float().cpu()[token_map]
    return TrainingSet(seqs, target, source, feats, train_ids, val_ids, token_map, lm_head)
