"""Keras callbacks for HorovodRunner jobs.

Imports TensorFlow on first use only, so ``import hvdrunner`` stays light on the driver.
"""

from __future__ import annotations

from typing import Any

from hvdrunner._logging import log_to_driver
from hvdrunner.distributed import is_rank0


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
