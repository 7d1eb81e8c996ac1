"""Keras for HorovodRunner jobs: :func:`fit` (the whole integration) and callbacks.

Imports TensorFlow on first use only, so ``import hvdrunner`` stays light on the driver.
"""

from __future__ import annotations

from typing import Any

from hvdrunner._keras_fit import FitConfig, FitResult, fit
from hvdrunner._logging import log_to_driver
from hvdrunner.distributed import is_rank0

__all__ = ["FitConfig", "FitResult", "LogCallback", "MLflowCallback", "average_metrics", "fit"]


def _keras_callback_base() -> type:
    import tensorflow as tf

    return tf.keras.callbacks.Callback


def _format(logs: dict[str, Any] | None) -> str:
    return " - ".join(f"{k}: {float(v):.4f}" for k, v in (logs or {}).items())


def LogCallback(per_batch_log: bool = False) -> Any:  # noqa: N802 - sparkdl's class name
    """A Keras callback that streams rank 0's progress to the driver via ``log_to_driver``.

    The sparkdl callback of the same name: with ``driver_log_verbosity="log_callback_only"``
    it is how training progress reaches the notebook.

    Args:
        per_batch_log: also send a line per batch (chatty; off by default).

    Example:
        >>> model.fit(ds, epochs=3, callbacks=[LogCallback()])  # doctest: +SKIP
    """
    base = _keras_callback_base()

    class _LogCallback(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.per_batch_log = per_batch_log
            self._epoch = 0

        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._epoch = epoch

        def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if self.per_batch_log and is_rank0():
                log_to_driver(f"epoch {self._epoch + 1} batch {batch + 1}: {_format(logs)}")

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            if is_rank0():
                log_to_driver(f"epoch {epoch + 1}: {_format(logs)}")

    _LogCallback.__name__ = _LogCallback.__qualname__ = "LogCallback"
    return _LogCallback()


def average_metrics(logs: dict[str, Any]) -> dict[str, float]:
    """Average scalar Keras logs over all ranks (a collective: every rank must call it).

    Idempotent after Horovod's ``MetricAverageCallback`` (averaging equal values changes
    nothing), so callback order does not matter.
    """
    import horovod.tensorflow as hvd
    import tensorflow as tf

    out = {}
    for key in sorted(logs):  # same order on every rank: the allreduces pair up by name
        value = tf.constant(float(logs[key]), dtype=tf.float64)
        out[key] = float(hvd.allreduce(value, op=hvd.Average, name=f"hvdrunner.avg.{key}").numpy())
    return out


def MLflowCallback() -> Any:  # noqa: N802 - reads like a class at the call site
    """Keras callback: epoch metrics averaged over ranks, logged by rank 0 with the epoch as step.

    Put it on every rank (the averaging is collective); only rank 0 writes, into the run the
    driver had open (see :mod:`hvdrunner.tracking`).

    Example:
        >>> model.fit(ds, epochs=5, callbacks=[MLflowCallback()])  # doctest: +SKIP
    """
    from hvdrunner import tracking

    base = _keras_callback_base()

    class _MLflowCallback(base):  # type: ignore[misc, valid-type]
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            averaged = average_metrics(dict(logs or {}))
            if logs is not None:
                logs.update(averaged)  # later callbacks (and History) see the averages
            tracking.log_metrics(averaged, step=epoch)

    _MLflowCallback.__name__ = _MLflowCallback.__qualname__ = "MLflowCallback"
    return _MLflowCallback()
