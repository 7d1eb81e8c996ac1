"""Plain numpy SGD on a linear model with mean squared error: the exact reference a
data-parallel Keras run must reproduce (``Dense(1)``, ``loss="mse"``, ``SGD(lr)``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def linear_sgd(
    w: np.ndarray,
    b: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    steps: Sequence[np.ndarray],
    lr: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Apply one SGD update per entry of ``steps`` (row indices of that update's batch)."""
    w, b = w.astype("float64"), b.astype("float64")
    for rows in steps:
        err = x[rows] @ w + b - y[rows].reshape(-1, 1)  # (B, 1)
        w = w - lr * 2.0 / len(rows) * x[rows].T @ err
        b = b - lr * 2.0 / len(rows) * err.sum(axis=0)
    return w, b
