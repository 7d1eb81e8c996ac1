"""Pure pieces of the launcher: GPU assignment, interface lookup, handshake, exit wording."""

from __future__ import annotations

import signal

import pytest

from hvdrunner._launch import protocol
from hvdrunner._launch.driver import DriverService
from hvdrunner._launch.supervisor import describe_exit
from hvdrunner._launch.task import TaskSpec, interface_for
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
