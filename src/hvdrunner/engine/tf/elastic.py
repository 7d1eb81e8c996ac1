"""Horovod's elastic API for TensorFlow (``horovod.tensorflow.elastic``) on the engine: ``run``,
``State``, ``ObjectState``, ``TensorFlowState`` and ``TensorFlowKerasState``.

The states are the engine's (:mod:`hvdrunner.engine.elastic`): ``commit()`` saves, ``sync()``
hands rank 0's state to every rank, and under ``HorovodRunner(max_restarts=N)`` a job that
loses a rank restarts and resumes from the last commit (hvdrunner._launch.commits carries
every ``_saved_*`` attribute to the driver). A lost peer surfaces in TensorFlow as
``UnknownError``; ``run`` tells it from the program's own errors by the engine's record of
the loss, not by the message.

Example:
    >>> import tensorflow as tf
    >>> from hvdrunner.engine import state as engine
    >>> engine.init(); v = tf.Variable([1.0])
    >>> state = TensorFlowState([v], epoch=0)
    >>> @run
    ... def train(state):
    ...     state.epoch += 1
    ...     state.commit()
    ...     return state.epoch
    >>> train(state)
    1
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from hvdrunner._keras_optimizers import build_optimizer, optimizer_variables
from hvdrunner.engine import elastic as core
from hvdrunner.engine import state as engine
from hvdrunner.engine.elastic import ObjectState, State
from hvdrunner.engine.tf import bridge, functions
from hvdrunner.errors import HorovodInternalError

UNBUILT_MODEL = "Model must be built first. Run `model.build(input_shape)`."


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for ``train(state, ...)``: Horovod's ``@hvd.elastic.run`` for TensorFlow.

    Example:
        >>> @run  # doctest: +SKIP
        ... def train(state): ...
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.UnknownError as exc:
            if bridge.peer_lost() is None:
                raise  # the program's own error
            raise HorovodInternalError(str(exc)) from exc

    # Looked up now, not at import: HorovodRunner makes the engine's run_fn durable
    # (hvdrunner._launch.commits) when the engine's elastic module is imported.
    return core.run_fn(wrapper, _reset)


def _reset() -> None:
    bridge.forget_lost_peer()
    engine.shutdown()
    engine.init()


def _value(var: Any) -> Any:
    """A variable's current value, as a tensor of its own (``tf.Variable`` or Keras 3's)."""
    return tf.identity(tf.convert_to_tensor(var))


def _assign(variables: Sequence[Any], values: Sequence[Any], what: str) -> None:
    """Put saved values back; refuse a count that differs rather than restore a part."""
    variables = list(variables)
    if len(variables) != len(values):
        raise ValueError(
            f"cannot restore {what}: {len(values)} values were saved for {len(variables)} "
            f"variables now (a model or optimizer changed since the commit)"
        )
    for var, value in zip(variables, values, strict=True):
        var.assign(value)


class _VariablesState(ObjectState):
    """A state that keeps variables beside its attributes: each save, restore and sync does
    the variables first (``_save_model``, ``_load_model``, ``_broadcast``)."""

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load_model()
        super().restore()

    def sync(self) -> None:
        self._broadcast()
        self._save_model()
        super().sync()

    def _broadcast(self) -> None:
        raise NotImplementedError

    def _save_model(self) -> None:
        raise NotImplementedError

    def _load_model(self) -> None:
        raise NotImplementedError


class TensorFlowKerasState(_VariablesState):
    """A Keras model and its optimizer (Keras 2 or 3, on TensorFlow) and plain attributes,
    kept as one state (Horovod's ``TensorFlowKerasState``).

    Example:
        >>> state = TensorFlowKerasState(model, epoch=0, batch=0)  # doctest: +SKIP
    """

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        if hasattr(model, "build") and not model.built:
            raise ValueError(UNBUILT_MODEL)
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self.backend = backend
        # Keras creates an optimizer's slots at its first step: made now, every rank's state
        # has the same variables to sync, and a restarted process has the slots a commit
        # restores.
        build_optimizer(self.optimizer, model.trainable_variables)
        self._save_model()
        super().__init__(functions.broadcast_object, engine.rank, **kwargs)

    def _broadcast(self) -> None:
        functions.broadcast_variables(self.model.variables, root_rank=0)
        functions.broadcast_variables(optimizer_variables(self.optimizer), root_rank=0)

    def _save_model(self) -> None:
        self._saved_model_state = [_value(v) for v in self.model.variables]
        self._saved_optimizer_state = [_value(v) for v in optimizer_variables(self.optimizer)]

    def _load_model(self) -> None:
        _assign(self.model.variables, self._saved_model_state, "the model")
        _assign(optimizer_variables(self.optimizer), self._saved_optimizer_state,
                "the optimizer")  # fmt: skip


class TensorFlowState(_VariablesState):
    """A list of TensorFlow variables and plain attributes kept as one state (Horovod's
    ``TensorFlowState``; ``tf.compat.v1.global_variables()`` by default, a TF1 ``session``
    to evaluate them in graph mode).

    Example:
        >>> state = TensorFlowState([w, b], epoch=0)  # doctest: +SKIP
    """

    def __init__(self, variables: Sequence[Any] | None = None, session: Any = None,
                 **kwargs: Any) -> None:  # fmt: skip
        self.variables = list(variables or tf.compat.v1.global_variables())
        self.session = session or (None if tf.executing_eagerly() else
                                   tf.compat.v1.get_default_session())  # fmt: skip
        self._bcast_op = None
        if not tf.executing_eagerly():
            self._bcast_op = functions.broadcast_variables(self.variables, root_rank=0)
        self._save_model()
        super().__init__(functions.broadcast_object, engine.rank, **kwargs)

    def _broadcast(self) -> None:
        if self._bcast_op is not None and self.session is not None:
            self.session.run(self._bcast_op)
        else:
            functions.broadcast_variables(self.variables, root_rank=0)

    def _save_model(self) -> None:
        # ``_saved_*``: what a commit carries to a restarted job
        if self.session is None:
            self._saved_values = [v.numpy() for v in self.variables]
        else:
            self._saved_values = self.session.run(self.variables)

    def _load_model(self) -> None:
        if self.session is None:
            _assign(self.variables, self._saved_values, "the variables")
        else:
            for var, value in zip(self.variables, self._saved_values, strict=True):
                var.load(value, self.session)


__all__ = ["ObjectState", "State", "TensorFlowKerasState", "TensorFlowState", "run"]
