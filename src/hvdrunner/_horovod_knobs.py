"""The Horovod settings hvdrunner chooses, and which horovod builds they are for.

``HOROVOD_IDLE_WAIT_MS`` is read by ``patches/horovod-0.28.1-idle-wait.patch`` (hvdrunner's
builds with PyTorch). With it, horovod's background loop runs no negotiation round while
nothing is pending; a group's enqueue (``hvdrunner.torch.fit``'s buckets, Keras' one
grouped allreduce) starts a round at once, and a single tensor's (the per-tensor
``hvd.DistributedOptimizer`` of the unchanged recipe) one cycle later, so the gradients
that follow it join the same round. The patch's marker module says which version a build
carries: version 1 started every round at once, which made per-tensor requests slower
than stock horovod, so HorovodRunner sets the knob for every rank only with version 2.
Measured in docs/benchmarks.md, "The unchanged recipe and HorovodRunner's default".

Example:
    >>> rank_defaults({"HOROVOD_IDLE_WAIT_MS": "0"})
    {}
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, MutableMapping

IDLE_WAIT_ENV, IDLE_WAIT_MS = "HOROVOD_IDLE_WAIT_MS", "20"
#: The module the idle-wait patch adds to horovod; its ``VERSION`` says which rule it has.
IDLE_WAIT_MARKER = "horovod._hvdrunner_idle_wait"
#: The first version whose single-tensor rounds gather for a cycle (safe as a default).
IDLE_WAIT_DEFAULT_FROM = 2


def idle_wait_version() -> int:
    """The idle-wait patch version of the installed horovod: 0 without the patch (or
    without horovod), 1 for the first one (no ``VERSION`` in its marker)."""
    try:
        marker = importlib.import_module(IDLE_WAIT_MARKER)
    except ImportError:
        return 0
    return int(getattr(marker, "VERSION", 1))


def rank_defaults(env: Mapping[str, str]) -> dict[str, str]:
    """The knobs HorovodRunner adds to a rank's environment ``env``: those the user did not
    set (the executors' environment, ``spark.executorEnv.*``), where this host's horovod
    reads them as measured. A rank's own ``os.environ`` before ``hvd.init()`` still wins."""
    if IDLE_WAIT_ENV in env or idle_wait_version() < IDLE_WAIT_DEFAULT_FROM:
        return {}
    return {IDLE_WAIT_ENV: IDLE_WAIT_MS}


def for_grouped_requests(env: MutableMapping[str, str] | None = None) -> None:
    """Called by a ``fit`` whose gradients go out as grouped requests (``hvdrunner.torch.fit``'s
    buckets, Keras' one grouped allreduce on PyTorch): their round may start at once with
    every version of the patch, so the knob is set (in ``env``, default this process's
    environment) unless the user set it - also for a fit HorovodRunner did not launch.

    Example:
        >>> env = {}
        >>> for_grouped_requests(env)
        >>> env
        {'HOROVOD_IDLE_WAIT_MS': '20'}
    """
    (os.environ if env is None else env).setdefault(IDLE_WAIT_ENV, IDLE_WAIT_MS)
