"""Horovod's timeline: a Chrome trace (``chrome://tracing``, Perfetto) of what rank 0 ran.

One trace "process" per tensor name, as Horovod writes it: ``NEGOTIATE_<OP>`` from the
request to the moment every rank agreed, then ``<OP>`` while it ran; ``CYCLE_START`` marks
each negotiation round when asked for. Started by ``HOROVOD_TIMELINE=<file>`` at ``init()``
or by ``start_timeline(file)``; only rank 0 writes.

Example:
    >>> import tempfile, os, json
    >>> path = os.path.join(tempfile.mkdtemp(), "t.json")
    >>> start(path); negotiating("allreduce", "x"); stop()
    >>> [e["name"] for e in json.load(open(path))][-1]
    'NEGOTIATE_ALLREDUCE'
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any

_lock = threading.Lock()
_file: IO[str] | None = None
_pids: dict[str, int] = {}
_cycles = False
_first = True


def _now_us() -> int:
    return time.time_ns() // 1000


def _write(event: dict[str, Any]) -> None:
    global _first
    if _file is None:
        return
    _file.write(("" if _first else ",\n") + json.dumps(event))
    _first = False
    _file.flush()


def start(path: str, mark_cycles: bool = False) -> None:
    """Write the trace to ``path`` from now on (a previous trace is closed first)."""
    global _file, _cycles, _first
    stop()
    with _lock:
        _file = open(path, "w")  # noqa: SIM115 - kept open until stop()
        _file.write("[\n")
        _first, _cycles = True, mark_cycles
        _pids.clear()
        _write({"name": "process_name", "ph": "M", "pid": 0,
                "args": {"name": "hvdrunner", "start_time_since_epoch_in_micros": _now_us()}})  # fmt: skip


def stop() -> None:
    """Close the trace (a valid JSON array); nothing when none is open."""
    global _file
    with _lock:
        if _file is not None:
            _file.write("\n]\n")
            _file.close()
            _file = None


def active() -> bool:
    return _file is not None


def _pid(label: str) -> int:
    if label not in _pids:
        _pids[label] = len(_pids) + 1
        _write({"name": "process_name", "ph": "M", "pid": _pids[label], "args": {"name": label}})
    return _pids[label]


def negotiating(kind: str, name: str) -> None:
    """A request was made: its negotiation begins."""
    if _file is None:
        return
    with _lock:
        _write({"name": f"NEGOTIATE_{kind.upper()}", "ph": "B", "ts": _now_us(),
                "pid": _pid(f"{kind}.{name}")})  # fmt: skip


def cycle() -> None:
    if _file is None or not _cycles:
        return
    with _lock:
        _write({"name": "CYCLE_START", "ph": "i", "ts": _now_us(), "pid": 0, "s": "g"})


@contextlib.contextmanager
def activity(readies: Sequence[Any]) -> Iterator[None]:
    """Around the run of agreed requests: ends their negotiation, marks the operation."""
    if _file is None:
        yield
        return
    labels = [(r.entry.kind, f"{r.entry.kind}.{r.key[1]}") for r in readies]
    with _lock:
        for kind, label in labels:
            now = _now_us()
            _write({"name": f"NEGOTIATE_{kind.upper()}", "ph": "E", "ts": now, "pid": _pid(label)})
            _write({"name": kind.upper(), "ph": "B", "ts": now, "pid": _pid(label)})
    try:
        yield
    finally:
        with _lock:
            for kind, label in labels:
                _write({"name": kind.upper(), "ph": "E", "ts": _now_us(), "pid": _pid(label)})
