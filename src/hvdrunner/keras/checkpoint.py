"""Rank-0 checkpoints: model weights + optimizer state + epoch, verified at save and load.

Layout: ``<dir>/epoch-00003/{model.weights.h5, optimizer.npz, state.json}``. A checkpoint is
written into ``<dir>/.tmp-…``, each file fsynced and its SHA-256 recorded in ``state.json``
(written last), read back and verified, then the folder is renamed into place. At load, a
checkpoint whose files no longer match their recorded sizes and hashes (truncated, bit rot,
half-copied) is skipped with a warning naming it, and the newest intact one is used: one
corrupt file never blocks every retry.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import uuid
from typing import Any

import numpy as np

from hvdrunner import _paths
from hvdrunner.keras import compat

_NAME = re.compile(r"^epoch-(\d{5,})$")
WEIGHTS, OPTIMIZER, STATE = "model.weights.h5", "optimizer.npz", "state.json"
_FORMAT = 2


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (corrupt, or made for another model)."""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_dir(checkpoint_dir: str) -> str:
    """Create ``checkpoint_dir`` and prove it writable; the local path. Raises ``ValueError``.

    Called on the driver before any rank starts, so an unusable directory fails in seconds,
    not after the first epoch.
    """
    path = _paths.resolve(checkpoint_dir).local_path
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(
            f"checkpoint_dir={checkpoint_dir!r} is a file, not a directory; pass a directory "
            f"path (it is created if missing)."
        )
    try:
        _paths.ensure_writable(path)
    except OSError as exc:
        raise ValueError(
            f"checkpoint_dir={checkpoint_dir!r} is not writable ({exc.strerror or exc}); pass a "
            f"directory this job can write on every node (/dbfs/..., /Volumes/... on "
            f"Databricks), or checkpoint_dir=None for no checkpoints."
        ) from exc
    return path


class CheckpointStore:
    """Checkpoints of one training job under ``checkpoint_dir`` (local, dbfs:/, /Volumes/)."""

    def __init__(self, checkpoint_dir: str, keep: int) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.root = _paths.resolve(checkpoint_dir).local_path
        self.keep = keep

    def _candidates(self) -> list[tuple[int, str]]:
        if not os.path.isdir(self.root):
            return []
        out = []
        for name in os.listdir(self.root):
            m = _NAME.match(name)
            if m:
                out.append((int(m.group(1)), os.path.join(self.root, name)))
        return sorted(out)

    def verify(self, path: str) -> dict[str, Any]:
        """The checkpoint's state, after checking every file against it; raises if corrupt."""
        try:
            with open(os.path.join(path, STATE)) as f:
                state = json.load(f)
            files = state["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{path}/{STATE} is missing or unreadable ({exc})") from exc
        for name, meta in files.items():
            full = os.path.join(path, name)
            if not os.path.isfile(full):
                raise CheckpointError(f"{full} is missing")
            size = os.path.getsize(full)
            if size != meta["size"]:
                raise CheckpointError(f"{full} has {size} bytes, {meta['size']} were written")
            if _sha256(full) != meta["sha256"]:
                raise CheckpointError(f"{full} does not match the hash recorded when it was saved")
        return dict(state)

    def latest(self) -> tuple[int, str] | None:
        """``(epochs_done, path)`` of the newest intact checkpoint, or ``None``.

        Corrupt newer ones are reported on stderr (with the one used instead) and skipped.
        """
        skipped: list[str] = []
        for epoch, path in reversed(self._candidates()):
            try:
                self.verify(path)
            except CheckpointError as exc:
                skipped.append(f"{path} ({exc})")
                continue
            for s in skipped:
                print(
                    f"[hvdrunner] WARNING: skipping corrupt checkpoint {s}; resuming from the "
                    f"newest intact one, {path}",
                    file=sys.stderr,
                    flush=True,
                )
            return epoch, path
        for s in skipped:
            print(
                f"[hvdrunner] WARNING: skipping corrupt checkpoint {s}; no intact checkpoint "
                f"left in {self.root}: training starts from scratch",
                file=sys.stderr,
                flush=True,
            )
        return None

    def save(self, model: Any, optimizer: Any, epochs_done: int) -> str:
        os.makedirs(self.root, exist_ok=True)
        tmp = os.path.join(self.root, f".tmp-{uuid.uuid4().hex}")
        final = os.path.join(self.root, f"epoch-{epochs_done:05d}")
        os.makedirs(tmp)
        try:
            model.save_weights(os.path.join(tmp, WEIGHTS))
            values = [np.asarray(v.numpy()) for v in compat.optimizer_variables(optimizer)]
            np.savez(os.path.join(tmp, OPTIMIZER), *values)
            files = {}
            for name in (WEIGHTS, OPTIMIZER):
                _fsync(os.path.join(tmp, name))
                full = os.path.join(tmp, name)
                files[name] = {"size": os.path.getsize(full), "sha256": _sha256(full)}
            state = {
                "format": _FORMAT,
                "epochs_done": epochs_done,
                "optimizer_variables": len(values),
                "files": files,
            }
            with open(os.path.join(tmp, STATE), "w") as f:
                json.dump(state, f)
                f.flush()
                os.fsync(f.fileno())
            self.verify(tmp)  # read back from disk before it becomes visible
            if os.path.exists(final):  # a retried epoch: replace the older copy
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync(self.root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for _, old in self._candidates()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def restore(self, path: str, model: Any, optimizer: Any) -> int:
        """Load a verified checkpoint into a compiled model with a built optimizer; its epoch."""
        state = self.verify(path)
        mismatch = (
            f"the checkpoint {path} (checkpoint_dir={self.checkpoint_dir!r}) does not fit this "
            f"model/optimizer: {{}}. It was written by a different model; point checkpoint_dir "
            f"at a new directory (or delete {self.root}) to start over."
        )
        try:
            model.load_weights(os.path.join(path, WEIGHTS))
        except (ValueError, KeyError) as exc:
            raise CheckpointError(mismatch.format(exc)) from exc
        with np.load(os.path.join(path, OPTIMIZER)) as saved:
            values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        variables = compat.optimizer_variables(optimizer)
        shapes = [tuple(v.shape) for v in variables]
        if len(values) != len(variables) or any(
            s != x.shape for s, x in zip(shapes, values, strict=False)
        ):
            raise CheckpointError(
                mismatch.format(
                    f"{len(values)} saved optimizer variables, {len(variables)} in this optimizer"
                )
            )
        for var, value in zip(variables, values, strict=True):
            var.assign(value)
        return int(state["epochs_done"])
