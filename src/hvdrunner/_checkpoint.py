"""Rank-0 checkpoints: model weights + optimizer state + epoch, written atomically.

Layout: ``<dir>/epoch-00003/{weights.h5, optimizer.npz, state.json}``. A checkpoint is
written into ``<dir>/.tmp-…`` and renamed into place, so a crash mid-write never leaves a
half checkpoint that a retry would load; ``state.json`` is written last inside it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from typing import Any

import numpy as np

from hvdrunner import _paths

_NAME = re.compile(r"^epoch-(\d{5,})$")


class CheckpointStore:
    """Checkpoints of one training job under ``checkpoint_dir`` (local, dbfs:/, /Volumes/)."""

    def __init__(self, checkpoint_dir: str, keep: int) -> None:
        self.root = _paths.resolve(checkpoint_dir).local_path
        self.keep = keep

    def _complete(self) -> list[tuple[int, str]]:
        if not os.path.isdir(self.root):
            return []
        out = []
        for name in os.listdir(self.root):
            m = _NAME.match(name)
            path = os.path.join(self.root, name)
            if m and os.path.exists(os.path.join(path, "state.json")):
                out.append((int(m.group(1)), path))
        return sorted(out)

    def latest(self) -> tuple[int, str] | None:
        """``(epochs_done, path)`` of the newest complete checkpoint, or ``None``."""
        done = self._complete()
        return done[-1] if done else None

    def save(self, model: Any, optimizer: Any, epochs_done: int) -> str:
        os.makedirs(self.root, exist_ok=True)
        tmp = os.path.join(self.root, f".tmp-{uuid.uuid4().hex}")
        final = os.path.join(self.root, f"epoch-{epochs_done:05d}")
        os.makedirs(tmp)
        try:
            model.save_weights(os.path.join(tmp, "weights.h5"))
            values = [v.numpy() for v in optimizer.variables]
            np.savez(os.path.join(tmp, "optimizer.npz"), *values)
            with open(os.path.join(tmp, "state.json"), "w") as f:
                json.dump({"epochs_done": epochs_done, "optimizer_variables": len(values)}, f)
            if os.path.exists(final):  # a retried epoch: replace the older copy
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for _, old in self._complete()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def restore(self, path: str, model: Any, optimizer: Any) -> int:
        """Load a checkpoint into a compiled model whose optimizer is built; returns its epoch."""
        with open(os.path.join(path, "state.json")) as f:
            state = json.load(f)
        model.load_weights(os.path.join(path, "weights.h5"))
        with np.load(os.path.join(path, "optimizer.npz")) as saved:
            values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        variables = list(optimizer.variables)
        if len(values) != len(variables) or any(
            v.shape != tuple(x.shape) for v, x in zip(values, variables, strict=False)
        ):
            raise RuntimeError(
                f"the checkpoint at {path} does not match this model/optimizer "
                f"({len(values)} saved optimizer variables, {len(variables)} now). Point "
                f"checkpoint_dir at a new directory to start over."
            )
        for var, value in zip(variables, values, strict=True):
            var.assign(value)
        return int(state["epochs_done"])
