"""Variables and Python objects across ranks, for TensorFlow: ``broadcast_variables``,
``broadcast_global_variables`` (graph mode), ``broadcast_object``, ``allgather_object``.

Objects travel as cloudpickle bytes through the engine, as in Horovod; they are exchanged
eagerly (``broadcast_object_fn`` gives the same in a callable form).

Example:
    >>> import tensorflow as tf
    >>> ops.init(); v = tf.Variable([1.0]); broadcast_variables([v], root_rank=0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from hvdrunner.engine import functions as engine_functions
from hvdrunner.engine.process_sets import ProcessSet, global_process_set
from hvdrunner.engine.tf import ops

GLOBAL_VARIABLES_EAGER = (
    "hvd.broadcast_global_variables() does not support eager execution. Please use "
    "`hvd.broadcast_variables(<model/optimizer variables>)` instead."
)


def broadcast_variables(variables: Sequence[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set,
                        inplace: bool = False) -> Any:  # fmt: skip
    """Overwrite ``variables`` on every rank with ``root_rank``'s values (one request per
    variable, all in flight together). Eagerly done on return; in a graph, the op to run.

    Example:
        >>> broadcast_variables(model.variables, root_rank=0)  # doctest: +SKIP
    """
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    assigned = ops.broadcast_(variables, root_rank, process_set=process_set)
    return None if tf.executing_eagerly() else tf.group(*assigned)


def broadcast_global_variables(root_rank: int) -> Any:
    """Graph mode (TF1 style): every global variable from ``root_rank``."""
    if tf.executing_eagerly():
        raise RuntimeError(GLOBAL_VARIABLES_EAGER)
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:  # fmt: skip
    """``root_rank``'s ``obj`` (anything cloudpickle serialises) on every rank.

    Example:
        >>> broadcast_object({"epoch": 3}, root_rank=0)  # doctest: +SKIP
        {'epoch': 3}
    """
    return engine_functions.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:  # fmt: skip
    """A callable that broadcasts its argument from ``root_rank`` (Horovod's form for
    graph-mode sessions; the exchange itself runs eagerly)."""
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:  # fmt: skip
    """Every rank's ``obj``, in rank order of the set."""
    return engine_functions.allgather_object(obj, name=name, process_set=process_set)
