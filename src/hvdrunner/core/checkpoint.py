"""Verified checkpoint folders, whatever the framework writes into them.

Layout: ``<dir>/epoch-00003/{<the adapter's files>, state.json}``. A checkpoint is written
into ``<dir>/.tmp-…`` by the adapter's ``write`` callback; each file is fsynced and its size
and SHA-256 recorded in ``state.json`` (written last), read back and verified, then the
folder is renamed into place. At load, a checkpoint whose files no longer match their
records (truncated, bit rot, half-copied) is skipped with a warning naming it, and the
newest intact one is used: one corrupt file never blocks every retry.

Example:
    >>> store = CheckpointDir("/tmp/ckpt", keep=3)                     # doctest: +SKIP
    >>> store.save(lambda tmp: {"n_vars": write_my_files(tmp)}, epochs_done=1)
    >>> epoch, path = store.latest()
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from typing import Any

from hvdrunner import _paths
from hvdrunner._logging import get_logger
from hvdrunner.distributed import is_rank0
from hvdrunner.errors import CheckpointError

STATE = "state.json"
_NAME = re.compile(r"^epoch-(\d{5,})$")
_log = get_logger()


def sha256(path: str) -> str:
    """Hex SHA-256 of a file, read in 1 MiB blocks."""
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

    Example:
        >>> check_dir("/tmp/hvdrunner-doc-ckpt")
        '/tmp/hvdrunner-doc-ckpt'
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


class CheckpointDir:
    """The checkpoints of one job under ``checkpoint_dir`` (local, dbfs:/, /Volumes/)."""

    def __init__(self, checkpoint_dir: str, keep: int) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.root = _paths.resolve(checkpoint_dir).local_path
        self.keep = keep

    def candidates(self) -> list[tuple[int, str]]:
        """``(epochs_done, path)`` of every checkpoint folder, oldest first (unverified)."""
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
            if sha256(full) != meta["sha256"]:
                raise CheckpointError(f"{full} does not match the hash recorded when it was saved")
        return dict(state)

    def discard_partial(self) -> list[str]:
        """Remove the ``.tmp-…`` folders of saves that were killed mid-way; their paths.

        Each holds a partial copy of the model (gigabytes on a Volume) that no load ever
        reads. Called by :meth:`latest`, when a job (or a restarted attempt) starts, before
        it saves: the attempt that wrote them has ended, and one job owns its directory.
        """
        if not os.path.isdir(self.root):
            return []
        torn = [os.path.join(self.root, n) for n in os.listdir(self.root) if n.startswith(".tmp-")]
        for path in torn:
            shutil.rmtree(path, ignore_errors=True)
        if torn:
            _log.warning(f"removed {len(torn)} partial checkpoint folder(s) of a save that "
                         f"was interrupted: {', '.join(torn)}")  # fmt: skip
        return torn

    def latest(self) -> tuple[int, str] | None:
        """``(epochs_done, path)`` of the newest intact checkpoint, or ``None``.

        Corrupt newer ones are reported on stderr (with the one used instead) and skipped;
        partial folders of interrupted saves are removed (:meth:`discard_partial`).
        """
        self.discard_partial()
        skipped: list[str] = []
        for epoch, path in reversed(self.candidates()):
            try:
                self.verify(path)
            except CheckpointError as exc:
                skipped.append(f"{path} ({exc})")
                continue
            _warn_skipped(skipped, f"resuming from the newest intact one, {path}")
            return epoch, path
        _warn_skipped(
            skipped, f"no intact checkpoint left in {self.root}: training starts from scratch"
        )
        return None

    def save(
        self, write: Callable[[str], dict[str, Any]], epochs_done: int,
        metrics: dict[str, Any] | None = None,
    ) -> str:  # fmt: skip
        """``write(tmp_dir)`` writes the files and returns extra state; the final path.
        ``metrics``: the epoch metrics the checkpoint carries (:func:`carried_metrics`).

        Every regular file ``write`` leaves in ``tmp_dir`` is fsynced and recorded; the folder
        becomes visible (renamed) only after it verified from disk.
        """
        os.makedirs(self.root, exist_ok=True)
        tmp = os.path.join(self.root, f".tmp-{uuid.uuid4().hex}")
        final = os.path.join(self.root, f"epoch-{epochs_done:05d}")
        os.makedirs(tmp)
        try:
            extra = write(tmp)
            files = {}
            for name in sorted(os.listdir(tmp)):
                full = os.path.join(tmp, name)
                _fsync(full)
                files[name] = {"size": os.path.getsize(full), "sha256": sha256(full)}
            state = {**extra, "metrics": metrics or {}, "epochs_done": epochs_done,
                     "files": files}  # fmt: skip
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
        for _, old in self.candidates()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def mismatch(self, path: str, detail: str) -> CheckpointError:
        """The error for a checkpoint that does not fit this model (with the way out)."""
        return CheckpointError(
            f"the checkpoint {path} (checkpoint_dir={self.checkpoint_dir!r}) does not fit this "
            f"model/optimizer: {detail}. It was written by a different model; point "
            f"checkpoint_dir at a new directory (or delete {self.root}) to start over."
        )


def carried_metrics(path: str) -> dict[str, dict[str, float]]:
    """The epoch metrics a checkpoint carries (``{"<epoch>": {name: value}}``; see
    :mod:`hvdrunner.core.ledger`); empty for checkpoints written before they did."""
    with open(os.path.join(path, STATE)) as f:
        return dict(json.load(f).get("metrics") or {})


def resume(
    store: Any, model: Any, optimizer: Any, broadcast_object: Callable[..., Any],
    ledger: Any = None,
) -> int:  # fmt: skip
    """Rank 0 restores the newest intact checkpoint of ``store`` (an adapter's store with
    ``latest()`` and ``restore(path, model, optimizer)``, or ``None``) and hands the metrics
    it carries to ``ledger`` (a :class:`~hvdrunner.core.ledger.MetricLedger`); every rank
    returns the epoch to start at, from rank 0 (``broadcast_object``: the framework's
    collective)."""
    initial_epoch = 0
    if store is not None and is_rank0():
        latest = store.latest()
        if latest is not None:
            initial_epoch = store.restore(latest[1], model, optimizer)
            _log.info(f"resuming after epoch {initial_epoch} from {latest[1]}")
            if ledger is not None:
                ledger.restore(carried_metrics(latest[1]))
    return int(broadcast_object(initial_epoch, root_rank=0, name="hvdrunner.initial_epoch"))


def _warn_skipped(skipped: list[str], then: str) -> None:
    for s in skipped:
        _log.warning(f"skipping corrupt checkpoint {s}; {then}")
