"""hvdrunner's Horovod engine: Horovod's PyTorch API (``horovod.torch`` 0.28.1) on
``torch.distributed`` - gloo for CPU tensors, NCCL for CUDA tensors - with nothing compiled.

The names Horovod users know live in :mod:`hvdrunner.hvd_torch` (the drop-in, for
``import hvdrunner.hvd_torch as hvd``); ``hvdrunner.torch`` and Keras on PyTorch use this
package directly. How it works: ``engine.negotiator`` (named requests agreed in rounds, as
Horovod's coordinator does), ``engine.execute`` (the agreed collectives, fused),
``engine.world`` (how ranks meet: Horovod's or torch's environment).

Example:
    >>> import hvdrunner.engine as hvd
    >>> hvd.init(); hvd.size()
    1
    >>> hvd.shutdown()
"""

from __future__ import annotations

from hvdrunner.engine import elastic
from hvdrunner.engine.build_info import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rocm_built,
    start_timeline,
    stop_timeline,
)  # fmt: skip
from hvdrunner.engine.collectives import (
    allgather,
    allreduce,
    allreduce_,
    alltoall,
    broadcast,
    broadcast_,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    reducescatter,
)  # fmt: skip
from hvdrunner.engine.compression import Compression
from hvdrunner.engine.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)  # fmt: skip
from hvdrunner.engine.ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather_async,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    barrier,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)  # fmt: skip
from hvdrunner.engine.optimizer import DistributedOptimizer
from hvdrunner.engine.process_sets import ProcessSet, global_process_set
from hvdrunner.engine.state import (
    add_process_set,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    rank,
    remove_process_set,
    shutdown,
    size,
)  # fmt: skip
from hvdrunner.engine.sync_batch_norm import SyncBatchNorm
from hvdrunner.errors import HorovodInternalError, HostsUpdatedInterrupt

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "HorovodInternalError",
    "HostsUpdatedInterrupt", "Max", "Min", "ProcessSet", "Product", "Sum", "SyncBatchNorm",
    "add_process_set", "allgather", "allgather_async", "allgather_object", "allreduce",
    "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async",
    "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "ccl_built",
    "cross_rank", "cross_size", "cuda_built", "ddl_built", "elastic", "global_process_set",
    "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "grouped_reducescatter", "grouped_reducescatter_async", "init",
    "is_initialized", "join", "local_rank", "local_size", "mpi_built", "mpi_enabled",
    "mpi_threads_supported", "nccl_built", "poll", "rank", "reducescatter",
    "reducescatter_async", "remove_process_set", "rocm_built", "shutdown", "size",
    "sparse_allreduce_async", "start_timeline", "stop_timeline", "synchronize",
]  # fmt: skip
