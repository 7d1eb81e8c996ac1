"""Pure pieces of the launcher: GPU assignment, interface lookup, handshake, exit wording,
the port of rank 0's store."""

from __future__ import annotations

import contextlib
import random
import signal
import socket
import threading
import time

import pytest

from hvdrunner import HorovodRunnerError
from hvdrunner._launch import protocol
from hvdrunner._launch.driver.service import DriverService
from hvdrunner._launch.limits import JobLimits
from hvdrunner._launch.rank import task
from hvdrunner._launch.rank.supervisor import describe_exit
from hvdrunner._launch.rank.task import TaskSpec, interface_for
from hvdrunner.distributed import cuda_visible_devices


@pytest.mark.parametrize(
    ("task_gpus", "local_rank", "local_size", "host", "expected"),
    [
        (["3"], 0, 2, ["0", "1"], "3"),  # the task's own GPUs win
        (["2", "5"], 1, 2, [], "2,5"),
        ([], 0, 2, ["0", "1"], "0"),
        ([], 1, 2, ["0", "1", "2", "3"], "2,3"),  # equal contiguous blocks
        ([], 2, 3, ["0", "1"], "0"),  # fewer GPUs than ranks: round-robin
        ([], 1, 2, [], None),  # CPU: leave the environment alone
    ],
)
def test_cuda_visible_devices(task_gpus, local_rank, local_size, host, expected):
    assert cuda_visible_devices(task_gpus, local_rank, local_size, host) == expected


def test_interface_for_loopback_and_unknown():
    assert interface_for("127.0.0.1")
    with pytest.raises(RuntimeError, match="SPARK_LOCAL_IP"):
        interface_for("203.0.113.254")  # TEST-NET-3: documentation-only, never a local address


def test_describe_exit_names_signals():
    assert "SIGKILL" in describe_exit(-signal.SIGKILL)
    assert "out-of-memory" in describe_exit(-signal.SIGKILL)
    assert describe_exit(3) == "exit code 3"


def test_driver_service_drops_peers_without_the_job_key():
    service = DriverService(1, b"k" * 32, rendezvous_addr="127.0.0.1", bind="127.0.0.1")
    try:
        with pytest.raises(protocol.ProtocolError):
            protocol.connect("127.0.0.1", service.port, b"wrong-key" * 4, timeout=5)
        chan = protocol.connect("127.0.0.1", service.port, b"k" * 32, timeout=5)
        chan.close()
    finally:
        service.close()


def test_task_spec_repr_hides_the_key():
    spec = TaskSpec("10.0.0.1", 1234, b"secret-key-bytes", b"payload", True, False)
    assert "secret" not in repr(spec) and "secret" not in str(spec)


def _registered_task(service: DriverService, partition: int, hostname: str) -> protocol.Channel:
    """A task as the driver sees it: connected, registered; it sends no heartbeat."""
    chan = protocol.connect("127.0.0.1", service.port, b"k" * 32, timeout=5)
    chan.send(protocol.Register(partition, f"hash-{hostname}", "127.0.0.1",
                                            hostname, "10.9.9.9"))  # fmt: skip
    return chan


def _next_order(chan: protocol.Channel) -> protocol.Message:
    """The driver's next frame to a task, heartbeats skipped."""
    message = chan.recv()
    while isinstance(message, protocol.Beat):
        message = chan.recv()
    return message


