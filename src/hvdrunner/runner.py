"""``HorovodRunner``: run a training function on Horovod ranks over Spark barrier tasks."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from hvdrunner import tracking
from hvdrunner.errors import HorovodRunnerError

_VERBOSITIES = ("all", "log_callback_only")


def _status(msg: str) -> None:
    print(f"[hvdrunner] {msg}", file=sys.stderr, flush=True)


def _local_pythonpath() -> tuple[str, ...]:
    """The driver's own source folders (not the interpreter's), for ranks on this machine."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for p in sys.path:
        real = os.path.realpath(p or os.getcwd())
        if os.path.isdir(real) and not any(real.startswith(x) for x in prefixes):
            out.append(real)
    return tuple(dict.fromkeys(out))


class HorovodRunner:
    """Runs a function as a Horovod job: ``np`` ranks, gloo controller, rank 0's result back.

    A drop-in for Databricks' ``sparkdl.HorovodRunner``.

    Args:
        np: ``> 0``: that many Spark barrier tasks, one rank each (needs an active
            SparkSession with enough task slots). ``< 0``: ``-np`` processes on the driver,
            no Spark needed. ``0`` is refused.
        driver_log_verbosity: ``"all"`` streams every rank's stdout/stderr live to the
            driver, prefixed ``[rank]<stream>:``; ``"log_callback_only"`` (sparkdl's
            default) shows only what ranks send with :func:`hvdrunner.log_to_driver`.
        start_timeout: seconds to wait for all ranks to start (free task slots) before
            failing.

    Example:
        >>> def train(lr):
        ...     import horovod.tensorflow.keras as hvd
        ...     hvd.init()
        ...     return hvd.size() * lr
        >>> HorovodRunner(np=-2).run(train, lr=0.5)  # doctest: +SKIP
        1.0
    """

    def __init__(
        self,
        *,
        np: int,
        driver_log_verbosity: str = "log_callback_only",
        start_timeout: float = 600.0,
    ) -> None:
        if isinstance(np, bool) or not isinstance(np, int):
            raise ValueError(
                f"np must be an int, got {np!r} ({type(np).__name__}). Pass np=N for N Spark "
                f"tasks (one Horovod rank each) or np=-N for N processes on the driver."
            )
        if np == 0:
            raise ValueError(
                "np=0 runs nothing. Pass np=N (N>0) for N Spark barrier tasks, or np=-N to run "
                "N processes on the driver (local mode, no Spark executors)."
            )
        if driver_log_verbosity not in _VERBOSITIES:
            raise ValueError(
                f"driver_log_verbosity must be one of {_VERBOSITIES}, got {driver_log_verbosity!r}."
            )
        if (
            isinstance(start_timeout, bool)
            or not isinstance(start_timeout, (int, float))
            or start_timeout <= 0
        ):
            raise ValueError(
                f"start_timeout must be a positive number of seconds, got {start_timeout!r}."
            )
        self.num_processor = np  # sparkdl's attribute name
        self.driver_log_verbosity = driver_log_verbosity
        self.start_timeout = float(start_timeout)

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank; return rank 0's return value.

        Raises:
            ValueError: ``main`` or an argument cannot be pickled, or the cluster has fewer
                task slots than ``np``.
            RuntimeError: no active SparkSession for ``np > 0``, or dynamic allocation.
            HorovodRunnerError: a rank raised or died, or the ranks did not start in time.
        """
        from horovod.runner.common.util import secret

        from hvdrunner._launch.driver import DriverService
        from hvdrunner._launch.pickling import dumps_payload
        from hvdrunner._launch.task import TaskSpec

        if not callable(main):
            raise ValueError(
                f"main must be a callable (your training function), got {type(main).__name__}."
            )
        payload = dumps_payload(main, kwargs)  # before any process or Spark job starts
        track_env = tracking.driver_context()
        secrets = tracking.secrets_in(track_env)
        np = abs(self.num_processor)
        key = secret.make_secret_key()
        launch: Any
        if self.num_processor < 0:
            from hvdrunner._launch.local_backend import LocalLaunch

            addr, bind, where = "127.0.0.1", "127.0.0.1", "driver processes"
            spread = True
        else:
            from hvdrunner._launch import spark_backend

            sc = _active_spark_context()
            spark_backend.preflight(sc, np, wait_s=self.start_timeout)
            addr, bind, where = (
                spark_backend.driver_address(sc),
                "0.0.0.0",
                f"Spark barrier tasks ({sc.master})",
            )
            spread = str(sc.master).startswith("local")
        service = DriverService(
            np, key, rendezvous_addr=addr, bind=bind, extra_env=track_env, secrets=secrets
        )
        spec = TaskSpec(
            driver_addr=addr,
            driver_port=service.port,
            key=key,
            payload=payload,
            forward_output=self.driver_log_verbosity == "all",
            spread_host_gpus=spread,
            pythonpath=_local_pythonpath(),
        )
        if self.num_processor < 0:
            launch = LocalLaunch(np, spec)
        else:
            launch = spark_backend.SparkLaunch(sc, np, spec)
        _status(f"launching {np} Horovod ranks on {where}")
        started = time.monotonic()
        ok = False
        try:
            launch.start()
            result = service.wait(self.start_timeout, launch.error)
            ok = True
        except HorovodRunnerError as err:
            if track_env:
                tracking.mark_failed(err.summary, secrets)
            raise
        finally:
            if not ok:  # also on KeyboardInterrupt in the notebook: no rank outlives run()
                service.abort()
            launch.stop(cancel=not ok)
            service.close()
            _status(f"job {'finished' if ok else 'failed'} after {time.monotonic() - started:.1f}s")
        return result


def _active_spark_context() -> Any:
    try:
        from pyspark import SparkContext
    except ImportError as exc:  # pragma: no cover - pyspark is part of the stack
        raise RuntimeError(
            "np>0 needs pyspark; install it or use np<0 to run on the driver."
        ) from exc
    sc = SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError(
            "np>0 runs on Spark executors but there is no active SparkSession. Create one "
            "first (e.g. hvdrunner.spark.local_session() locally; on Databricks it exists), "
            "or pass np<0 to run on the driver only."
        )
    return sc
