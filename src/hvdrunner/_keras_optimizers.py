"""A Keras optimizer's variables and slots, duck-typed across Keras 2 and 3: a leaf that
imports no framework, so hvdrunner.keras (:mod:`hvdrunner.keras.compat` re-exports it) and
the engine's TensorFlow states (:mod:`hvdrunner.engine.tf.elastic`) share one rule.

Example:
    >>> class Opt:
    ...     variables = ["iterations"]
    >>> optimizer_variables(Opt())
    ['iterations']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def optimizer_variables(optimizer: Any) -> list[Any]:
    """The optimizer's variables (a property on Keras 3 and Keras 2.11+, a method on legacy)."""
    variables = optimizer.variables
    return list(variables() if callable(variables) else variables)


def build_optimizer(optimizer: Any, trainable_variables: Sequence[Any]) -> None:
    """Create the optimizer's slot variables now, so they can be restored and broadcast."""
    if getattr(optimizer, "built", False) or getattr(optimizer, "_built", False):
        return
    if hasattr(optimizer, "build"):
        optimizer.build(list(trainable_variables))
    elif hasattr(optimizer, "_create_all_weights"):  # legacy Keras 2 optimizers
        optimizer._create_all_weights(list(trainable_variables))
