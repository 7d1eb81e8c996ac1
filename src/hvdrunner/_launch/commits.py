"""Horovod elastic commits that outlive the processes: ``@hvd.elastic.run`` code resumes
from its last ``state.commit()`` after a restart (``HorovodRunner(max_restarts=N)``).

Horovod's elastic driver keeps a job's processes and rolls them back in memory to the last
commit. Under hvdrunner a restart starts new processes, so the in-memory commit is gone. In
the rank (installed before user code by :func:`install`, a ``rank_setup`` hook; it loads no
framework and patches Horovod only once ``horovod.common.elastic`` is imported):

- ``State.commit()`` on rank 0 also sends what the commit saved to the driver (through the
  supervisor, over the job's authenticated channel). The copies Horovod's ``save()`` made are
  never changed afterwards, so a background thread pickles and sends them: the commit waits
  only for the small Python attributes (``epoch``, ``batch``). The driver keeps the newest.
- On a restarted attempt, the first call of an ``@hvd.elastic.run`` function loads that
  commit into rank 0's state and calls the state's reset callbacks, as Horovod does after a
  failure (restore, reset, then sync from rank 0 and run the function); Horovod's own
  ``state.sync()`` then hands rank 0's state to every rank.

What is sent is every ``_saved_*`` attribute of the state and of its handlers (horovod
0.28.1's TorchState, ObjectState, TensorFlowKerasState): model and optimizer state,
samplers, and the user's attributes. A commit counts as durable once the driver has it; a
rank killed in between resumes from the commit before.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import io
import os
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

#: Set by the driver in every rank of an attempt that resumes from a commit.
RESUME_ENV = "HVDRUNNER_ELASTIC_RESUME"
#: Set by the supervisor in rank 0 of such an attempt: the file holding the commit.
COMMIT_FILE_ENV = "HVDRUNNER_ELASTIC_COMMIT"
_TARGET = "horovod.common.elastic"

_send: Callable[[bytes], None] | None = None
_resumed = False  # this process already loaded its attempt's commit
_lock = threading.Lock()


def install(send: Callable[[bytes], None]) -> None:
    """Called in the rank before user code: patch Horovod's elastic layer once it is
    imported; ``send(blob)`` takes a pickled commit to the driver."""
    global _send
    _send = send
    if _TARGET in sys.modules:
        _patch(sys.modules[_TARGET])
    else:
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds ``horovod.common.elastic`` as usual, then patches it once it ran."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        run_module = loader.exec_module

        def exec_module(module: Any) -> None:
            run_module(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch(elastic: Any) -> None:
    """Durable ``State.commit`` and resuming ``run_fn`` in horovod.common.elastic."""
    if getattr(elastic, "_hvdrunner_commits", False):
        return
    state_class, run_fn = elastic.State, elastic.run_fn

    def commit(self: Any) -> None:
        # horovod 0.28.1's State.commit (save, then check for host updates), recording the
        # saved state in between.
        self.save()
        if self._rank() == 0:
            _record(self)
        self.check_host_updates()

    def durable_run_fn(func: Callable[..., Any], reset: Callable[[], None]) -> Any:
        wrapped = run_fn(func, reset)

        @functools.wraps(func)
        def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
            _resume(state)
            return wrapped(state, *args, **kwargs)

        return wrapper

    commit.__doc__ = state_class.commit.__doc__
    state_class.commit = commit
    elastic.run_fn = durable_run_fn
    elastic._hvdrunner_commits = True


# -- recording ---------------------------------------------------------------------------------
class _Sender:
    """One background thread that pickles and sends the newest commit (older pending ones
    are replaced: only the newest matters)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._pending: tuple[int, dict[str, Any]] | None = None
        self._number = 0
        self.sent = 0  # the number of the newest commit sent
        threading.Thread(target=self._loop, name="hvdrunner-commits", daemon=True).start()

    def put(self, snapshot: dict[str, Any]) -> int:
        with self._cv:
            self._number += 1
            self._pending = (self._number, snapshot)
            self._cv.notify()
            return self._number

    def flush(self, timeout: float) -> bool:
        """Wait until the newest commit reached the supervisor; False after ``timeout``."""
        with self._cv:
            return self._cv.wait_for(lambda: self.sent >= self._number, timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._pending is not None)
                assert self._pending is not None
                number, snapshot = self._pending
                self._pending = None
            blob = dumps(snapshot)
            if _send is not None:
                _send(blob)
            with self._cv:
                self.sent = max(self.sent, number)
                self._cv.notify_all()


_sender: _Sender | None = None


def _record(state: Any) -> int:
    """Queue what ``state.save()`` just saved for the driver; the commit's number."""
    global _sender
    with _lock:
        if _sender is None:
            _sender = _Sender()
    return _sender.put(snapshot(state))


def flush(timeout: float = 60.0) -> bool:
    """Wait (at most ``timeout`` s) until this rank's newest commit is on its way to the
    driver (benchmarks and tests; training never needs to wait)."""
    return _sender is None or _sender.flush(timeout)


def snapshot(state: Any) -> dict[str, Any]:
    """The state's ``_saved_*`` attributes and its handlers'; the user's attributes are
    pickled now (they may be live objects the function changes next), the model's and
    optimizer's saved copies later (``save()`` made them; nothing changes them)."""
    handlers = getattr(state, "_handlers", {}) or {}
    return {
        "state": _saved(state),
        "handlers": {name: _saved(handler) for name, handler in handlers.items()},
        "objects": pickle.dumps(getattr(state, "_saved_state", {}), pickle.HIGHEST_PROTOCOL),
    }


def _saved(obj: Any) -> dict[str, Any]:
    return {
        k: _plain(v)
        for k, v in vars(obj).items()
        if k.startswith("_saved_") and k != "_saved_state"
    }


def _plain(value: Any) -> Any:
    """TensorFlow tensors as numpy arrays (what ``assign``/``set_weights`` take back)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if type(value).__module__.startswith("tensorflow") and hasattr(value, "numpy"):
        return value.numpy()
    return value


def dumps(snapshot: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    pickle.dump(snapshot, buf, protocol=pickle.HIGHEST_PROTOCOL)
    return buf.getvalue()


# -- resuming ----------------------------------------------------------------------------------
def _resume(state: Any) -> None:
    """On an attempt that resumes: load the commit into rank 0's state (once per process)
    and run the state's reset callbacks on every rank, as Horovod does after a failure."""
    global _resumed
    if _resumed or os.environ.get(RESUME_ENV) != "1":
        return
    _resumed = True
    path = os.environ.get(COMMIT_FILE_ENV)
    if path:
        with open(path, "rb") as f:
            restore(state, pickle.load(f))
        from hvdrunner._logging import get_logger

        get_logger().info(
            f"resuming from the last state.commit() of the attempt before (epoch/batch: "
            f"{_progress(state)})"
        )
    state.on_reset()


def restore(state: Any, snap: dict[str, Any]) -> None:
    """Put a :func:`snapshot` back as the state's committed state, then into the live
    objects (``state.restore()``: Horovod's own roll-back)."""
    for name, saved in snap["handlers"].items():
        handler = state._handlers.get(name)
        if handler is not None:
            vars(handler).update(saved)
    vars(state).update(snap["state"])
    state._saved_state = pickle.loads(snap["objects"])
    state.restore()


def _progress(state: Any) -> str:
    saved = getattr(state, "_saved_state", {}) or {}
    return ", ".join(f"{k}={saved[k]!r}" for k in ("epoch", "batch") if k in saved) or "-"
