"""Horovod's PyTorch API (``horovod.torch`` 0.28.1) with nothing to compile: change one line.

    import horovod.torch as hvd        # before: needs a horovod built for your torch
    import hvdrunner.hvd_torch as hvd  # after: torch.distributed (gloo on CPUs, NCCL on GPUs)

Every name of ``horovod.torch`` is here, with Horovod's arguments and behaviour
(docs/pytorch.md); the implementation is :mod:`hvdrunner.engine`. It runs under
HorovodRunner, ``horovodrun``-style environments (``HOROVOD_RANK``...) and torch's standard
one (``torchrun``, TorchDistributor, Databricks' serverless ``@distributed``).

``hvd.elastic`` holds Horovod's elastic names (``from hvdrunner.hvd_torch.elastic import
ElasticSampler`` works too, as ``horovod.torch.elastic``'s).

Example:
    >>> import hvdrunner.hvd_torch as hvd
    >>> hvd.init(); hvd.rank(), hvd.size()
    (0, 1)
    >>> hvd.shutdown()
"""

from __future__ import annotations

from hvdrunner.engine import *  # noqa: F403 - the drop-in is exactly the engine's names
from hvdrunner.engine import __all__ as __all__
