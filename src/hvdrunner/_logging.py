"""hvdrunner's output: ``log_to_driver`` (a rank's message to the driver's output) and
``get_logger`` (the one ``hvdrunner`` logger for status lines and warnings)."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable

from hvdrunner._console import say
from hvdrunner.distributed import rank

#: sparkdl's limit: longer messages are truncated.
MAX_MESSAGE_CHARS = 4000

_channel: Callable[[int, str], None] | None = None
_lock = threading.Lock()


def install_channel(send: Callable[[int, str], None]) -> None:
    """Called by the worker entry point; ``send(rank, text)`` reaches the driver."""
    global _channel
    with _lock:
        _channel = send


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
        send = _channel
    if send is None:
        say(text)
        return
    try:
        send(rank(), text)
    except OSError:
        # The supervisor is gone (job aborted); the message would go nowhere anyway.
        say(text, err=True)


# -- hvdrunner's own voice on the driver -----------------------------------------------------
class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """Writes to whatever ``sys.stderr`` is at the time (notebooks and pytest swap it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # not setStream: it flushes the old (maybe closed) stream
        super().emit(record)


class _Format(logging.Formatter):
    """``[hvdrunner] message``, ``[hvdrunner] WARNING: message``, ``[hvdrunner.data] ...``."""

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname}: "
        return f"[{record.name}] {level}{record.getMessage()}"


def get_logger(name: str = "hvdrunner") -> logging.Logger:
    """hvdrunner's logger (or a child, e.g. ``hvdrunner.data``): status lines and warnings.

    INFO and above go to stderr as ``[hvdrunner] …`` unless the user configured the
    ``hvdrunner`` logger first; raise or lower it as any logger.

    Example:
        >>> import logging
        >>> logging.getLogger("hvdrunner").setLevel(logging.WARNING)  # warnings only
    """
    root = logging.getLogger("hvdrunner")
    if not root.handlers:
        handler = _StderrHandler()
        handler.setFormatter(_Format())
        root.addHandler(handler)
        root.propagate = False  # one line per message, whatever the root logger does
        if root.level == logging.NOTSET:
            root.setLevel(logging.INFO)
    return logging.getLogger(name)
