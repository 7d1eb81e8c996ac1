"""``horovod.tensorflow.util``'s helper that Horovod's users and tests call."""

from __future__ import annotations

import tensorflow as tf


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs eagerly here (not while tracing a ``tf.function``)."""
    return bool(tf.executing_eagerly())
