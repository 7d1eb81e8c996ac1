"""The Horovod steps of a PyTorch rank, each one call: init and device, broadcast, averaging.

Over Horovod's PyTorch API: hvdrunner's engine on ``torch.distributed`` (nothing compiled),
or a compiled ``horovod.torch`` with ``HVDRUNNER_TORCH_ENGINE=horovod``. The sync verdict and the learning-rate math
are framework-neutral (:mod:`hvdrunner.core`).

Example (inside a training function run by HorovodRunner):
    >>> device = init(seed=0)                                       # doctest: +SKIP
    >>> model = build().to(device)
    >>> opt = distributed_optimizer(torch.optim.SGD(model.parameters(), lr), model)
    >>> broadcast_state(model, opt)
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from hvdrunner import _versions
from hvdrunner.core import metrics as core_metrics
from hvdrunner.core import settings
from hvdrunner.core.sync import check_fingerprints, weight_fingerprint
from hvdrunner.engine import grouping
from hvdrunner.torch.config import BUCKET_CAP_MB

SYNC_FIX = (
    "Wrap the optimizer with hvd.DistributedOptimizer(opt, "
    "named_parameters=model.named_parameters()) (or hvdrunner.torch.distributed_optimizer) "
    "and broadcast the initial state (hvdrunner.torch.broadcast_state)."
)


def _hvd() -> Any:
    """Horovod's PyTorch API: hvdrunner's engine, or the compiled ``horovod.torch`` when
    ``HVDRUNNER_TORCH_ENGINE=horovod`` (:func:`hvdrunner._versions.torch_engine`)."""
    return engine_module()


def engine_module() -> Any:
    name = _versions.torch_engine()
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(
            f"{_versions.ENGINE_ENV} asks for {name}, which does not import here ({exc}). "
            f"Unset it to use hvdrunner's engine (nothing to install), or install a horovod "
            f"built for this torch."
        ) from exc


def init(seed: int = 0, num_threads: int | None = None) -> torch.device:
    """``hvd.init()``; this rank's device (its own GPU, or the CPU); seeds; CPU threads.

    On CPU hosts the cores are shared out between the host's ranks (``num_threads=None``),
    so two ranks do not fight over every core.
    """
    hvd = _hvd()
    hvd.init()
    torch.manual_seed(seed)
    np.random.seed(seed)
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    torch.set_num_threads(settings.cpu_threads(hvd.local_size(), num_threads))
    return torch.device("cpu")


def buckets(model: torch.nn.Module, cap_mb: float = BUCKET_CAP_MB) -> list[list[torch.Tensor]]:
    """The trainable parameters in gradient-exchange groups of at most ``cap_mb`` each (a
    larger tensor alone), in reverse definition order: roughly the order backward finishes
    their gradients, one dtype and device per group, as DDP's buckets (the engine's one
    bucket rule, :func:`hvdrunner.engine.grouping.buckets`).

    Each group goes out as one grouped allreduce once all its gradients exist, instead of one
    request per tensor that Horovod's background cycle may split over several rounds.

    Example:
        >>> [len(b) for b in buckets(torch.nn.Linear(4, 2))]
        [2]
    """
    trainable: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    return [list(b) for b in grouping.buckets(trainable, cap_mb * 2**20)]


def distributed_optimizer(
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    *,
    compression: str = "none",
    backward_passes_per_step: int = 1,
    bucket_cap_mb: float = BUCKET_CAP_MB,
) -> Any:
    """``optimizer`` averaging gradients over ranks (``horovod.torch.DistributedOptimizer``),
    in :func:`buckets` of up to ``bucket_cap_mb`` (0: one request per tensor).

    ``compression="fp16"`` sends gradients as float16; ``backward_passes_per_step=N``
    exchanges once per N ``backward()`` calls (call ``step()`` after every N-th).
    """
    hvd = _hvd()
    codec = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16}[compression]
    return hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=codec,
        backward_passes_per_step=backward_passes_per_step, op=hvd.Average,
        groups=buckets(model, bucket_cap_mb) if bucket_cap_mb > 0 else None,
    )  # fmt: skip


def broadcast_state(model: torch.nn.Module, optimizer: Any = None, root_rank: int = 0) -> None:
    """Every rank takes ``root_rank``'s parameters, buffers and optimizer state."""
    hvd = _hvd()
    hvd.broadcast_parameters(model.state_dict(), root_rank=root_rank)
    if optimizer is not None:
        hvd.broadcast_optimizer_state(optimizer, root_rank=root_rank)


def average_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Average scalar metrics over all ranks in one allreduce (a collective: every rank calls).

    Keys are reduced in sorted order, identical on every rank
    (:func:`hvdrunner.core.metrics.average`).
    """
    hvd = _hvd()

    def allreduce(values: np.ndarray) -> np.ndarray:
        out = hvd.allreduce(
            torch.from_numpy(values), op=hvd.Average, name="hvdrunner.metric_average"
        )
        return np.asarray(out.numpy())

    return core_metrics.average(metrics, hvd.size(), allreduce)


def check_in_sync(model: torch.nn.Module, rtol: float = 1e-6) -> None:
    """Raise :class:`~hvdrunner.errors.RanksOutOfSyncError` unless every rank holds rank 0's
    parameters (one small allgather of per-tensor fingerprints)."""
    hvd = _hvd()
    if hvd.size() == 1:
        return
    # Parameters only: buffers such as BatchNorm's running statistics follow each rank's
    # own data by design (Horovod does not average them; rank 0's are the ones saved).
    tensors = [p.detach().to("cpu", torch.float64).numpy() for p in model.parameters()]
    everyone = hvd.allgather_object(weight_fingerprint(tensors), name="hvdrunner.weight_sync")
    check_fingerprints(everyone, SYNC_FIX, rtol)


__all__ = [
    "average_metrics", "broadcast_state", "buckets", "check_in_sync", "distributed_optimizer",
    "init",
]  # fmt: skip
