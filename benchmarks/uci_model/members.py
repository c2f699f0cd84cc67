"""The members of one batched fit, and per-split tensors expanded to per-member ones."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Members:
    """The members of one batched fit: configuration, split and target SD of each."""

    configs: list[dict]
    y_std: torch.Tensor  # (M,) float64, target SD of each member's training rows
    n_train: int
    info: dict = field(default_factory=dict)

    def __len__(self):
        return len(self.configs)


def _expand_members(t, per_split):
    """``(S, ...)`` -> ``(S * per_split, ...)``, member-major within each split."""
    if per_split == 1:
        return t
    return t.unsqueeze(1).expand((t.shape[0], per_split) + t.shape[1:]).flatten(0, 1)
