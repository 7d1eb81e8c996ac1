"""Keras callbacks for Horovod jobs, on Keras 2 and Keras 3 alike.

The classes subclass whichever ``tf.keras.callbacks.Callback`` this process has, so they are
built on first access (``hvdrunner.keras.callbacks.MetricAverageCallback``) and TensorFlow is
imported only then. Each is a real class: subclass it, or check ``isinstance`` against it.

- ``BroadcastGlobalVariablesCallback(root_rank)``: model + optimizer state from ``root_rank``
  to every rank before the first step (or after the first batch for models built lazily).
- ``MetricAverageCallback()``: epoch metrics averaged over ranks (one collective per epoch).
- ``LearningRateWarmupCallback(initial_lr, warmup_epochs)``: ``initial_lr / size`` →
  ``initial_lr`` linearly over the first epochs (Goyal et al.), per batch.
- ``LearningRateScheduleCallback(initial_lr, multiplier, start_epoch, end_epoch)``.
- ``LogCallback()``: rank 0's epoch lines to the driver (sparkdl's callback of that name).
- ``MLflowCallback()``: averaged epoch metrics into the job's MLflow run, by rank 0.
- ``WeightSyncCheckCallback()``: after the first epoch, every rank's weights must equal rank
  0's, or the job fails loudly (the guard against silent data-parallel divergence).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hvdrunner import tracking
from hvdrunner._logging import log_to_driver
from hvdrunner.core.schedule import warmup_multiplier
from hvdrunner.core.sync import check_fingerprints, weight_fingerprint
from hvdrunner.distributed import is_rank0
from hvdrunner.errors import RanksOutOfSyncError
from hvdrunner.keras import compat

NAMES = (
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateWarmupCallback",
    "LearningRateScheduleCallback",
    "LogCallback",
    "MLflowCallback",
    "WeightSyncCheckCallback",
)


SYNC_FIX = (
    "Use hvdrunner.keras.fit, or wrap the optimizer with hvdrunner.hvd_keras.DistributedOptimizer "
    "(never horovod.tensorflow.keras under Keras 3), and broadcast initial state with "
    "BroadcastGlobalVariablesCallback(0)."
)
__all__ = [*NAMES, "RanksOutOfSyncError", "average_metrics", "broadcast_model",
           "broadcast_variables", "check_in_sync", "weight_fingerprint"]  # fmt: skip


# -- collectives used by the callbacks (and by fit) ------------------------------------------
def broadcast_variables(variables: Sequence[Any], root_rank: int = 0) -> None:
    """Overwrite ``variables`` on every rank with ``root_rank``'s values (Keras 2 or 3)."""
    import horovod.tensorflow as hvd

    tf_vars = [compat.tf_variable(v) for v in variables]
    if tf_vars and hvd.size() > 1:
        hvd.broadcast_variables(tf_vars, root_rank=root_rank)


def broadcast_model(model: Any, root_rank: int = 0) -> None:
    """Broadcast the model's weights and its optimizer's state (built first if needed)."""
    optimizer = getattr(model, "optimizer", None)
    variables = list(model.variables)
    if optimizer is not None:
        compat.build_optimizer(optimizer, model.trainable_variables)
        variables += compat.optimizer_variables(optimizer)
    broadcast_variables(variables, root_rank)


def average_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """Average scalar Keras logs over all ranks (a collective: every rank must call it).

    One allreduce for all keys, in sorted order (identical on every rank). Idempotent:
    averaging equal values changes nothing, so several averaging callbacks are harmless.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
    if not keys or hvd.size() == 1:
        return {k: float(logs[k]) for k in keys}
    values = tf.constant([float(logs[k]) for k in keys], dtype=tf.float64)
    averaged = hvd.allreduce(values, op=hvd.Average, name="hvdrunner.metric_average").numpy()
    return dict(zip(keys, (float(v) for v in averaged), strict=True))


def check_in_sync(model: Any, rtol: float = 1e-6) -> None:
    """Raise :class:`RanksOutOfSyncError` unless every rank holds rank 0's weights."""
    import horovod.tensorflow as hvd

    if hvd.size() == 1:
        return
    mine = weight_fingerprint(model.get_weights())
    everyone = hvd.allgather_object(mine, name="hvdrunner.weight_sync_check")
    check_fingerprints(everyone, SYNC_FIX, rtol)


def _format(logs: dict[str, Any] | None) -> str:
    return " - ".join(f"{k}: {float(v):.4f}" for k, v in (logs or {}).items() if np.ndim(v) == 0)


# -- the classes, built against this process's Keras ----------------------------------------
@functools.cache
def _classes() -> dict[str, type]:
    base: type = compat.tf_keras().callbacks.Callback

    class BroadcastGlobalVariablesCallback(base):
        """Broadcast model and optimizer state from ``root_rank`` before training starts."""

        def __init__(self, root_rank: int = 0, device: str = "") -> None:
            super().__init__()
            self.root_rank = root_rank
            self.broadcast_done = False

        def _broadcast(self) -> None:
            if getattr(self.model, "jit_compile", False) is True:
                raise RuntimeError(
                    "the model is compiled with jit_compile=True: XLA cannot run Horovod's "
                    "allreduce. Compile with model.compile(..., jit_compile=False)."
                )
            broadcast_model(self.model, self.root_rank)
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
            import horovod.tensorflow as hvd

            size = hvd.size()

            def multiplier(epoch: float) -> float:
                return warmup_multiplier(epoch, size, warmup_epochs)

            super().__init__(
                initial_lr, multiplier, 0, warmup_epochs, False, momentum_correction,
                steps_per_epoch,
            )  # fmt: skip
            self.warmup_epochs, self.verbose = warmup_epochs, verbose

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if epoch == self.warmup_epochs - 1:  # end exactly at the target rate
                compat.set_learning_rate(self.model.optimizer, self.initial_lr)
                if self.verbose and is_rank0():
                    print(f"\nEpoch {epoch + 1}: finished LR warmup to {self.initial_lr:g}.")

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

        Put it on every rank (the averaging is collective); only rank 0 writes.
        """

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            averaged = average_metrics(dict(logs or {}))
            if logs is not None:
                logs.update(averaged)  # later callbacks (and History) see the averages
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

    return {
        cls.__name__: cls
        for cls in (
            BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateWarmupCallback,
            LearningRateScheduleCallback, LogCallback, MLflowCallback, WeightSyncCheckCallback,
        )
    }  # fmt: skip


def __getattr__(name: str) -> Any:
    if name in NAMES:
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
