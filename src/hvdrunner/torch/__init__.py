"""PyTorch on HorovodRunner: the Horovod integration in a few lines, or in one call.

Unchanged ``horovod.torch`` code runs under :class:`hvdrunner.HorovodRunner` as it is
(hvdrunner builds horovod for torch >= 2.1). This package makes the integration short:

- :func:`init` (``hvd.init()``, this rank's device, seeds, CPU threads),
  :func:`distributed_optimizer` (in :func:`buckets`), :func:`broadcast_state`, :func:`average_metrics`,
  :func:`check_in_sync` - each one Horovod step;
- :func:`batches`: prepared data (:func:`hvdrunner.data.prepare`) as tensors with equal
  steps on every rank; :class:`CheckpointStore`: verified rank-0 checkpoints;
- :func:`fit`: all of it for a plain supervised model.

Example:
    >>> from hvdrunner import HorovodRunner
    >>> import hvdrunner.torch as ht                                  # doctest: +SKIP
    >>> HorovodRunner(np=2).run(ht.fit, build_model=build, data=data, epochs=5,
    ...                         batch_size=64, loss="cross_entropy", metrics=["accuracy"])
"""

from hvdrunner.torch.checkpoint import CheckpointStore
from hvdrunner.torch.collectives import (
    average_metrics,
    broadcast_state,
    buckets,
    check_in_sync,
    distributed_optimizer,
    init,
)
from hvdrunner.torch.config import FitConfig, FitResult
from hvdrunner.torch.fit import fit
from hvdrunner.torch.inputs import batches
from hvdrunner.torch.models import log_model

__all__ = [
    "CheckpointStore",
    "FitConfig",
    "FitResult",
    "average_metrics",
    "batches",
    "broadcast_state",
    "buckets",
    "check_in_sync",
    "distributed_optimizer",
    "fit",
    "init",
    "log_model",
]
