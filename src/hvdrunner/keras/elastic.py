"""Horovod's elastic Keras API (``horovod.tensorflow.keras.elastic``) on hvdrunner's engine:
``KerasState``, ``run`` and the callbacks that keep ``state.batch``/``state.epoch`` and commit.

Under ``HorovodRunner(max_restarts=N)`` a job that loses a rank starts again and resumes from
the last ``state.commit()`` (model, optimizer, ``epoch``/``batch``): call ``fit`` for the
epochs that remain (``epochs=epochs - state.epoch``). Keras 3 ignores a change of
``params["steps"]``, so there the first epoch after a resume runs in full: commit at epoch
ends (``CommitStateCallback(state, batches_per_commit=steps_per_epoch)``) to resume exactly.
List ``CommitStateCallback`` after the ``Update*StateCallback``: Keras runs callbacks in list
order, and a commit before them saves the batch or epoch before the one just done (then a
resume repeats it).

Example:
    >>> import hvdrunner.hvd_keras as hvd  # doctest: +SKIP
    >>> state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    >>> @hvd.elastic.run
    ... def train(state):
    ...     model.fit(x, y, epochs=3 - state.epoch, callbacks=[
    ...         hvd.elastic.UpdateEpochStateCallback(state),
    ...         hvd.elastic.CommitStateCallback(state)])
    >>> train(state)
"""

from __future__ import annotations

from typing import Any

from hvdrunner.engine.tf.elastic import ObjectState, State, TensorFlowKerasState, run
from hvdrunner.keras import compat

__all__ = [
    "CommitStateCallback",
    "KerasState",
    "ObjectState",
    "State",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "run",
]

_Callback: type = compat.keras_module().callbacks.Callback


class KerasState(TensorFlowKerasState):
    """A Keras model, its optimizer and plain attributes, kept as one state."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=compat.keras_module().backend,
                         **kwargs)  # fmt: skip


class CommitStateCallback(_Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at each epoch's end."""

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be >= 1, got {batches_per_commit!r}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same on every rank

    def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(_Callback):
    """``state.batch``: the batch just done, 0 at each epoch's end. On Keras 2 the first
    epoch after a resume is shortened by the batches already done."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: int | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params["steps"]
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(_Callback):
    """``state.epoch``: the epochs done over every attempt (Keras counts from 0 in each
    ``fit``, so the count carried in the state is added)."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1
