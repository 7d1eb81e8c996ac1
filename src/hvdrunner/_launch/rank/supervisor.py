"""Supervise one rank: start its child process, relay its output and verdict to the driver.

Runs inside a Spark barrier task (``np > 0``) or a driver thread (``np < 0``). The child is
a fresh interpreter in its own process group, so a kill reaches everything it started.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import IO

import psutil

from hvdrunner import _leftovers as leftovers
from hvdrunner._console import say
from hvdrunner._launch import protocol
from hvdrunner._launch.commits import COMMIT_FILE_ENV
from hvdrunner._launch.rank.worker import CONTROL_FD_ENV
from hvdrunner._logging import get_logger
from hvdrunner._noise import noisy

#: Lines of a rank's output kept for the error report.
TAIL_LINES = 100
_KILL_GRACE_S = 3.0


def describe_exit(code: int) -> str:
    """Human wording for a child's return code (negative = killed by a signal)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = (
        " (killed: by the job, by hand, or by the out-of-memory killer)"
        if name == "SIGKILL"
        else ""
    )
    return f"{name}{hint}"


#: Set in a rank's environment when it has no GPU: then the lines below are noise.
NO_GPU_ENV = "HVDRUNNER_NO_GPU"


class RankSupervisor:
    """Runs ``python -m hvdrunner._launch.rank.worker`` for one rank and reports to ``channel``."""

    def __init__(
        self,
        channel: protocol.Channel,
        rank: int,
        env: Mapping[str, str],
        payload: bytes,
        forward_output: bool,
        host_timeout: float,
        quiet: tuple[str, ...] = (),
        quiet_without_gpu: tuple[str, ...] = (),
        commit: bytes | None = None,
    ) -> None:
        self._channel = channel
        self._commit = commit  # the elastic commit this rank resumes from (rank 0 only)
        self._rank = rank
        self._env = dict(env)
        self._payload = payload
        self._forward = forward_output
        # Markers of lines never relayed; without a GPU also the GPU-probing ones.
        self._quiet = quiet + (quiet_without_gpu if self._env.get(NO_GPU_ENV) == "1" else ())
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._tail_lock = threading.Lock()
        self._error: protocol.ErrorReport | None = None
        self._returned = False
        self._aborted = threading.Event()
        self._host_timeout = host_timeout
        self._heard = time.monotonic()  # last frame from the driver (beats included)
        self._proc: subprocess.Popen[bytes] | None = None
        self._descendants: dict[int, psutil.Process] = {}

    # -- output relays -------------------------------------------------------------------
    def _pump_output(self, stream: IO[bytes], name: str) -> None:
        for raw in iter(stream.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip("\n")
            with self._tail_lock:
                self._tail.append(f"<{name}>: {text}")
            if noisy(text, self._quiet):
                continue
            if self._forward:
                try:
                    self._channel.send(protocol.Output(self._rank, text, name))
                except OSError:
                    self._forward = False  # driver gone; keep draining so the child never blocks
            else:
                # Not streamed to the driver: keep it in this executor's own log.
                say(f"[{self._rank}]<{name}>: {text}", err=True)
        stream.close()

    def _pump_control(self, stream: IO[bytes]) -> None:
        try:
            while True:
                message = protocol.expect(
                    protocol.read_frame(stream.read), protocol.TO_SUPERVISOR, "the rank"
                )
                if isinstance(message, protocol.RankError):
                    self._error = message.error
                elif isinstance(message, protocol.Log):  # log_to_driver in the rank
                    self._channel.send(protocol.Output(message.rank, message.text))
                elif isinstance(message, protocol.Stuck):
                    self._channel.send(protocol.RankState(self._rank, message))
                elif isinstance(message, protocol.Moving):
                    self._channel.send(protocol.RankState(self._rank, None))
                elif isinstance(message, protocol.Value):
                    self._channel.send(protocol.Result(self._rank, message.blob))
                elif isinstance(message, protocol.Returned):
                    self._returned = True
                elif isinstance(message, protocol.Commit):
                    self._relay_commit(message.path)
        except (protocol.ProtocolError, OSError, EOFError):
            pass
        finally:
            stream.close()

    def _relay_commit(self, path: str) -> None:
        """An elastic commit the rank wrote to our folder: on to the driver, then gone."""
        try:
            with open(path, "rb") as f:
                blob = f.read()
        except OSError:
            return  # a newer commit replaced it
        with contextlib.suppress(OSError):
            os.remove(path)
        self._channel.send(protocol.Committed(self._rank, blob))

    def _listen_for_abort(self) -> None:
        try:
            while True:
                message = protocol.expect(self._channel.recv(), protocol.TO_TASK, "the driver")
                self._heard = time.monotonic()
                if isinstance(message, protocol.Abort):
                    break
        except (protocol.ProtocolError, OSError):
            pass  # the driver went away: treat exactly like an abort
        self._aborted.set()
        self.kill()

    def _watch_driver(self, proc: subprocess.Popen[bytes]) -> None:
        """A cut link closes nothing: silence from the driver past host_timeout is an abort,
        so no rank keeps running on a host the job has lost."""
        while proc.poll() is None and not self._aborted.is_set():
            silent = time.monotonic() - self._heard
            if silent > self._host_timeout:
                get_logger().warning(
                    f"rank {self._rank}: no word from the driver for {silent:.0f}s "
                    f"(host_timeout): stopping the rank"
                )
                self._aborted.set()
                self.kill()
                return
            time.sleep(0.5)

    def kill(self) -> None:
        """Terminate the child's whole process group (TERM, then KILL after a grace period)."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def _watch_descendants(self, proc: subprocess.Popen[bytes]) -> None:
        """Remember the rank's descendants while it runs: once it exits they are orphans."""
        try:
            parent = psutil.Process(proc.pid)
        except psutil.Error:
            return
        while proc.poll() is None:
            try:
                for child in parent.children(recursive=True):
                    self._descendants[child.pid] = child
            except psutil.Error:
                pass
            time.sleep(0.5)

    def _kill_descendants(self) -> None:
        for child in list(self._descendants.values()):
            with contextlib.suppress(psutil.Error):
                if child.is_running():  # same pid *and* start time: never a recycled pid
                    child.kill()

    # -- main ----------------------------------------------------------------------------
    def run(self) -> int:
        """Run the rank to completion and send its ``exit`` report; returns the exit code."""
        self._sweep()
        lock = -1
        try:
            with tempfile.TemporaryDirectory(prefix=leftovers.FOLDER_PREFIX) as tmp:
                with contextlib.suppress(OSError):  # without it, no sweep ever takes it
                    lock = leftovers.claim(tmp)  # held until the folder is gone
                proc, control = self._spawn(tmp)
                pumps = self._pump(proc, control)
                code = proc.wait()
                self._reap(proc, pumps)
                leftovers.remove(tmp)  # however the rank ended (a killed one cleaned up nothing)
        finally:
            if lock >= 0:
                os.close(lock)
        with self._tail_lock:
            tail = list(self._tail)
        report = protocol.ExitReport(
            self._rank, code, describe_exit(code), self._error, tuple(tail),
            self._aborted.is_set(), self._returned,
        )  # fmt: skip
        with contextlib.suppress(OSError):
            self._channel.send(report)
        return code

    @staticmethod
    def _sweep() -> None:
        """Remove what supervisors killed with their task left on this host (_leftovers)."""
        try:
            removed = leftovers.sweep()
        except OSError as exc:  # never a reason to fail a rank
            get_logger().debug(f"could not sweep the folders of killed ranks: {exc}")
            return
        if removed:
            get_logger().debug(f"removed {len(removed)} folders of killed ranks: {removed}")

    def _spawn(self, tmp: str) -> tuple[subprocess.Popen[bytes], int]:
        """Start the rank's child (``python -m hvdrunner._launch.rank.worker``) with its payload
        (and the elastic commit it resumes from) in ``tmp``; returns it and the read end of
        its control pipe."""
        payload_path = os.path.join(tmp, "payload.pkl")
        with open(payload_path, "wb") as f:
            f.write(self._payload)
        read_fd, write_fd = os.pipe()
        env = dict(self._env)
        if self._commit is not None:
            commit_path = os.path.join(tmp, "commit.pkl")
            with open(commit_path, "wb") as f:
                f.write(self._commit)
            env[COMMIT_FILE_ENV] = commit_path
        env[CONTROL_FD_ENV] = str(write_fd)
        env[leftovers.RANK_DIR_ENV] = tmp
        env["PYTHONUNBUFFERED"] = "1"
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "hvdrunner._launch.rank.worker", payload_path],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,
                cwd=tmp if not os.access(os.getcwd(), os.W_OK) else None,
            )
        finally:
            os.close(write_fd)
        return self._proc, read_fd

    def _pump(self, proc: subprocess.Popen[bytes], control: int) -> list[threading.Thread]:
        """Relay the child's output and control messages to the driver, and watch the driver,
        the child and its descendants; returns the relay threads (joined by :meth:`_reap`)."""
        assert proc.stdout is not None and proc.stderr is not None
        pumps = [
            threading.Thread(target=self._pump_output, args=(proc.stdout, "stdout"), daemon=True),
            threading.Thread(target=self._pump_output, args=(proc.stderr, "stderr"), daemon=True),
            threading.Thread(target=self._pump_control,
                             args=(os.fdopen(control, "rb", buffering=0),), daemon=True),
        ]  # fmt: skip
        for t in pumps:
            t.start()
        threading.Thread(target=self._listen_for_abort, daemon=True).start()
        threading.Thread(target=self._watch_driver, args=(proc,), daemon=True).start()
        threading.Thread(target=self._watch_descendants, args=(proc,), daemon=True).start()
        return pumps

    def _reap(self, proc: subprocess.Popen[bytes], pumps: list[threading.Thread]) -> None:
        """After the child exited: nothing it left may outlive the job or hold the pipes open -
        its process group, and descendants that left the group (setsid, daemons)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._kill_descendants()
        for t in pumps:
            # Short: a descendant that escaped every kill may hold a pipe open; the pumps are
            # daemon threads and must not delay the job's end.
            t.join(timeout=3)
