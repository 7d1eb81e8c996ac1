"""Entry point of one rank's child process: ``python -m hvdrunner._launch.rank.worker PAYLOAD``.

The supervisor starts this in a fresh interpreter (isolated TF/CUDA state) with the Horovod
environment already set. It loads the cloudpickled ``(fn, kwargs)``, calls ``fn(**kwargs)``
and reports on the control pipe (fd ``HVDRUNNER_CONTROL_FD``): rank 0's return value, or the
exception's type, message and traceback.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib
import os
import signal
import sys

import cloudpickle

from hvdrunner import distributed
from hvdrunner._launch import commits, protocol
from hvdrunner._launch.protocol import PipeWriter, error_report
from hvdrunner._logging import get_logger

CONTROL_FD_ENV = "HVDRUNNER_CONTROL_FD"
#: "module:function,..." the rank calls before the user's function (TaskSpec.rank_setup).
RANK_SETUP_ENV = "HVDRUNNER_RANK_SETUP"
#: "module:function,..." the rank calls after the user's function returned (rank_teardown).
RANK_TEARDOWN_ENV = "HVDRUNNER_RANK_TEARDOWN"
#: Folder names whose frames count as library code for the watchdog (TaskSpec.library_dirs).
LIBRARY_DIRS_ENV = "HVDRUNNER_LIBRARY_DIRS"
_PR_SET_PDEATHSIG = 1


_log = get_logger()


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL us when the supervisor dies, so no rank outlives its task."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    # The parent may have died between fork and prctl.
    if os.getppid() == 1:
        os._exit(137)


def _control() -> PipeWriter:
    fd = int(os.environ[CONTROL_FD_ENV])
    return PipeWriter(os.fdopen(fd, "wb", buffering=0))


def _kill_descendants() -> None:
    """Processes this rank started (even in their own session) must not outlive the job:
    they would hold its output pipes open and keep running after it."""
    try:
        import psutil

        children = psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001 - best effort; the supervisor also kills the group
        return
    for child in children:
        try:
            child.kill()
        except Exception:  # noqa: BLE001,S112 - already gone
            continue


def _listed(env: str) -> tuple[str, ...]:
    """The comma-separated list the launcher put in ``env`` (see task._rank_env)."""
    return tuple(filter(None, os.environ.get(env, "").split(",")))


def _run_hooks(env: str) -> None:
    """Call each ``module:function`` listed in ``env``, in order."""
    for name in _listed(env):
        module, _, function = name.partition(":")
        getattr(importlib.import_module(module), function)()


def main(payload_path: str) -> int:
    _die_with_parent()
    control = _control()
    # log_to_driver() in user code finds the channel through this module-level hook.
    from hvdrunner import _logging

    _logging.install_channel(lambda rank, text: control.send(protocol.Log(rank, text)))
    # Horovod elastic commits reach the driver, for a restarted attempt to resume from.
    commits.install(
        lambda path: control.send(protocol.Commit(path)),
        os.path.dirname(os.path.abspath(payload_path)),
    )  # the supervisor's folder
    from hvdrunner._launch.rank import watchdog

    watchdog.start(control.send, _listed(LIBRARY_DIRS_ENV))
    rank = distributed.rank()
    try:
        _run_hooks(RANK_SETUP_ENV)  # the caller's hooks, before user code
        with open(payload_path, "rb") as f:
            fn, kwargs = cloudpickle.load(f)
        value = fn(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the driver
        sys.stdout.flush()
        sys.stderr.flush()
        _log.error(f"rank {rank}: the function raised", exc_info=True)
        control.send(protocol.RankError(error_report(exc)))
        return 1
    _run_hooks(RANK_TEARDOWN_ENV)  # e.g. leave Horovod's ring in order
    sys.stdout.flush()
    sys.stderr.flush()
    if distributed.is_rank0():
        # Only rank 0's value goes back; other ranks may return unpicklable things freely.
        try:
            blob = cloudpickle.dumps(value)
        except Exception as exc:  # noqa: BLE001
            message = (
                f"the return value of rank 0 ({type(value).__name__}) cannot be "
                f"pickled: {exc}. Return plain data (numbers, dicts, numpy arrays, paths)."
            )
            report = dataclasses.replace(error_report(exc, message), type="TypeError",
                                         module="builtins", stage="result")  # fmt: skip
            control.send(protocol.RankError(report))
            return 1
        control.send(protocol.Value(blob))
    control.send(protocol.Returned())
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1])
    _kill_descendants()
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit skips interpreter teardown, where TF 2.15 prints spurious AtomicFunction errors
    # and horovod's background thread can block shutdown.
    os._exit(code)
