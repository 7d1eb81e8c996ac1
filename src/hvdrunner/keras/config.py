"""The settings of :func:`hvdrunner.keras.fit`: one frozen :class:`FitConfig`, one validator.

``fit``'s keyword arguments *are* FitConfig's fields (its signature is generated from them),
so a setting is declared, defaulted, documented and checked in one place. The
framework-neutral fields and their checks live in :mod:`hvdrunner.core.settings` (shared
with ``hvdrunner.torch``); this module adds the Keras ones. Under ``HorovodRunner`` it runs
once, on the driver before launch (``fit``'s preflight); the ranks use that config as it is.

Example:
    >>> cfg = make_config(None, {"epochs": 2, "batch_size": 32, "loss": "mse"})
    >>> cfg.learning_rate
    0.001
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hvdrunner.core import settings as core_settings
from hvdrunner.core.settings import FitResult, TrainingSettings

#: The optimizer names fit understands -> their class in ``keras.optimizers`` (one table:
#: checked here, resolved by fit).
OPTIMIZERS = {"adam": "Adam", "sgd": "SGD", "rmsprop": "RMSprop", "adagrad": "Adagrad"}
#: fit's arguments that are inputs, not settings.
INPUTS = ("build_model", "data", "validation", "features", "label")

__all__ = ["INPUTS", "OPTIMIZERS", "FitConfig", "FitResult", "make_config"]


@dataclass(frozen=True, kw_only=True)
class FitConfig(TrainingSettings):
    """Validated settings of :func:`fit` (checked once, before any rank starts): the fields of
    :class:`~hvdrunner.core.settings.TrainingSettings` and these.

    Attributes:
        loss: a Keras loss, by name or object (required).
        optimizer: ``"adam"``, ``"sgd"``, ``"rmsprop"``, ``"adagrad"`` or a function
            ``lr -> optimizer``. Default ``"adam"``.
        metrics: Keras metrics, averaged over ranks each epoch. Default ``()``.
        verbose: Keras' progress on rank 0 (0, 1, 2). Default ``2``.
        callbacks: more Keras callbacks (they see metrics averaged over ranks). Default ``()``.
    """

    loss: Any
    optimizer: str | Callable[[float], Any] = "adam"
    metrics: tuple[Any, ...] = ()
    verbose: int = 2
    callbacks: tuple[Any, ...] = field(default=())

    def __post_init__(self) -> None:
        super().__post_init__()
        core_settings.check_verbose(self.verbose)
        core_settings.check_named(
            "optimizer", self.optimizer, tuple(OPTIMIZERS),
            "a function lr -> Keras optimizer: lambda lr: keras.optimizers.SGD(lr, momentum=0.9)",
        )  # fmt: skip


def make_config(config: FitConfig | None, settings: Mapping[str, Any]) -> FitConfig:
    """``config`` (or the defaults) with ``settings`` applied, validated; the one entry.

    Raises:
        TypeError: an unknown setting, or a required one (epochs, batch_size, loss) missing.
        ValueError: a setting out of range (from :class:`FitConfig`).
    """
    return core_settings.make_config(
        FitConfig, config, settings, "hvdrunner.keras.fit", tuples=("metrics", "callbacks")
    )
