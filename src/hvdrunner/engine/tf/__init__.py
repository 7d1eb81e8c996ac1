"""Horovod's TensorFlow API (``horovod.tensorflow`` 0.28.1) on hvdrunner's engine: nothing
compiled. A TensorFlow tensor reaches the engine through DLPack (its memory shared, CPU or
GPU) and the engine's transport is ``torch.distributed`` (gloo for CPU tensors, NCCL for GPU
tensors), which every Databricks ML runtime with TensorFlow ships.

The drop-in for ``import horovod.tensorflow as hvd`` is :mod:`hvdrunner.hvd_tensorflow` (which
adds Keras' ``DistributedOptimizer``); ``hvdrunner.keras`` and ``hvdrunner.hvd_keras`` run on
this package when Keras trains on TensorFlow. Collectives run eagerly and inside
``tf.function`` (Keras' ``fit``), not under XLA (``jit_compile=True``).

Example:
    >>> import hvdrunner.engine.tf as hvd
    >>> hvd.init(); hvd.size()
    1
    >>> hvd.shutdown()
"""

from __future__ import annotations

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
from hvdrunner.engine.tf import util
from hvdrunner.engine.tf.collectives import (
    allreduce,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)  # fmt: skip
from hvdrunner.engine.tf.compression import Compression
from hvdrunner.engine.tf.functions import (
    allgather_object,
    broadcast_global_variables,
    broadcast_object,
    broadcast_object_fn,
    broadcast_variables,
)  # fmt: skip
from hvdrunner.engine.tf.ops import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    grouped_allgather,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)  # fmt: skip
from hvdrunner.engine.tf.tape import DistributedGradientTape, PartialDistributedGradientTape
from hvdrunner.engine.tf.util import _executing_eagerly
from hvdrunner.errors import HorovodInternalError, HostsUpdatedInterrupt


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks."""
    return size() % local_size() == 0 and cross_size() * local_size() == size()


__all__ = [
    "Adasum", "Average", "Compression", "DistributedGradientTape", "HorovodInternalError",
    "HostsUpdatedInterrupt", "Max", "Min", "PartialDistributedGradientTape", "ProcessSet",
    "Product", "Sum", "_executing_eagerly", "add_process_set", "allgather", "allgather_object",
    "allreduce", "alltoall", "barrier", "broadcast", "broadcast_", "broadcast_global_variables",
    "broadcast_object", "broadcast_object_fn", "broadcast_variables", "ccl_built", "cross_rank",
    "cross_size", "cuda_built", "ddl_built", "global_process_set", "gloo_built", "gloo_enabled",
    "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "init", "is_homogeneous",
    "is_initialized", "join", "local_rank", "local_rank_op", "local_size", "local_size_op",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "process_set_included_op",
    "rank", "rank_op", "reducescatter", "remove_process_set", "rocm_built", "shutdown", "size",
    "size_op", "start_timeline", "stop_timeline", "util",
]  # fmt: skip
