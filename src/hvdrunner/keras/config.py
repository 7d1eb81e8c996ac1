"""The settings of :func:`hvdrunner.keras.fit`: one frozen :class:`FitConfig`, one validator.

``fit``'s keyword arguments *are* FitConfig's fields (its signature is generated from them),
so a setting is declared, defaulted, documented and checked in one place. The same
validator runs on the driver before launch (``HorovodRunner.run``'s preflight) and first
thing in every rank.

Example:
    >>> cfg = make_config(None, {"epochs": 2, "batch_size": 32, "loss": "mse"})
    >>> cfg.learning_rate
    0.001
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hvdrunner.keras.optimizer import check_passes

_OPTIMIZERS = ("adam", "sgd", "rmsprop", "adagrad")
#: fit's arguments that are inputs, not settings.
INPUTS = ("build_model", "data", "validation", "features", "label")
REQUIRED = ("epochs", "batch_size", "loss")


@dataclass(frozen=True)
class FitConfig:
    """Validated settings of :func:`fit` (checked first thing on every rank)."""

    epochs: int
    batch_size: int
    loss: Any
    optimizer: str | Callable[[float], Any] = "adam"
    learning_rate: float = 1e-3
    metrics: tuple[Any, ...] = ()
    warmup_epochs: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    keep_checkpoints: int = 3
    shuffle: bool = True
    seed: int = 0
    log_model: bool = True
    registered_model_name: str | None = None
    verbose: int = 2
    callbacks: tuple[Any, ...] = field(default=())
    compression: str = "none"
    backward_passes_per_step: int = 1
    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    in_memory: bool | None = None

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "checkpoint_every", "keep_checkpoints"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if (
            isinstance(self.warmup_epochs, bool)
            or not isinstance(self.warmup_epochs, int)
            or self.warmup_epochs < 0
        ):
            raise ValueError(
                f"warmup_epochs must be an int >= 0 (0 = no warmup), got {self.warmup_epochs!r}"
            )
        if not isinstance(self.learning_rate, (int, float)) or not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        if self.compression not in ("none", "fp16"):
            raise ValueError(
                f"compression must be 'none' or 'fp16' (gradients sent as float16), got "
                f"{self.compression!r}"
            )
        check_passes(self.backward_passes_per_step)
        for name in ("fusion_threshold_mb", "cycle_time_ms"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
            ):
                raise ValueError(
                    f"{name} must be a number >= 0 or None (Horovod's default), got {value!r}"
                )
        if self.in_memory not in (None, True, False):
            raise ValueError(
                f"in_memory must be None (auto), True or False, got {self.in_memory!r}"
            )
        if isinstance(self.optimizer, str) and self.optimizer.lower() not in _OPTIMIZERS:
            raise ValueError(
                f"optimizer={self.optimizer!r} is not one of {_OPTIMIZERS}; pass one of those or "
                f"a function lr -> Keras optimizer, e.g. lambda lr: keras.optimizers.SGD(lr, momentum=0.9)"
            )


@dataclass(frozen=True)
class FitResult:
    """What rank 0 returns: small and picklable."""

    history: dict[str, list[float]]  # averaged over ranks, one value per epoch run
    model_uri: str | None  # runs:/… when the driver had an MLflow run
    initial_epoch: int  # > 0 when resumed from a checkpoint
    epochs: int
    steps_per_epoch: int
    num_ranks: int


def make_config(config: FitConfig | None, settings: Mapping[str, Any]) -> FitConfig:
    """``config`` (or the defaults) with ``settings`` applied, validated; the one entry.

    Raises:
        TypeError: an unknown setting, or a required one (epochs, batch_size, loss) missing.
        ValueError: a setting out of range (from :class:`FitConfig`).
    """
    fields = {f.name for f in dataclasses.fields(FitConfig)}
    unknown = sorted(set(settings) - fields)
    if unknown:
        raise TypeError(
            f"fit() got unexpected argument(s) {unknown}; see help(hvdrunner.keras.fit)"
        )
    values = dict(settings)
    for name in ("metrics", "callbacks"):
        if name in values:
            values[name] = tuple(values[name])
    if config is not None:
        return dataclasses.replace(config, **values)
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        raise TypeError(f"fit() missing required argument(s): {', '.join(missing)}")
    return FitConfig(**values)
