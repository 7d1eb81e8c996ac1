"""The settings of :func:`hvdrunner.torch.fit`: one frozen :class:`FitConfig`, one validator.

The framework-neutral fields (epochs, batch size, learning-rate rules, checkpoints, the
gradient-exchange knobs) and their checks are :class:`hvdrunner.core.settings.TrainingSettings`,
shared with ``hvdrunner.keras``; this module adds the PyTorch ones. Nothing here imports torch,
so the driver validates a job without it.

Example:
    >>> cfg = make_config(None, {"epochs": 2, "batch_size": 32, "loss": "cross_entropy"})
    >>> cfg.optimizer, cfg.learning_rate
    ('adam', 0.001)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hvdrunner._checks import is_int, is_number
from hvdrunner.core import settings as core_settings
from hvdrunner.core.settings import FitResult, TrainingSettings
from hvdrunner.torch.options import LOSSES, METRICS, OPTIMIZERS  # the names fit understands

#: DDP's default bucket_cap_mb: fit's gradients go out in groups of at most this many MB.
BUCKET_CAP_MB = 25.0
#: fit's arguments that are inputs, not settings.
INPUTS = ("build_model", "data", "validation")

__all__ = [
    "BUCKET_CAP_MB",
    "INPUTS",
    "LOSSES",
    "METRICS",
    "OPTIMIZERS",
    "FitConfig",
    "FitResult",
    "make_config",
]


@dataclass(frozen=True, kw_only=True)
class FitConfig(TrainingSettings):
    """Validated settings of :func:`hvdrunner.torch.fit` (checked once, before any rank
    starts): the fields of :class:`~hvdrunner.core.settings.TrainingSettings` and these.

    Attributes:
        loss: ``"cross_entropy"``, ``"mse"``, ... or a function ``(output, target) -> loss``
            (required).
        optimizer: ``"adam"``, ``"sgd"``, ... or a function ``(params, lr) -> optimizer``.
            Default ``"adam"``.
        metrics: names or functions ``(output, target) -> tensor``, averaged over ranks.
            Default ``()``.
        verbose: 1: one line per epoch from rank 0; 0: silent. Default ``1``.
        num_threads: torch CPU threads per rank (``None``: cores / ranks per host).
            Default ``None``.
        bucket_cap_mb: gradients go out in groups of at most this many MB, as DDP's
            buckets; 0: one request per tensor, as Horovod's ``groups=None`` (models whose
            ranks leave different parameters without gradients). Default ``25``.
    """

    loss: str | Callable[[Any, Any], Any]
    optimizer: str | Callable[[Any, float], Any] = "adam"
    metrics: tuple[str | Callable[[Any, Any], Any], ...] = ()
    verbose: int = 1  # 1: one line per epoch from rank 0; 0: silent
    num_threads: int | None = None  # torch CPU threads per rank; None: cores / ranks per host
    # Gradients go out in groups of at most this many MB (DDP's bucket_cap_mb); 0: one
    # request per tensor, as horovod's DistributedOptimizer does - for models whose ranks
    # leave different parameters without gradients (a group waits for all of its own).
    bucket_cap_mb: float = BUCKET_CAP_MB

    def __post_init__(self) -> None:
        super().__post_init__()
        core_settings.check_named(
            "loss", self.loss, tuple(LOSSES), "loss=torch.nn.CrossEntropyLoss()"
        )
        core_settings.check_named("optimizer", self.optimizer, tuple(OPTIMIZERS),
               "optimizer=lambda params, lr: torch.optim.SGD(params, lr, momentum=0.9)")  # fmt: skip
        for m in self.metrics:
            core_settings.check_named(
                "metrics item", m, tuple(METRICS), "metrics=[my_metric] (output, target) -> tensor"
            )
        core_settings.check_verbose(self.verbose)
        if not is_number(self.bucket_cap_mb, at_least=0):
            raise ValueError(
                f"bucket_cap_mb must be a number >= 0 (0: one allreduce request per gradient "
                f"tensor), got {self.bucket_cap_mb!r}"
            )
        if self.num_threads is not None and not is_int(self.num_threads, at_least=1):
            raise ValueError(
                f"num_threads must be None (cores / ranks on the host) or an int >= 1, got "
                f"{self.num_threads!r}"
            )


def make_config(config: FitConfig | None, settings: Mapping[str, Any]) -> FitConfig:
    """``config`` (or the defaults) with ``settings`` applied, validated; the one entry.

    Raises:
        TypeError: an unknown setting, or a required one (epochs, batch_size, loss) missing.
        ValueError: a setting out of range (from :class:`FitConfig`).
    """
    return core_settings.make_config(
        FitConfig, config, settings, "hvdrunner.torch.fit", tuples=("metrics",)
    )
