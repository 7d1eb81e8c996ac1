"""Installed framework versions and the Keras mode, from package metadata only.

A leaf: no TensorFlow, PyTorch, Horovod or hvdrunner import, so the launcher, the rank entry
point, ``doctor`` and the benchmarks can decide before anything heavy loads.

- Keras 2: TensorFlow <= 2.15, or TensorFlow >= 2.16 with ``TF_USE_LEGACY_KERAS=1`` and
  ``tf_keras`` installed ("tf_keras mode"). Keras 3: TensorFlow >= 2.16 by default.

Example:
    >>> mode() in ("keras2", "tf_keras", "keras3", "none")
    True
"""

from __future__ import annotations

import importlib.metadata as md
import os

LEGACY_ENV = "TF_USE_LEGACY_KERAS"


def version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, or ``None``."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def major_minor(text: str) -> tuple[int, int]:
    """``(2, 16)`` from ``"2.16.1"`` (a suffix such as ``rc0`` ignored)."""
    parts = (text.split(".") + ["0", "0"])[:2]
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


def tensorflow() -> str | None:
    """TensorFlow's version (the ``tensorflow`` or ``tensorflow-cpu`` distribution)."""
    return version("tensorflow") or version("tensorflow-cpu")


def legacy_requested() -> bool:
    """``TF_USE_LEGACY_KERAS`` is set to a true value (TensorFlow's own reading of it)."""
    return os.environ.get(LEGACY_ENV, "").strip().lower() in ("1", "true", "yes")


def generation() -> int | None:
    """2 or 3: the Keras generation ``tf.keras`` resolves to; ``None`` without TensorFlow.

    Example:
        >>> generation() in (2, 3, None)
        True
    """
    tf = tensorflow()
    if tf is None:
        return None
    if major_minor(tf) < (2, 16):
        return 2
    if legacy_requested() and version("tf_keras") is not None:
        return 2
    return 3


def mode() -> str:
    """``"keras2"`` (TF <= 2.15), ``"tf_keras"`` (legacy mode on TF >= 2.16), ``"keras3"``,
    or ``"none"`` (no TensorFlow installed)."""
    tf = tensorflow()
    if tf is None:
        return "none"
    if generation() == 3:
        return "keras3"
    return "tf_keras" if major_minor(tf) >= (2, 16) else "keras2"
