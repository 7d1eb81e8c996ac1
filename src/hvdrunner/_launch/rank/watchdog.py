"""Rank-side stall watchdog: where the rank's main thread has been stuck, and for how long.

Horovod's own stall inspector did not fire over gloo here (no warning after 80 s with
``HOROVOD_STALL_CHECK_TIME_SECONDS=60``), so hvdrunner watches for itself. Once a second a
daemon thread looks at the main thread's innermost Python frame. When it has not moved for
:data:`REPORT_AFTER_S`, the rank reports a ``state`` frame to its
supervisor (``Stuck``: for how long, whether inside a library, where), and ``Moving`` when
it moves on. A rank blocked inside a framework or Horovod call (``in_library``) is waiting
in a collective or running one very long step; the driver decides
with ``stall_timeout`` and names the ranks that were *not* waiting with it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from typing import Any

from hvdrunner._launch import protocol

_OWN = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # src/hvdrunner
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_SITE = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
#: A frame unchanged this long is reported (small: the driver applies stall_timeout).
REPORT_AFTER_S = 5.0
#: Where library code runs (a frame there is "inside the library"): folders named by the
#: caller (TaskSpec.library_dirs), set by :func:`start`.
_LIBRARY_PATHS: tuple[str, ...] = ()


def describe(frame: Any) -> str:
    """``file:line in function`` of a frame, for the error message."""
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def _stack(frame: Any, limit: int = 60) -> list[Any]:
    out: list[Any] = []
    while frame is not None and len(out) < limit:
        out.append(frame)
        frame = frame.f_back
    return out


def _is_library(frame: Any) -> bool:
    return any(p in frame.f_code.co_filename for p in _LIBRARY_PATHS)


def _is_stdlib(frame: Any) -> bool:
    name = frame.f_code.co_filename
    return name.startswith(_STDLIB) and not any(d in name for d in _SITE)


def in_library(frame: Any) -> bool:
    """The main thread waits inside library code (``library_dirs``: a framework's or
    Horovod's, a C call: an op, a step, a collective).

    The innermost frame may be generated code (``<string>``: TF's op wrappers) or the
    standard library's (``threading``: a library waiting on an event, as hvdrunner's engine
    does in ``hvd.allreduce``); the innermost frame that is neither decides.
    """
    real = next((f for f in _stack(frame)
                 if not f.f_code.co_filename.startswith("<") and not _is_stdlib(f)), None)  # fmt: skip
    return real is not None and _is_library(real)


def where(frame: Any) -> str:
    """The innermost frame of the user's own code (else the innermost frame), described."""
    for f in _stack(frame):
        name = f.f_code.co_filename
        if not _is_library(f) and not name.startswith(("<string>", _OWN)):
            return describe(f)
    return describe(frame)


def start(
    send: Callable[[object], None], library_dirs: tuple[str, ...] = (), period_s: float = 1.0
) -> threading.Thread:
    """Start watching the calling (main) thread; reports through ``send(message)``
    (:class:`~hvdrunner._launch.protocol.Stuck`, then ``Moving`` when it moves on). A frame
    in a folder named in ``library_dirs`` (e.g. ``horovod``) is inside a library."""
    global _LIBRARY_PATHS
    _LIBRARY_PATHS = tuple(f"{os.sep}{name}{os.sep}" for name in library_dirs)
    main_id = threading.get_ident()

    def watch() -> None:
        last: tuple[int, int] | None = None
        since = time.time()
        reported = False
        while True:
            time.sleep(period_s)
            frame = sys._current_frames().get(main_id)
            if frame is None:
                return
            key = (id(frame), frame.f_lasti)
            now = time.time()
            if key != last:
                if reported:
                    send(protocol.Moving())
                last, since, reported = key, now, False
            elif not reported and now - since >= REPORT_AFTER_S:
                # How long, not since when: the driver's clock may differ from this host's.
                send(protocol.Stuck(now - since, in_library(frame), where(frame)))
                reported = True
            del frame

    thread = threading.Thread(target=watch, name="hvdrunner-watchdog", daemon=True)
    thread.start()
    return thread
