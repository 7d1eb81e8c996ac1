"""The named options of :func:`hvdrunner.torch.fit` - losses, metrics, optimizers - in one
table each: :class:`~hvdrunner.torch.config.FitConfig` checks a name against it, the training
loop and the optimizer builder resolve the name through it.

Example:
    >>> resolve("MSE", LOSSES)[0]
    'mse'
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

Fn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y.long())


def _as_output(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return y.to(out.dtype).reshape(out.shape)


LOSSES: dict[str, Fn] = {
    "cross_entropy": _cross_entropy,
    "mse": lambda out, y: F.mse_loss(out, _as_output(out, y)),
    "l1": lambda out, y: F.l1_loss(out, _as_output(out, y)),
    "bce_with_logits": lambda out, y: F.binary_cross_entropy_with_logits(out, _as_output(out, y)),
}


def accuracy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Share of rows whose arg-max class (or logit > 0 for one output) equals the label."""
    pred = out.argmax(dim=1) if out.ndim > 1 and out.shape[1] > 1 else (out.reshape(-1) > 0)
    return (pred.long() == y.reshape(-1).long()).to(torch.float64).mean()


#: Metrics by name.
METRICS: dict[str, Fn] = {}


def resolve(spec: str | Fn, table: dict[str, Fn]) -> tuple[str, Fn]:
    """A loss/metric setting as ``(name, function)``."""
    if isinstance(spec, str):
        return spec.lower(), table[spec.lower()]
    return getattr(spec, "__name__", type(spec).__name__).lower(), spec


METRICS["accuracy"] = accuracy
#: Optimizers by name: ``(params, lr) -> optimizer``.
OPTIMIZERS: dict[str, Callable[..., Any]] = {
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
    "adamw": torch.optim.AdamW,
    "rmsprop": torch.optim.RMSprop,
}
