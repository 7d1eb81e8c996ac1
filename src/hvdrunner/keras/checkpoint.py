"""Rank-0 Keras checkpoints: model weights + optimizer state + epoch, verified at save and load.

Layout: ``<dir>/epoch-00003/{model.weights.h5, optimizer.npz, state.json}``. Integrity
(hashes, fsync, rename, fall back to the newest intact one) is the framework-neutral
:mod:`hvdrunner.core.checkpoint`; this module only writes and reads the Keras files.

Example:
    >>> store = CheckpointStore("/tmp/ckpt", keep=3)                   # doctest: +SKIP
    >>> store.save(model, model.optimizer, epochs_done=1)
    >>> store.restore(store.latest()[1], model, model.optimizer)
    1
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from hvdrunner.core.checkpoint import STATE, CheckpointDir, check_dir
from hvdrunner.errors import CheckpointError
from hvdrunner.keras import compat

WEIGHTS, OPTIMIZER = "model.weights.h5", "optimizer.npz"
_FORMAT = 2

__all__ = ["OPTIMIZER", "STATE", "WEIGHTS", "CheckpointError", "CheckpointStore", "check_dir"]


class CheckpointStore:
    """Checkpoints of one Keras training job under ``checkpoint_dir``."""

    def __init__(self, checkpoint_dir: str, keep: int) -> None:
        self.dir = CheckpointDir(checkpoint_dir, keep)
        self.checkpoint_dir, self.root = self.dir.checkpoint_dir, self.dir.root

    def latest(self) -> tuple[int, str] | None:
        """``(epochs_done, path)`` of the newest intact checkpoint, or ``None``."""
        return self.dir.latest()

    def save(
        self, model: Any, optimizer: Any, epochs_done: int, metrics: dict[str, Any] | None = None
    ) -> str:
        """Write model weights and optimizer variables as checkpoint ``epochs_done``, with
        the epoch ``metrics`` it carries (:mod:`hvdrunner.core.ledger`)."""

        def write(tmp: str) -> dict[str, Any]:
            model.save_weights(os.path.join(tmp, WEIGHTS))
            values = [np.asarray(v.numpy()) for v in compat.optimizer_variables(optimizer)]
            np.savez(os.path.join(tmp, OPTIMIZER), *values)
            return {"format": _FORMAT, "optimizer_variables": len(values)}

        return self.dir.save(write, epochs_done, metrics)

    def restore(self, path: str, model: Any, optimizer: Any) -> int:
        """Load a verified checkpoint into a compiled model with a built optimizer; its epoch."""
        state = self.dir.verify(path)
        try:
            model.load_weights(os.path.join(path, WEIGHTS))
        except (ValueError, KeyError) as exc:
            raise self.dir.mismatch(path, str(exc)) from exc
        with np.load(os.path.join(path, OPTIMIZER)) as saved:
            values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        variables = compat.optimizer_variables(optimizer)
        shapes = [tuple(v.shape) for v in variables]
        if len(values) != len(variables) or any(
            s != x.shape for s, x in zip(shapes, values, strict=False)
        ):
            raise self.dir.mismatch(
                path, f"{len(values)} saved optimizer variables, {len(variables)} in this optimizer"
            )
        for var, value in zip(variables, values, strict=True):
            var.assign(value)
        return int(state["epochs_done"])
