"""Learning-rate rules of data-parallel training (Goyal et al., 2017), framework-free.

With ``size`` ranks the effective batch is ``size`` times larger, so the rate is scaled by
``size``; a warmup ramps it from the single-rank rate to the scaled one, linearly per batch.

Example:
    >>> scaled_lr(0.001, 4)
    0.004
    >>> warmup_multiplier(0.0, size=4, warmup_epochs=2), warmup_multiplier(2.0, 4, 2)
    (0.25, 1.0)
"""

from __future__ import annotations


def scaled_lr(base_lr: float, size: int) -> float:
    """The rate for ``size`` ranks: ``base_lr * size``."""
    return float(base_lr) * size


def warmup_multiplier(epoch: float, size: int, warmup_epochs: int) -> float:
    """Factor on the scaled rate at (fractional) ``epoch``: ``1/size`` at 0, 1 at the end."""
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return 1.0
    return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)
