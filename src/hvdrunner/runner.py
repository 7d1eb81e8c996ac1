"""``HorovodRunner``: run a training function on Horovod ranks over Spark barrier tasks."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hvdrunner import _noise, _versions, tracking
from hvdrunner._checks import is_int
from hvdrunner._launch.driver import restarts, verdict
from hvdrunner._launch.limits import DEFAULTS, JobLimits
from hvdrunner._logging import get_logger
from hvdrunner._secrets import secrets_in
from hvdrunner.distributed import ATTEMPT_ENV
from hvdrunner.errors import HorovodRunnerError

if TYPE_CHECKING:  # the backends package loads the launch machinery (psutil) with a job only
    from hvdrunner._launch.backends.base import Backend, Launch

_log = get_logger()

_VERBOSITIES = ("all", "log_callback_only")


def _local_pythonpath() -> tuple[str, ...]:
    """The driver's own source folders (not the interpreter's), for ranks on this machine."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for p in sys.path:
        real = os.path.realpath(p or os.getcwd())
        if os.path.isdir(real) and not any(real.startswith(x) for x in prefixes):
            out.append(real)
    return tuple(dict.fromkeys(out))


class _Terminated(SystemExit):
    """SIGTERM reached the driver during run() (job cancelled, cluster shutting down).

    A ``SystemExit(143)``: after run()'s cleanup the process ends as SIGTERM would have it.
    """


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into an exception in the main thread, so run()'s cleanup still runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class HorovodRunner:
    """Runs a function as a Horovod job: ``np`` ranks, gloo controller, rank 0's result back.

    A drop-in for Databricks' ``sparkdl.HorovodRunner``.

    Args:
        np: ``> 0``: that many Spark barrier tasks, one rank each (needs an active
            SparkSession with enough task slots). ``0``: one rank per task slot of the
            cluster (sparkdl's meaning). ``< 0``: ``-np`` processes on the driver, no Spark
            needed.
        driver_log_verbosity: ``"all"`` streams every rank's stdout/stderr live to the
            driver, prefixed ``[rank]<stream>:``; ``"log_callback_only"`` (sparkdl's
            default) shows only what ranks send with :func:`hvdrunner.log_to_driver`.
        start_timeout: seconds to wait for all ranks to start (free task slots) before
            failing.
        stall_timeout: seconds a rank may wait inside one framework or Horovod call (a
            collective: allreduce, broadcast) while another rank does not join it; then the
            job fails naming the rank(s) that did not join and where they were. Default 600.
        exit_grace: seconds the other ranks get to exit after rank 0 returned; then they
            are stopped with a warning and rank 0's value is returned. Default 60.
        timeout: optional bound on the whole job, in seconds (default ``None``: none):
            every attempt of a job with ``max_restarts``, and the waits for slots between
            them, together.
        host_timeout: seconds without a heartbeat (sent every second both ways) between
            the driver and a rank's Spark task before that task's host is declared lost:
            the job then fails naming the host and its ranks, and a task that hears nothing
            from the driver that long stops its rank. A host that dies outright closes
            its connections and is named at once. Default 30.
        max_restarts: how many times a failed job is started again, from the start of the
            function with the same arguments, before its error is raised (default 0: never).
            A restart follows a lost host or task, a rank killed by a signal, a failed Spark
            job, or - once - an exception in the function; never a failure a restart cannot
            fix (out of sync, corrupt data or checkpoint, out of memory, stall, timeout).
            Before each restart the job waits up to ``start_timeout`` for ``np`` task slots.
            ``hvdrunner.keras.fit`` and ``hvdrunner.torch.fit`` with a ``checkpoint_dir``
            resume from the newest intact checkpoint into the same MLflow run; your own
            function reads :func:`hvdrunner.distributed.attempt` and its own checkpoint.
            Each restart is a warning naming its cause, and a tag/metric
            ``hvdrunner.restarts`` of the run; the final error lists every attempt.
        min_np: with ``max_restarts``, the fewest ranks a restart may run with when the
            cluster has fewer than ``np`` free task slots (default ``None``: always ``np``,
            waiting for replacements). With fewer ranks each rank reads a larger shard
            (every row once per epoch), the global batch is ``batch_size`` times the ranks
            and fit's learning rate is scaled to the ranks there are.

    Example:
        >>> def train(lr):
        ...     import hvdrunner.hvd_keras as hvd
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
        start_timeout: float = DEFAULTS.start_timeout,
        stall_timeout: float = DEFAULTS.stall_timeout,
        exit_grace: float = DEFAULTS.exit_grace,
        timeout: float | None = DEFAULTS.timeout,
        host_timeout: float = DEFAULTS.host_timeout,
        max_restarts: int = DEFAULTS.max_restarts,
        min_np: int | None = None,
    ) -> None:
        if not is_int(np):
            raise ValueError(
                f"np must be an int, got {np!r} ({type(np).__name__}). Pass np=N for N Spark "
                f"tasks (one Horovod rank each), np=0 for every task slot of the cluster, or "
                f"np=-N for N processes on the driver."
            )
        if driver_log_verbosity not in _VERBOSITIES:
            raise ValueError(
                f"driver_log_verbosity must be one of {_VERBOSITIES}, got {driver_log_verbosity!r}."
            )
        self.num_processor = np  # sparkdl's attribute name
        self.driver_log_verbosity = driver_log_verbosity
        # The job's limits, validated once and passed whole to the driver, tasks and ranks.
        self.limits = JobLimits(
            start_timeout=start_timeout, stall_timeout=stall_timeout, exit_grace=exit_grace,
            timeout=timeout, host_timeout=host_timeout, max_restarts=max_restarts,
        )  # fmt: skip
        self.min_np = _check_min_np(min_np, np, self.limits.max_restarts)

    def run(self, main: Callable[..., Any], **kwargs: Any) -> Any:
        """Run ``main(**kwargs)`` on every rank; return rank 0's return value.

        Raises:
            ValueError: ``main`` or an argument cannot be pickled, or the cluster has fewer
                task slots than ``np``.
            RuntimeError: no active SparkSession for ``np >= 0``, or dynamic allocation.
            HorovodRunnerError: a rank raised or died, stalled a collective, the ranks did
                not start in time, or the job exceeded ``timeout`` (with ``max_restarts``:
                in the last attempt, every attempt's cause listed).
        """
        from hvdrunner._launch.pickling import dumps_payload

        if not callable(main):
            raise ValueError(
                f"main must be a callable (your training function), got {type(main).__name__}."
            )
        preflight = getattr(main, "hvdrunner_preflight", None)
        if preflight is not None:  # e.g. hvdrunner.keras.fit: its arguments checked here,
            kwargs = preflight(**kwargs) or kwargs  # and the validated ones sent to the ranks
        payload = dumps_payload(main, kwargs)  # before any process or Spark job starts
        track_env = tracking.driver_context()
        secrets = secrets_in(track_env)
        try:
            with _sigterm_raises():  # also between attempts, while a restart waits for slots
                return self._attempts(payload, track_env, secrets)
        except BaseException as err:
            # A tracking failure while recording the error is a warning (chained), never a
            # replacement, and the run is never left RUNNING or active.
            if track_env:
                tracking.mark_failed(_summary(err), secrets)
            raise

    def _attempts(self, payload: bytes, track_env: dict[str, str], secrets: list[str]) -> Any:
        """The job, started again after each restartable failure (``max_restarts``), all
        attempts within one ``timeout``."""
        failed: list[restarts.Attempt] = []
        deadline = self.limits.deadline(time.monotonic())
        carried = _Carried()
        while True:
            number = len(failed) + 1
            np = failed[-1].np if failed else self.num_processor
            try:  # on a restart, waiting for the slots is part of the attempt
                target = self._target(restarting=bool(failed), deadline=deadline)
                np = target.np
                result = self._attempt(target, payload, track_env, secrets, number, deadline,
                                       carried)  # fmt: skip
            except HorovodRunnerError as err:
                if not self.limits.max_restarts:
                    raise
                failed.append(restarts.judge(err, failed, self.limits.max_restarts, number, np))
                if not failed[-1].restart:
                    raise restarts.final_error(err, failed) from err
                _log.warning(f"restarting the job (restart {number} of at most "
                             f"{self.limits.max_restarts}): {failed[-1].line()}")  # fmt: skip
                tracking.note_restart(track_env, number, failed[-1].line(), secrets)
                continue
            if failed:
                _log.info(f"the job finished on attempt {number}, after {len(failed)} restart(s)")
            return result

    def _attempt(
        self, target: _Target, payload: bytes, track_env: dict[str, str], secrets: list[str],
        number: int, deadline: float | None, carried: _Carried,
    ) -> Any:  # fmt: skip
        """One launch of the job: its own key, driver service, rendezvous and Spark job."""
        from hvdrunner._launch.assignments import make_key
        from hvdrunner._launch.driver.service import DriverService
        from hvdrunner._launch.rank.task import TaskSpec

        key = make_key()
        service = DriverService(
            target.np, key, rendezvous_addr=target.addr, bind=target.backend.bind,
            extra_env={**_versions.framework_env(), **track_env, ATTEMPT_ENV: str(number)},
            secrets=secrets,
            resume_commit=carried.commit,
        )  # fmt: skip
        spec = TaskSpec(
            driver_addr=target.addr,
            driver_port=service.port,
            key=key,
            payload=payload,
            forward_output=self.driver_log_verbosity == "all",
            spread_host_gpus=target.backend.spread_host_gpus,
            pythonpath=_local_pythonpath(),
            limits=self.limits,
            quiet=_noise.CHATTER,
            quiet_without_gpu=_noise.CPU_NOISE,
            # Before user code: Horovod's Keras layer fails fast under Keras 3 (it would
            # train unsynchronized), and in tf_keras mode `import keras` means tf_keras.
            # The guard is a leaf that loads no framework: harmless in a torch rank.
            # Then MLflow's system metrics of each host, when the driver switched them on.
            rank_setup=(
                "hvdrunner._import_guard:install_import_guard",
                "hvdrunner.tracking.system:start",
            ),
            # Leave the gloo ring in order, so peers still working see no 'connection reset'.
            rank_teardown=("hvdrunner.tracking.system:stop", "hvdrunner.distributed:shutdown"),
            library_dirs=_versions.LIBRARY_PACKAGES,
        )
        _log.info(f"launching {target.np} Horovod ranks on {target.backend.where}"
                  + (f" (attempt {number})" if number > 1 else ""))  # fmt: skip
        try:
            return self._supervise(target.backend.launch(target.np, spec), service, deadline)
        finally:
            carried.commit = service.commit

    def _target(self, restarting: bool = False, deadline: float | None = None) -> _Target:
        """Where the ranks run (:func:`backends.choose`), checked; on a restart, once the
        cluster has the slots again (``min_np``: at least those), waiting no longer than
        ``start_timeout`` and the job's ``timeout`` allow."""
        if deadline is not None and time.monotonic() >= deadline:
            raise verdict.timeout_failure(float(self.limits.timeout or 0.0))
        from hvdrunner._launch import backends  # the launch machinery loads with a job

        backend = backends.choose(self.num_processor)
        np = abs(self.num_processor)
        if np == 0:  # sparkdl: all task slots
            np = backend.slots()
            _log.info(f"np=0: using all {np} task slots of the cluster")
        if restarting:
            wait = self.limits.start_timeout
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - time.monotonic()))
            try:
                np = backend.slots_for_restart(np, self.min_np, wait)
            except ValueError as exc:
                if deadline is not None and time.monotonic() >= deadline:
                    raise verdict.timeout_failure(float(self.limits.timeout or 0.0)) from exc
                raise restarts.slots_failure(str(exc)) from exc
        else:
            backend.preflight(np, self.min_np, self.limits.start_timeout)
        return _Target(np, backend, backend.driver_address())

    def _supervise(self, launch: Launch, service: Any, deadline: float | None) -> Any:
        """Start the ranks and wait for the verdict; on any failure no rank outlives this
        attempt (the job's error is what the caller gets)."""
        started = time.monotonic()
        ok = False
        try:
            launch.start()
            result = service.wait(self.limits, launch.error, deadline=deadline)
            ok = True
        finally:
            if not ok:  # also on KeyboardInterrupt in the notebook: no rank outlives run()
                service.stop_ranks()
            launch.stop(cancel=not ok)
            service.close()
            _log.info(
                f"job {'finished' if ok else 'failed'} after {time.monotonic() - started:.1f}s"
            )
        return result


