"""Rank-0 PyTorch checkpoints: model and optimizer ``state_dict`` + epoch, verified.

Layout: ``<dir>/epoch-00003/{model.pt, optimizer.pt, state.json}``. Integrity (hashes,
fsync, rename, fall back to the newest intact one) is the framework-neutral
:mod:`hvdrunner.core.checkpoint`, the same as the Keras side's; this module only writes and
reads the torch files.

Example:
    >>> store = CheckpointStore("/tmp/ckpt", keep=3)                   # doctest: +SKIP
    >>> store.save(model, optimizer, epochs_done=1)
    >>> store.restore(store.latest()[1], model, optimizer)
    1
"""

from __future__ import annotations

import os
from typing import Any

import torch

from hvdrunner.core.checkpoint import CheckpointDir

MODEL, OPTIMIZER = "model.pt", "optimizer.pt"
_FORMAT = 1


class CheckpointStore:
    """Checkpoints of one PyTorch training job under ``checkpoint_dir``."""

    def __init__(self, checkpoint_dir: str, keep: int) -> None:
        self.dir = CheckpointDir(checkpoint_dir, keep)

    def latest(self) -> tuple[int, str] | None:
        """``(epochs_done, path)`` of the newest intact checkpoint, or ``None``."""
        return self.dir.latest()

    def save(
        self, model: torch.nn.Module, optimizer: Any, epochs_done: int,
        metrics: dict[str, Any] | None = None,
    ) -> str:  # fmt: skip
        """Write the model's and the optimizer's state as checkpoint ``epochs_done``, with
        the epoch ``metrics`` it carries (:mod:`hvdrunner.core.ledger`)."""

        def write(tmp: str) -> dict[str, Any]:
            torch.save(model.state_dict(), os.path.join(tmp, MODEL))
            torch.save(optimizer.state_dict(), os.path.join(tmp, OPTIMIZER))
            return {"format": _FORMAT, "framework": f"torch {torch.__version__}"}

        return self.dir.save(write, epochs_done, metrics)

    def restore(self, path: str, model: torch.nn.Module, optimizer: Any) -> int:
        """Load a verified checkpoint into ``model`` and ``optimizer``; the epochs it holds."""
        state = self.dir.verify(path)
        device = next(model.parameters()).device
        try:
            model.load_state_dict(torch.load(os.path.join(path, MODEL), map_location=device))
            optimizer.load_state_dict(
                torch.load(os.path.join(path, OPTIMIZER), map_location=device)
            )
        except (RuntimeError, ValueError, KeyError) as exc:
            raise self.dir.mismatch(path, str(exc).splitlines()[0]) from exc
        return int(state["epochs_done"])


__all__ = ["MODEL", "OPTIMIZER", "CheckpointStore"]
