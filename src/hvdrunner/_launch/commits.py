"""Horovod elastic commits that outlive the processes: ``@hvd.elastic.run`` code resumes
from its last ``state.commit()`` after a restart (``HorovodRunner(max_restarts=N)``).

Horovod's elastic driver keeps a job's processes and rolls them back in memory to the last
commit. Under hvdrunner a restart starts new processes, so the in-memory commit is gone. In
the rank (installed before user code by :func:`install`, a ``rank_setup`` hook; it loads no
framework and patches an elastic layer only once it is imported: ``horovod.common.elastic``,
or ``hvdrunner.engine.elastic`` for ``hvdrunner.hvd_torch``, which keeps the same names):

- ``State.commit()`` on rank 0 also writes what the commit saved to a file in the
  supervisor's folder on local disk (arrays as they are in memory, out of band: no copy in
  Python, the GIL released while the kernel copies them) and hands the path over before it
  returns; the supervisor, another process, sends the bytes on to the driver over the job's
  authenticated channel, so a rank killed right after its commit still resumes from it.
  The driver keeps the newest.
- On a restarted attempt, the first call of an ``@hvd.elastic.run`` function loads that
  commit into rank 0's state and calls the state's reset callbacks, as Horovod does after a
  failure (restore, reset, then sync from rank 0 and run the function); Horovod's own
  ``state.sync()`` then hands rank 0's state to every rank.

What is sent is every ``_saved_*`` attribute of the state and of its handlers (horovod
0.28.1's TorchState, ObjectState, TensorFlowKerasState): model and optimizer state,
samplers, and the user's attributes. Lost only with the whole host in the moment between
the hand-over and the supervisor's send: then the restart resumes from the commit before.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import pickle
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hvdrunner import distributed

#: Set by the driver in every rank of an attempt that resumes from a commit.
RESUME_ENV = "HVDRUNNER_ELASTIC_RESUME"
#: Set by the supervisor in rank 0 of such an attempt: the file holding the commit.
COMMIT_FILE_ENV = "HVDRUNNER_ELASTIC_COMMIT"
#: The elastic layers patched: Horovod's, and hvdrunner's engine's (same State and run_fn).
_TARGETS = ("horovod.common.elastic", "hvdrunner.engine.elastic")

_send: Callable[[str], None] | None = None
_folder = ""
_resumed = False  # this process already loaded its attempt's commit
_lock = threading.Lock()


def install(send: Callable[[str], None], folder: str) -> None:
    """Called in the rank before user code: patch Horovod's elastic layer once it is
    imported. A commit is written to a file in ``folder`` (the supervisor's, on local
    disk) and ``send(path)`` hands it over; the supervisor, another process, reads it and
    sends it on to the driver."""
    global _send, _folder
    _send, _folder = send, folder
    for target in _TARGETS:
        if target in sys.modules:
            _patch(sys.modules[target])
    if not all(target in sys.modules for target in _TARGETS):
        sys.meta_path.insert(0, _AfterImport())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds an elastic layer (``_TARGETS``) as usual, then patches it once it ran."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _TARGETS:
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
        if distributed.is_rank0(live_rank=self._rank()):  # Horovod's, after a reset too
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
_number = 0  # commits recorded by this process


def _record(state: Any) -> str:
    """Write what ``state.save()`` just saved to a file in the supervisor's folder and hand
    its path over; the path. Done before ``commit()`` returns, so a rank killed after its
    commit resumes from it (the supervisor, another process, sends the file on)."""
    global _number
    with _lock:
        _number += 1
        path = os.path.join(_folder, f"commit-{_number}.bin")
        write(snapshot(state), path)
        if _send is not None:
            _send(path)
    return path


def snapshot(state: Any) -> dict[str, Any]:
    """The state's ``_saved_*`` attributes and its handlers' (the copies ``save()`` made),
    and the user's attributes pickled (they may be live objects the function changes next)."""
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


@dataclass(frozen=True)
class _Tensor:
    """A torch tensor as it travels: its values as a numpy array (pickled at memory speed,
    a quarter of the time a tensor's own pickling holds the GIL from the training thread)
    and the device it goes back to."""

    array: Any
    device: str


def _to_wire(value: Any) -> Any:
    if isinstance(value, dict):
        return type(value)((k, _to_wire(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_to_wire(v) for v in value)
    if type(value).__module__ == "torch" and type(value).__name__ in ("Tensor", "Parameter"):
        try:
            return _Tensor(value.detach().cpu().numpy(), str(value.device))
        except (TypeError, RuntimeError):  # bfloat16 and friends: numpy has no such dtype
            return value
    return value


def _from_wire(value: Any) -> Any:
    if isinstance(value, _Tensor):
        # A _Tensor was made of a torch tensor, so torch is loaded in this rank (the state
        # being restored holds torch objects): this module imports no framework itself.
        torch = sys.modules["torch"]
        return torch.from_numpy(value.array).to(value.device)
    if isinstance(value, dict):
        return type(value)((k, _from_wire(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_from_wire(v) for v in value)
    return value


_U64 = struct.Struct(">Q")


def write(snapshot: dict[str, Any], path: str) -> None:
    """``snapshot`` into ``path``: the pickled structure, then each array's bytes as they
    are in memory (pickle protocol 5's out-of-band buffers). The arrays are never copied in
    Python and the GIL is released while the kernel copies them, so the training thread
    keeps running. Written to ``path.tmp``, then renamed."""
    buffers: list[pickle.PickleBuffer] = []
    skeleton = pickle.dumps(_to_wire(snapshot), protocol=5, buffer_callback=buffers.append)
    with open(path + ".tmp", "wb") as f:
        f.write(_U64.pack(len(skeleton)))
        f.write(skeleton)
        f.write(_U64.pack(len(buffers)))
        for buf in buffers:
            raw = buf.raw()
            f.write(_U64.pack(raw.nbytes))
            f.write(raw)
    os.replace(path + ".tmp", path)


def loads(blob: bytes) -> dict[str, Any]:
    """What :func:`write` wrote, from its bytes."""
    view = memoryview(blob)
    (size,) = _U64.unpack_from(view, 0)
    skeleton, pos = view[8 : 8 + size], 8 + size
    (count,) = _U64.unpack_from(view, pos)
    pos += 8
    buffers = []
    for _ in range(count):
        (n,) = _U64.unpack_from(view, pos)
        buffers.append(view[pos + 8 : pos + 8 + n])
        pos += 8 + n
    return dict(_from_wire(pickle.loads(skeleton, buffers=buffers)))


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
            restore(state, loads(f.read()))
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
