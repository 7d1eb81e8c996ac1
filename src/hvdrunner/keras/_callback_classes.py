"""The Keras callback classes, subclassing this process's Keras ``callbacks.Callback``.

Importing this module imports Keras and its backend (the base class is Keras 2's or Keras
3's, ``tf.keras`` or ``keras`` on PyTorch), so :mod:`hvdrunner.keras.callbacks` imports it
on first access to a class name only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hvdrunner import tracking
from hvdrunner._logging import get_logger, log_to_driver
from hvdrunner.core.schedule import warmup_multiplier
from hvdrunner.distributed import is_rank0, size
from hvdrunner.keras import compat
from hvdrunner.keras.collectives import average_metrics, broadcast_model, check_in_sync
from hvdrunner.keras.optimizer import variable_key

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "LogCallback",
    "MLflowCallback",
    "MetricAverageCallback",
    "WeightSyncCheckCallback",
]

base: type = compat.keras_module().callbacks.Callback


def _format(logs: dict[str, Any] | None) -> str:
    return " - ".join(f"{k}: {float(v):.4f}" for k, v in (logs or {}).items() if np.ndim(v) == 0)


class BroadcastGlobalVariablesCallback(base):
    """Broadcast model and optimizer state from ``root_rank`` before training starts."""

    def __init__(self, root_rank: int = 0, device: str = "", local_variables: Any = None) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False
        self._local: set[int] = set()
        if local_variables is not None:
            many = isinstance(local_variables, list | tuple)
            for var in local_variables if many else [local_variables]:
                self.register_local_var(var)

    def register_local_var(self, var: Any) -> None:
        """Horovod's name: ``var`` keeps each rank's own value (it is not broadcast)."""
        self._local.add(variable_key(var))

    def _broadcast(self) -> None:
        if getattr(self.model, "jit_compile", False) is True:
            raise RuntimeError(
                "the model is compiled with jit_compile=True: XLA cannot run Horovod's "
                "allreduce. Compile with model.compile(..., jit_compile=False)."
            )
        broadcast_model(self.model, self.root_rank, exclude=self._local)
        self.broadcast_done = True

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self.broadcast_done and self.model.built and self.model.variables:
            self._broadcast()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.broadcast_done:  # a model built by its first batch
            self._broadcast()


class MetricAverageCallback(base):
    """Replace each epoch metric in ``logs`` by its average over all ranks."""

    def __init__(self, device: str = "") -> None:
        super().__init__()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs.update(average_metrics(logs))


class LearningRateScheduleCallback(base):
    """``lr = initial_lr * multiplier(epoch)`` for ``start_epoch <= epoch < end_epoch``.

    ``multiplier`` is a number or a function of the (fractional, when ``staircase`` is
    False) epoch. ``momentum_correction`` is accepted for Horovod's signature only.
    """

    def __init__(
        self,
        initial_lr: float,
        multiplier: float | Callable[[float], float],
        start_epoch: int = 0,
        end_epoch: int | None = None,
        staircase: bool = True,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
    ) -> None:
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda _e: multiplier)
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def _active(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch: float) -> None:
        compat.set_learning_rate(
            self.model.optimizer, self.initial_lr * float(self.multiplier(epoch))
        )

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
        if not self.staircase and not self.steps_per_epoch:
            raise ValueError(
                "a per-batch LR schedule needs steps_per_epoch; pass it to the callback "
                "or call fit with steps_per_epoch="
            )

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.current_epoch = epoch
        if self.staircase and self._active(epoch):
            self._set(epoch)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.staircase or not self._active(self.current_epoch):
            return
        self._set(self.current_epoch + batch / float(self.steps_per_epoch or 1))


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the LR from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``.

    ``initial_lr`` is the already scaled rate (e.g. ``base_lr * hvd.size()``).
    """

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ) -> None:
        ranks = size()

        def multiplier(epoch: float) -> float:
            return warmup_multiplier(epoch, ranks, warmup_epochs)

        super().__init__(
            initial_lr, multiplier, 0, warmup_epochs, False, momentum_correction,
            steps_per_epoch,
        )  # fmt: skip
        self.warmup_epochs, self.verbose = warmup_epochs, verbose

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if epoch == self.warmup_epochs - 1:  # end exactly at the target rate
            compat.set_learning_rate(self.model.optimizer, self.initial_lr)
            if self.verbose and is_rank0():
                get_logger().info(f"epoch {epoch + 1}: finished LR warmup to {self.initial_lr:g}")


class LogCallback(base):
    """Streams rank 0's progress to the driver via ``log_to_driver`` (sparkdl's name)."""

    def __init__(self, per_batch_log: bool = False) -> None:
        super().__init__()
        self.per_batch_log = per_batch_log
        self._epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.per_batch_log and is_rank0():
            log_to_driver(f"epoch {self._epoch + 1} batch {batch + 1}: {_format(logs)}")

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if is_rank0():
            log_to_driver(f"epoch {epoch + 1}: {_format(logs)}")


class MLflowCallback(base):
    """Epoch metrics averaged over ranks, logged by rank 0 with the epoch as step.

    Put it on every rank (the averaging is collective); only rank 0 writes. ``ledger`` (fit's
    :class:`~hvdrunner.core.ledger.MetricLedger`) defers each epoch until its checkpoint is
    saved, so a restart never logs a step twice; without one, each epoch is logged at once.
    """

    def __init__(self, ledger: Any = None) -> None:
        super().__init__()
        self.ledger = ledger

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        averaged = average_metrics(dict(logs or {}))
        if logs is not None:
            logs.update(averaged)  # later callbacks (and History) see the averages
        if self.ledger is not None:
            self.ledger.epoch_end(epoch, averaged)
        else:
            tracking.log_metrics(averaged, step=epoch)


class WeightSyncCheckCallback(base):
    """After the first epoch this run trains, fail unless all ranks hold equal weights."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = False

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.checked:
            self.checked = True
            check_in_sync(self.model)