@dataclass
class _Carried:
    """What one attempt leaves the next: Horovod elastic code's last ``state.commit()``
    (:mod:`hvdrunner._launch.commits`)."""

    commit: bytes | None = None


@dataclass(frozen=True)
class _Target:
    np: int
    backend: Backend
    addr: str  # the driver's address the ranks connect to


def _check_min_np(min_np: Any, np: int, max_restarts: int) -> int | None:
    """``min_np``: None, or 1 <= min_np <= np for Spark jobs (np > 0) with restarts."""
    if min_np is None:
        return None
    if not is_int(min_np, at_least=1):
        raise ValueError(f"min_np must be None or an int >= 1, got {min_np!r}.")
    if np <= 0 or min_np > np:
        raise ValueError(
            f"min_np={min_np} needs np > 0 Spark tasks and min_np <= np (np={np}): it is the "
            f"fewest ranks a restart may run with when the cluster lost slots."
        )
    if not max_restarts:
        raise ValueError(
            f"min_np={min_np} only applies to restarts: pass max_restarts=N (N >= 1) too."
        )
    return min_np


def _summary(err: BaseException) -> str:
    if isinstance(err, HorovodRunnerError):
        return err.summary
    if isinstance(err, _Terminated):
        return "the driver received SIGTERM"
    return f"{type(err).__name__}: {err}"
