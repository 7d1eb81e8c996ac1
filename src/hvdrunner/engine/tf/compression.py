"""Horovod's ``Compression`` for TensorFlow tensors: ``none``, or ``fp16`` (floating-point
tensors travel as float16, half the bytes, and come back in their own type).

Example:
    >>> import tensorflow as tf
    >>> sent, ctx = Compression.fp16.compress(tf.constant([1.5]))
    >>> sent.dtype.name, Compression.fp16.decompress(sent, ctx).dtype.name
    ('float16', 'float32')
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class NoneCompressor:
    """Tensors travel as they are."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class FP16Compressor:
    """Floating-point tensors travel as float16; others as they are."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            return tf.cast(tensor, tf.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tf.cast(tensor, ctx) if ctx is not None and tensor.dtype != ctx else tensor


class Compression:
    """``Compression.none`` and ``Compression.fp16``, as in ``horovod.tensorflow``."""

    none = NoneCompressor
    fp16 = FP16Compressor
