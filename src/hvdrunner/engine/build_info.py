"""Horovod's ``*_built`` / ``*_enabled`` queries, answered for this engine truthfully: it runs
gloo (every torch carries it) and NCCL where torch was built with it; no MPI, DDL, oneCCL.

Example:
    >>> gloo_built(), mpi_built(), ddl_built()
    (True, False, False)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hvdrunner import distributed
from hvdrunner.engine import state, timeline, world


def gloo_built() -> bool:
    return bool(dist.is_gloo_available())


def gloo_enabled() -> bool:
    return state.is_initialized() and gloo_built()


def nccl_built() -> int:
    """NCCL's version number where torch has NCCL (as Horovod reports it), else 0."""
    if (
        not (world.cuda_available() or torch.backends.cuda.is_built())
        or not dist.is_nccl_available()
    ):
        return 0
    try:
        major, minor, patch = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError, TypeError):
        return 1
    return major * 1000 + minor * 100 + patch if major < 3 else major * 10000 + minor * 100 + patch


def cuda_built() -> bool:
    return bool(torch.backends.cuda.is_built())


def rocm_built() -> bool:
    return getattr(torch.version, "hip", None) is not None


def mpi_built() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_threads_supported() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record rank 0's collectives into ``file_path`` as a Chrome trace (engine.timeline)."""
    state.current()
    if distributed.is_rank0(live_rank=state.rank()):
        timeline.start(file_path, mark_cycles)


def stop_timeline() -> None:
    state.current()
    timeline.stop()
