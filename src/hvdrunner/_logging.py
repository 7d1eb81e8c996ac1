"""``log_to_driver``: send a message from a rank to the driver's output (private plumbing)."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

#: sparkdl's limit: longer messages are truncated.
MAX_MESSAGE_CHARS = 4000

_channel: Any = None
_lock = threading.Lock()


def install_channel(channel: Any) -> None:
    """Called by the worker entry point; ``channel.send(kind, payload)`` reaches the driver."""
    global _channel
    with _lock:
        _channel = channel


def log_to_driver(message: str) -> None:
    """Send ``message`` from this rank to the driver, where it is printed as ``[rank] message``.

    Works with either ``driver_log_verbosity``; with ``"log_callback_only"`` it is the only
    output the driver shows. Outside a HorovodRunner job it prints to stdout. Messages over
    4,000 characters are truncated, as in sparkdl.

    Example:
        >>> from hvdrunner import log_to_driver
        >>> log_to_driver("epoch 1 done")  # doctest: +SKIP
    """
    text = str(message)
    if len(text) > MAX_MESSAGE_CHARS:  # as sparkdl: one message never floods the notebook
        text = (
            f"{text[:MAX_MESSAGE_CHARS]}... [truncated {len(text) - MAX_MESSAGE_CHARS} characters]"
        )
    with _lock:
        channel = _channel
    if channel is None:
        print(text, flush=True)
        return
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    try:
        channel.send("log", (rank, text))
    except OSError:
        # The supervisor is gone (job aborted); the message would go nowhere anyway.
        print(text, file=sys.stderr, flush=True)
