"""Driver side of a job: authenticated service, rank assignment, log relay, verdict.

One :class:`DriverService` per ``HorovodRunner.run()``. Supervisors connect, register with
their partition and host, and receive their Horovod environment once all ``np`` are in.
The main thread then consumes their events in :meth:`DriverService.wait` until every rank
exited cleanly (returns rank 0's value) or one failed (aborts the rest, raises).
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from hvdrunner._console import say
from hvdrunner._launch import assignments, commits, protocol
from hvdrunner._launch.driver import rendezvous, verdict
from hvdrunner._launch.driver.job import JobState
from hvdrunner._launch.driver.verdict import lost_failure, rank_failure, stall_failure
from hvdrunner._launch.limits import JobLimits
from hvdrunner._logging import get_logger
from hvdrunner._secrets import scrub
from hvdrunner.errors import HorovodRunnerError

_log = get_logger()

#: How long aborted ranks get to report back before ``run()`` raises anyway.
ABORT_WAIT_S = 10.0
#: Once the job is failing, a task silent this long (no beat) counts as lost with its host.
SILENT_AT_VERDICT_S = 5.0
#: How long close() waits for each of the service's own threads to end.
CLOSE_WAIT_S = 2.0


class _Conn:
    def __init__(self, cid: int, channel: protocol.Channel) -> None:
        self.cid = cid
        self.channel = channel
        self.partition: int | None = None
        self.host: str | None = None
        self.address: str | None = None
        self.hostname: str | None = None  # the host's own name and its address towards us
        self.ip: str | None = None
        self.port: int | None = None  # free on its host at registration (MASTER_PORT)
        self.rank: int | None = None
        self.exited = False
        self.lost = False  # disconnected (or silent) before its exit report
        self.last_seen = time.monotonic()  # last frame from it, beats included

    def where(self) -> str:
        """``host (ip)`` for messages."""
        name = self.hostname or self.address or "an unknown host"
        return f"{name} ({self.ip})" if self.ip and self.ip != name else name


class DriverService:
    """Accepts supervisors, hands out ranks and turns their reports into one verdict."""

    def __init__(
        self,
        np: int,
        key: bytes,
        rendezvous_addr: str,
        bind: str = "0.0.0.0",
        extra_env: dict[str, str] | None = None,
        secrets: list[str] | None = None,
        resume_commit: bytes | None = None,
    ) -> None:
        self.np = np
        # The last Horovod elastic commit of the job's attempts so far (commits.py): rank 0
        # of this attempt resumes from it; updated by this attempt's own commits.
        self._resume_commit = resume_commit
        self.commit = resume_commit
        # Sent to each rank over the authenticated channel, never in the pickled payload.
        self._extra_env = dict(extra_env or {})
        self._secrets = [s for s in (secrets or []) if s]
        self._key = key
        self._rendezvous_addr = rendezvous_addr
        self._events: queue.Queue[tuple[int, protocol.Message]] = queue.Queue()
        self._conns: dict[int, _Conn] = {}
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((bind, 0))
        self._sock.listen(max(16, 2 * np))
        self.port: int = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._rendezvous: Any = None  # horovod's gloo rendezvous, where horovod is installed
        self._threads = [
            threading.Thread(target=self._accept_loop, name="hvdrunner-accept", daemon=True),
            threading.Thread(target=self._beat_loop, name="hvdrunner-beat", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # -- network -------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        cid = 0
        while not self._closed.is_set():
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            cid += 1
            threading.Thread(target=self._serve, args=(cid, sock), daemon=True).start()

    def _serve(self, cid: int, sock: socket.socket) -> None:
        sock.settimeout(30)
        try:
            protocol.server_handshake(sock, self._key)
        except (protocol.ProtocolError, OSError):
            sock.close()  # not one of ours: drop silently, never unpickle its bytes
            return
        sock.settimeout(None)
        conn = _Conn(cid, protocol.Channel(sock))
        with self._lock:
            self._conns[cid] = conn
        try:
            while True:
                message = protocol.expect(conn.channel.recv(), protocol.TO_DRIVER, "a task")
                conn.last_seen = time.monotonic()
                if not isinstance(message, protocol.Beat):
                    self._events.put((cid, message))
        except (protocol.ProtocolError, OSError, EOFError):
            self._events.put((cid, protocol.Disconnected()))

    def _beat_loop(self) -> None:
        """Tell every task we are alive: a supervisor stops its rank when we fall silent."""
        while not self._closed.wait(protocol.HEARTBEAT_S):
            with self._lock:
                conns = list(self._conns.values())
            for conn in conns:
                with contextlib.suppress(OSError):
                    conn.channel.send(protocol.Beat())

    def _mark_silent(self, silent_s: float) -> bool:
        """Mark ranked, unfinished tasks silent for ``silent_s`` as lost; True if any."""
        now = time.monotonic()
        with self._lock:
            silent = [c for c in self._conns.values()
                      if c.rank is not None and not c.exited and now - c.last_seen > silent_s]  # fmt: skip
        for conn in silent:
            conn.lost = True
        return bool(silent)

    def close(self) -> None:
        """Stop listening, drop every connection and stop the rendezvous server; the
        service's threads and listening sockets are gone when it returns (bounded)."""
        self._closed.set()
        # close() alone does not wake a thread blocked in accept() on Linux: the socket
        # would keep listening and the thread live, one of each per job (and per attempt).
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            conn.channel.close()
        if self._rendezvous is not None:
            rendezvous.stop(self._rendezvous)
            self._rendezvous = None
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=CLOSE_WAIT_S)

    # -- rank assignment -----------------------------------------------------------------
    def _assign(self, registered: list[_Conn]) -> None:
        # Hosts in order of their lowest partition; a host's partitions get contiguous ranks.
        registered.sort(key=lambda c: c.partition if c.partition is not None else 0)
        by_host: dict[str, list[_Conn]] = {}
        for conn in registered:
            by_host.setdefault(str(conn.host), []).append(conn)
        num_hosts = str(len(by_host))
        plan = assignments.assign([(h, len(cs)) for h, cs in by_host.items()])
        # The compiled horovod's gloo meets through an HTTP rendezvous; hvdrunner's engine
        # through torch's store at MASTER_ADDR (torch_env), which needs no horovod.
        horovod_env: dict[str, str] = {}
        if rendezvous.available():
            self._rendezvous, port = rendezvous.start(plan)
            horovod_env = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": self._rendezvous_addr,
                           "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port)}  # fmt: skip
        slots = iter(plan)
        pairs = [(conn, next(slots)) for cs in by_host.values() for conn in cs]
        rank0 = next(conn for conn, slot in pairs if slot.rank == 0)
        for conn, slot in pairs:
            conn.rank = slot.rank
            env = assignments.slot_env(slot)
            env.update(self._extra_env)
            if self._resume_commit is not None:
                env[commits.RESUME_ENV] = "1"
            env.update(horovod_env)
            env.update(
                {
                    "HOROVOD_CONTROLLER": "gloo",
                    "HOROVOD_CPU_OPERATIONS": "gloo",
                    protocol.NUM_HOSTS_ENV: num_hosts,
                }
            )
            env.update(assignments.torch_env(slot, rank0.ip or rank0.address, rank0.port))
            commit = self._resume_commit if slot.rank == 0 else None
            conn.channel.send(protocol.Assign(env, commit))

    def abort(self) -> None:
        """Tell every connected rank to stop (their supervisors kill the rank processes)."""
        with self._lock:
            conns = list(self._conns.values())
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.channel.send(protocol.Abort())

    def stop_ranks(self) -> None:
        """Abort, then wait (bounded) until every started rank reported its exit or is gone:
        run() must not return while a rank of its job still runs (SIGTERM, Ctrl-C)."""
        self.abort()
        self._drain_exits(None, None)

    # -- the verdict ---------------------------------------------------------------------
    def wait(
        self,
        limits: JobLimits,
        job_error: Callable[[], BaseException | None],
        on_line: Callable[[str], None] | None = None,
        deadline: float | None = None,
    ) -> Any:
        """Consume events until success (returns rank 0's value) or failure (raises).

        Args:
            limits: the job's limits (start, stall, host, exit grace; the job's ``timeout``
                names the bound ``deadline`` ends).
            job_error: returns the launch backend's error (e.g. the Spark job failed), if any.
            on_line: where driver-side output goes; default prints to the current stdout.
            deadline: when the job's ``timeout`` runs out (``time.monotonic()``), counted from
                its first attempt; None: from this call (``limits.deadline``).
        """
        show = on_line or say

        def emit(text: str) -> None:
            show(self._scrub(text))

        started = time.monotonic()
        if deadline is None:
            deadline = limits.deadline(started)
        job = JobState(self.np, self._assign, self._lost_failure)
        try:
            return self._run_job(job, emit, limits, deadline, job_error, started)
        finally:
            self.commit = job.commit or self.commit

    def _run_job(
        self, job: JobState, emit: Callable[[str], None], limits: JobLimits,
        deadline: float | None, job_error: Callable[[], BaseException | None], started: float,
    ) -> Any:  # fmt: skip
        """The event loop of :meth:`wait`, then its verdict."""
        while job.running:
            now = time.monotonic()
            if job.rank0_done is not None and now - job.rank0_done > limits.exit_grace:
                self._stop_late_ranks(job, limits.exit_grace, emit)
                break
            job.failure = self._limit_failure(job, limits, deadline)
            if job.failure is not None:
                break
            try:
                cid, message = self._events.get(timeout=0.2)
            except queue.Empty:
                job.failure = self._idle_failure(
                    job, job_error, now - started, limits.start_timeout
                )
                continue
            with self._lock:
                conn = self._conns.get(cid)
            if conn is None:
                continue
            if isinstance(message, protocol.Output):
                emit(message.line())
            else:
                job.handle(conn, message)
        if job.failing:
            failure = self._verdict(job, emit, limits.host_timeout)
            if not job.finished_before(failure):
                raise failure
            # Rank 0's value is the job's: training ended before this rank was lost.
            _log.warning(verdict.lost_after_rank0_warning(failure))
        return job.rank0_value()

    def _limit_failure(
        self, job: JobState, limits: JobLimits, deadline: float | None
    ) -> HorovodRunnerError | None:
        """A stall, a host fallen silent, or the job's own time limit."""
        now = time.monotonic()
        stall = stall_failure(job.stuck, self.np, limits.stall_timeout, now)
        if stall is not None:
            return stall
        if job.assigned and self._mark_silent(limits.host_timeout):
            return self._lost_failure()
        if deadline is not None and now > deadline:
            return verdict.timeout_failure(limits.timeout or 0.0)
        return None

    def _idle_failure(
        self, job: JobState, job_error: Callable[[], BaseException | None], elapsed: float,
        start_timeout: float,
    ) -> HorovodRunnerError | None:  # fmt: skip
        """With no message: the launch backend failed, or the ranks never all started."""
        err = job_error()
        if err is not None:
            return verdict.backend_failure(err)
        if not job.assigned and elapsed > start_timeout:
            return verdict.start_failure(len(job.registered), self.np, start_timeout)
        return None

    def _stop_late_ranks(
        self, job: JobState, exit_grace: float, emit: Callable[[str], None]
    ) -> None:
        _log.warning(verdict.late_ranks_warning(job.late_ranks(), exit_grace))
        self.abort()
        self._drain_exits(job, emit)

    def _verdict(
        self, job: JobState, emit: Callable[[str], None], host_timeout: float
    ) -> HorovodRunnerError:
        """Stop the others, then name the real cause first: a lost host makes its peers fail
        too (gloo connection reset or timeout), so it outranks them."""
        self.abort()
        self._drain_exits(job, emit)
        self._mark_silent(min(SILENT_AT_VERDICT_S, host_timeout))
        lost = self._lost_failure()
        if lost is not None:
            return lost
        if job.failed_report is not None:
            return rank_failure(job.failed_report, self._scrub, job.exits)
        assert job.failure is not None
        return job.failure

    def _scrub(self, text: str) -> str:
        return scrub(text, self._secrets)

    def _lost_failure(self) -> HorovodRunnerError | None:
        """The error naming the hosts whose tasks vanished (None while none did)."""
        with self._lock:
            conns = list(self._conns.values())
        return lost_failure(conns)

    def _drain_exits(self, job: JobState | None, emit: Callable[[str], None] | None) -> None:
        """After an abort, wait (bounded) until every started rank reported its exit (into
        ``job``, if given) or is gone, so the ranks are reaped before we return."""
        deadline = time.monotonic() + ABORT_WAIT_S

        def outstanding() -> bool:
            now = time.monotonic()
            with self._lock:
                return any(c.rank is not None and not c.exited and not c.lost
                           and now - c.last_seen < SILENT_AT_VERDICT_S
                           for c in self._conns.values())  # fmt: skip

        while outstanding() and time.monotonic() < deadline:
            try:
                cid, message = self._events.get(timeout=0.1)
            except queue.Empty:
                continue
            with self._lock:
                conn = self._conns.get(cid)
            if isinstance(message, protocol.Output):
                if emit is not None:
                    emit(message.line())
            elif conn is not None and isinstance(message, protocol.ExitReport):
                if job is not None:  # the cause may only now report (JobState.on_exit)
                    job.on_exit(conn, message)
                conn.exited = True
            elif (
                conn is not None
                and isinstance(message, protocol.Disconnected)
                and not conn.exited
                and conn.rank is not None
            ):
                conn.lost = True
