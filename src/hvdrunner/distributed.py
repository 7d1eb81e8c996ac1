"""Rank helpers for code running inside a Horovod job: who am I, and rank-0-only work.

Every rank-0 side effect in hvdrunner goes through :func:`is_rank0` / :func:`on_rank0` /
:func:`rank0_first`, so call sites never test ``hvd.rank() == 0`` themselves. Outside a
job (plain Python, a notebook cell) the process counts as rank 0 of a world of size 1.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from hvdrunner import _versions

F = TypeVar("F", bound=Callable[..., Any])


def _env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value:
            return int(value)
    return default


def rank() -> int:
    """This process's rank: ``HOROVOD_RANK`` (HorovodRunner, horovodrun), else torch's
    ``RANK`` (torchrun, TorchDistributor, serverless ``@distributed``); 0 outside a job.

    Example:
        >>> rank()  # outside a job
        0
    """
    return _env_int(("HOROVOD_RANK", "RANK"), 0)


def size() -> int:
    """The number of ranks in the job (``HOROVOD_SIZE``, else ``WORLD_SIZE``); 1 outside."""
    return _env_int(("HOROVOD_SIZE", "WORLD_SIZE"), 1)


def local_rank() -> int:
    """This process's rank among the ranks on its host (``HOROVOD_LOCAL_RANK``, else
    ``LOCAL_RANK``); 0 outside a job."""
    return _env_int(("HOROVOD_LOCAL_RANK", "LOCAL_RANK"), 0)


def local_size() -> int:
    """The number of ranks on this process's host (``HOROVOD_LOCAL_SIZE``, else
    ``LOCAL_WORLD_SIZE``); 1 outside a job.

    Example:
        >>> local_size()  # outside a job
        1
    """
    return _env_int(("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"), 1)


def cross_rank() -> int:
    """This process's host among the job's hosts (``HOROVOD_CROSS_RANK``, else torchrun's
    ``GROUP_RANK``); 0 outside a job.

    Example:
        >>> cross_rank()  # outside a job
        0
    """
    return _env_int(("HOROVOD_CROSS_RANK", "GROUP_RANK"), 0)


def cross_size() -> int:
    """The hosts that run a rank of this process's local rank (``HOROVOD_CROSS_SIZE``; under
    torchrun, every host runs as many: ``WORLD_SIZE // LOCAL_WORLD_SIZE``); 1 outside a job.

    Example:
        >>> cross_size()  # outside a job
        1
    """
    return _env_int(("HOROVOD_CROSS_SIZE",), max(1, size() // local_size()))


def in_horovod_rank() -> bool:
    """Whether this process is a rank that HorovodRunner (or ``horovodrun``) started.

    Example:
        >>> in_horovod_rank()  # outside a job
        False
    """
    return "HOROVOD_RANK" in os.environ


#: Set by the driver in every rank's environment: which attempt of the job this is (1-based).
ATTEMPT_ENV = "HVDRUNNER_ATTEMPT"


def attempt() -> int:
    """Which attempt of the job this rank belongs to: 1, then 2, 3... after each automatic
    restart (``HorovodRunner(max_restarts=N)``); 1 outside a job.

    Resume logic reads the newest checkpoint whatever the attempt; use this to say so in a
    log line, or to inject a fault only once in a test.

    Example:
        >>> attempt()  # outside a job
        1
    """
    return int(os.environ.get(ATTEMPT_ENV, "1"))


def is_rank0(live_rank: int | None = None) -> bool:
    """True on the rank that owns side effects (logging, checkpoints, MLflow): by
    ``live_rank`` where the caller holds one (an engine's or Horovod's own, which an elastic
    reset may renumber while the environment stays as the launcher set it), else by
    :func:`rank`.

    Example:
        >>> is_rank0()  # outside a job
        True
        >>> is_rank0(live_rank=1)
        False
    """
    return (rank() if live_rank is None else live_rank) == 0


def on_rank0(fn: F) -> F:
    """Decorator: run ``fn`` on rank 0 only; other ranks get ``None`` without calling it.

    Example:
        >>> @on_rank0
        ... def save(path): return path
        >>> save("model.h5")
        'model.h5'
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if is_rank0():
            return fn(*args, **kwargs)
        return None

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def rank0_first() -> Iterator[None]:
    """Rank 0 runs the block first (e.g. a download into a shared cache), then the others.

    Needs ``hvd.init()`` to have been called when the job has more than one rank, with any
    of Horovod's frameworks (``horovod.torch``, ``horovod.tensorflow``, ``hvdrunner.hvd_keras``).

    Example:
        >>> with rank0_first():
        ...     pass
    """
    if size() == 1:
        yield
        return
    hvd = _initialized_horovod()

    def barrier() -> None:
        # horovod.tensorflow has no barrier(); a broadcast blocks every rank until rank 0 joins.
        hvd.broadcast_object(None, root_rank=0, name="hvdrunner.rank0_first")

    if not is_rank0():
        barrier()
    try:
        yield
    finally:
        if is_rank0():
            barrier()


def shutdown() -> None:
    """Shut Horovod down in order, whichever framework initialised it (no-op if none did).

    Example:
        >>> shutdown()  # outside a job: nothing to do
    """
    for module in initialized_horovods():
        module.shutdown()


def initialized_horovods() -> list[Any]:
    """The Horovod framework modules this rank initialised; none is imported here, so a torch
    job needs no TensorFlow (and a Keras job no torch).

    Example:
        >>> initialized_horovods()  # outside a job
        []
    """
    modules = (sys.modules.get(name) for name in _versions.HOROVOD_FRAMEWORKS)
    return [m for m in modules if m is not None and m.is_initialized()]


def _initialized_horovod() -> Any:
    """The first Horovod framework module this rank initialised, or the error naming the fix."""
    found = initialized_horovods()
    if found:
        return found[0]
    raise RuntimeError(
        "rank0_first() in a job of several ranks needs Horovod initialised first: call "
        "hvd.init() (horovod.torch, horovod.tensorflow or hvdrunner.hvd_keras) before it"
    )


def host_gpus() -> list[str]:
    """GPUs visible on this host: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi``."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def cuda_visible_devices(
    task_gpus: Sequence[str], local_rank: int, local_size: int, gpus_on_host: Sequence[str]
) -> str | None:
    """The ``CUDA_VISIBLE_DEVICES`` for one rank, or ``None`` to leave it unchanged.

    - GPUs Spark assigned to the task win: the rank sees exactly those.
    - Otherwise, when ``gpus_on_host`` is given (local mode), they are spread over the
      host's local ranks: an equal contiguous block each, or round-robin when there are
      fewer GPUs than ranks.
    - With no GPUs at all nothing changes (CPU training).

    Example:
        >>> cuda_visible_devices([], 1, 2, ["0", "1", "2", "3"])
        '2,3'
    """
    if task_gpus:
        return ",".join(task_gpus)
    if not gpus_on_host:
        return None
    n = len(gpus_on_host)
    if n >= local_size:
        per = n // local_size
        return ",".join(gpus_on_host[local_rank * per : (local_rank + 1) * per])
    return gpus_on_host[local_rank % n]