def test_a_task_that_falls_silent_is_a_lost_host_named_with_its_ranks():
    # A cut link closes nothing: only the missing heartbeats tell (host_timeout).
    service = DriverService(2, b"k" * 32, rendezvous_addr="127.0.0.1", bind="127.0.0.1")
    chans = [_registered_task(service, i, "node-b") for i in range(2)]
    stop = threading.Event()

    def drain(chan: protocol.Channel) -> None:  # read the driver's frames, answer nothing
        with contextlib.suppress(Exception):
            while not stop.is_set():
                chan.recv()

    for chan in chans:
        threading.Thread(target=drain, args=(chan,), daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(HorovodRunnerError) as info:
            service.wait(JobLimits(start_timeout=30, host_timeout=2.0), lambda: None)
    finally:
        stop.set()
        for chan in chans:
            chan.close()
        service.close()
    assert 2.0 <= time.monotonic() - t0 < 15
    assert info.value.summary.startswith("Lost host node-b (10.9.9.9) with rank(s) [0, 1] before")
    assert info.value.rank == 0


def test_lost_host_outranks_the_failures_it_causes_on_other_hosts():
    # Rank 1 (host a) fails because host b vanished: the verdict names host b first.
    service = DriverService(2, b"k" * 32, rendezvous_addr="127.0.0.1", bind="127.0.0.1")
    a = _registered_task(service, 0, "node-a")
    b = _registered_task(service, 1, "node-b")

    def play() -> None:
        for chan in (a, b):
            _next_order(chan)  # its rank
        # rank 0's failure (caused by b) reaches the driver first, then b's connection drops
        a.send(protocol.ExitReport(0, 1, "SIGABRT",
                                           tail=("gloo::IoException: Connection reset by peer",)))  # fmt: skip
        b.close()

    threading.Thread(target=play, daemon=True).start()
    try:
        with pytest.raises(HorovodRunnerError) as info:
            service.wait(JobLimits(start_timeout=30), lambda: None)
    finally:
        a.close()
        service.close()
    assert info.value.summary.startswith("Lost host node-b (10.9.9.9) with rank(s) [1]")


def test_a_ranks_own_exception_that_reports_after_the_abort_is_still_named_the_cause():
    # Under load (CI's small suites beside 19's), rank 1 raised, its peer's collective failed
    # and reported first, and the verdict's abort reached rank 1's supervisor while it was
    # still collecting its rank's output: rank 1's report, marked stopped, came during the
    # drain and carried the real cause, which the verdict ignored (it named rank 0).
    service = DriverService(2, b"k" * 32, rendezvous_addr="127.0.0.1", bind="127.0.0.1")
    a = _registered_task(service, 0, "node-a")
    b = _registered_task(service, 1, "node-a")
    gone = protocol.ErrorReport("HorovodInternalError", "hvdrunner.errors",
                                "a collective failed on rank 0: Connection closed by peer", "")  # fmt: skip
    own = protocol.ErrorReport("ValueError", "builtins", "bad shard on rank 1", "")

    def play() -> None:
        for chan in (a, b):
            _next_order(chan)  # its rank
        a.send(protocol.ExitReport(0, 1, "exit code 1", gone))
        assert isinstance(_next_order(b), protocol.Abort)
        b.send(protocol.ExitReport(1, 1, "exit code 1", own, aborted=True))

    threading.Thread(target=play, daemon=True).start()
    try:
        with pytest.raises(HorovodRunnerError) as info:
            service.wait(JobLimits(start_timeout=30), lambda: None)
    finally:
        a.close()
        b.close()
        service.close()
    assert info.value.rank == 1
    assert info.value.summary.startswith("Rank 1 failed with ValueError: bad shard on rank 1")


def test_lost_failure_names_whole_hosts_and_single_ranks():
    from hvdrunner._launch.driver.verdict import lost_failure

    rows = [("a", 0, "node-a (10.0.0.1)", False), ("a", 1, "node-a (10.0.0.1)", False),
            ("b", 2, "node-b (10.0.0.2)", True), ("b", 3, "node-b (10.0.0.2)", True),
            ("c", 4, "node-c (10.0.0.3)", True), ("c", 5, "node-c (10.0.0.3)", False)]  # fmt: skip
    tasks = [_FakeTask(host, rank, where, lost) for host, rank, where, lost in rows]
    err = lost_failure([*tasks, _FakeTask("d", None, "node-d", True)])  # unranked: not counted
    assert err is not None and err.rank == 2
    assert err.summary.startswith(
        "Lost host node-b (10.0.0.2) with rank(s) [2, 3]; rank(s) [4] on node-c (10.0.0.3) before"
    )
    for t in tasks:
        t.lost = False
    assert lost_failure(tasks) is None


class _FakeTask:
    """A task as the job and the verdict see it (verdict.Task)."""

    def __init__(self, host=None, rank=None, where="", lost=False) -> None:
        self.partition = self.address = self.hostname = self.ip = None
        self.host, self.rank, self._where, self.lost = host, rank, where, lost
        self.exited = False

    def where(self) -> str:
        return self._where


def test_frames_become_typed_messages_or_are_refused():
    reg = protocol.Register(0, "h", "127.0.0.1", "node", "10.0.0.1")
    assert protocol.expect(reg, protocol.TO_DRIVER, "a task") is reg
    with pytest.raises(protocol.ProtocolError, match="unexpected frame dict from a task"):
        protocol.expect({"rank": 0, "code": 1}, protocol.TO_DRIVER, "a task")  # untyped: refused
    with pytest.raises(protocol.ProtocolError, match="unexpected frame Assign from a task"):
        protocol.expect(protocol.Assign({}), protocol.TO_DRIVER, "a task")  # the wrong way
    with pytest.raises(protocol.ProtocolError, match="unexpected frame Register from the rank"):
        protocol.expect(reg, protocol.TO_SUPERVISOR, "the rank")
    assert protocol.Output(1, "hi", "stderr").line() == "[1]<stderr>: hi"
    assert protocol.Output(1, "epoch 1").line() == "[1] epoch 1"


def test_job_state_one_handler_per_message():
    from hvdrunner._launch.driver.job import JobState

    assigned: list[list] = []
    job = JobState(2, assigned.append, lambda: HorovodRunnerError("lost"))
    a, b = _FakeTask(), _FakeTask()
    job.handle(a, protocol.Register(0, "h1", hostname="n1"))
    assert not job.assigned and a.hostname == "n1"
    job.handle(b, protocol.Register(1, "h2"))
    assert job.assigned and assigned == [[a, b]]
    a.rank, b.rank = 0, 1
    job.handle(b, protocol.RankState(1, protocol.Stuck(3.0, True, "x")))
    assert job.stuck[1].since <= time.monotonic() - 3.0 and job.stuck[1].in_library
    job.handle(b, protocol.RankState(1, None))
    assert job.stuck == {}
    job.handle(a, protocol.Result(0, b"value"))
    job.handle(a, protocol.ExitReport(0, 0, "exit code 0"))
    assert job.rank0_done is not None and job.running and job.result == b"value"
    job.handle(b, protocol.ExitReport(1, -9, "SIGKILL", aborted=True))  # stopped by us
    assert job.failed_report is None and not job.running and not job.failing
    other = JobState(1, lambda _: None, lambda: HorovodRunnerError("lost host"))
    t = _FakeTask()
    other.handle(t, protocol.Register(0, "h"))
    t.rank = 0
    other.handle(t, protocol.Disconnected())
    assert t.lost and str(other.failure) == "lost host" and other.failing


def test_a_rank_that_only_saw_its_peer_go_is_not_named_the_cause():
    """Rank 1 is killed; rank 0's collective fails at once and its report may arrive first.
    The verdict names the killed rank, and keeps a real error over a later consequence."""
    from hvdrunner._launch.driver.job import JobState

    gone = protocol.ErrorReport("HorovodInternalError", "hvdrunner.errors",
                                "gradient allreduce failed: Connection closed by peer", "")  # fmt: skip
    real = protocol.ErrorReport("ValueError", "builtins", "bad batch", "")
    for first, second, cause in (
        (protocol.ExitReport(0, 1, "exit code 1", gone), protocol.ExitReport(1, -9, "SIGKILL"), 1),
        (protocol.ExitReport(1, 1, "exit code 1", real), protocol.ExitReport(0, 1, "exit code 1", gone), 1),
        (protocol.ExitReport(0, 1, "exit code 1", gone), protocol.ExitReport(1, 1, "exit code 1", gone), 0),
        # stopped by the verdict's abort: its own exception still names the cause; without
        # one, it is only the abort's work
        (protocol.ExitReport(0, 1, "exit code 1", gone), protocol.ExitReport(1, 1, "exit code 1", real, aborted=True), 1),
        (protocol.ExitReport(0, 1, "exit code 1", gone), protocol.ExitReport(1, -15, "SIGTERM", aborted=True), 0),
    ):  # fmt: skip
        job = JobState(2, lambda _: None, lambda: HorovodRunnerError("lost"))
        a, b = _FakeTask(), _FakeTask()
        job.handle(a, first)
        job.handle(b, second)
        assert job.failed_report is not None and job.failed_report.rank == cause, (first, second)


def test_tensorflow_cuda_probing_lines_are_noise_only_without_a_gpu():
    from hvdrunner._noise import CHATTER, CPU_NOISE, noisy

    assert noisy(
        "E0000 00:00:17 cuda_executor.cc:1228] failed call to cuInit: UNKNOWN ERROR (303)",
        CPU_NOISE,
    )
    assert noisy("I0000 cudart_stub.cc:31] Could not find cuda drivers on your machine", CPU_NOISE)
    assert not noisy("Epoch 1/10 - loss: 0.31", CPU_NOISE)
    assert not noisy("ValueError: column 'x' has 3 null rows", CPU_NOISE)
    assert noisy(
        "2026/12/01 11:18:42 INFO alembic.runtime.migration: Context impl SQLiteImpl.", CHATTER
    )
    assert not noisy("2026/12/01 11:18:42 WARNING mlflow.models: model signature mismatch", CHATTER)


def test_hosts_with_different_horovod_builds_fail_the_job_before_any_rank_starts():
    from hvdrunner._launch.driver.job import JobState

    assigned: list = []
    job = JobState(3, assigned.append, lambda: None)
    for i, (host, build) in enumerate([("node-a", "0.28.1 (hvdrunner gloo patch)"),
                                       ("node-a", "0.28.1 (hvdrunner gloo patch)"),
                                       ("node-b", "0.28.1 (no hvdrunner patch)")]):  # fmt: skip
        job.handle(_FakeTask(), protocol.Register(i, host, hostname=host, horovod=build))
    assert assigned == [] and not job.assigned  # no rank got its environment
    message = str(job.failure)
    assert "different horovod builds" in message
    assert "0.28.1 (no hvdrunner patch): node-b" in message and "same horovod wheel" in message


def test_the_stores_port_is_below_the_ephemeral_range_and_free():
    """An outgoing connection is never given it while rank 0 imports (CI: EADDRINUSE)."""
    low = task._ephemeral_low()
    assert low > task.BELOW_EPHEMERAL + 1024  # Linux's default: 32768
    for _ in range(20):
        port = task.free_port()
        assert low - task.BELOW_EPHEMERAL <= port < low
        with socket.socket() as s:
            s.bind(("", port))  # free when it was handed out


def test_a_port_something_listens_on_is_never_the_stores(monkeypatch):
    with socket.socket() as held, socket.socket() as other:
        held.bind(("", 0))
        held.listen()
        other.bind(("", 0))
        taken, free = held.getsockname()[1], other.getsockname()[1]
        other.close()
        low = max(taken, free) + 1 + task.BELOW_EPHEMERAL
        monkeypatch.setattr(task, "_ephemeral_low", lambda: low)
        monkeypatch.setattr(random, "sample", lambda ports, k: [taken, free])  # in this order
        assert task.free_port() == free


def test_where_the_ephemeral_range_starts_too_low_the_kernel_picks(tmp_path, monkeypatch):
    ports = tmp_path / "ip_local_port_range"
    ports.write_text("2000\t60999\n")
    monkeypatch.setattr(task, "EPHEMERAL_RANGE", str(ports))
    monkeypatch.setattr(random, "sample", lambda *a: pytest.fail("drew below 2000"))
    assert task._ephemeral_low() == 2000
    assert 0 < task.free_port() < 65536
