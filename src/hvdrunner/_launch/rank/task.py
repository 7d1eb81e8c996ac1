"""What one launch slot does (a Spark barrier task, or a driver thread for ``np < 0``).

Connect to the driver, register, receive the Horovod environment, add this host's network
interface and GPUs, then hand over to :class:`RankSupervisor`.
"""

from __future__ import annotations

import ipaddress
import os
import random
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from hvdrunner import _horovod_knobs, multihost
from hvdrunner._launch import assignments, protocol
from hvdrunner._launch.limits import DEFAULTS, JobLimits
from hvdrunner._launch.rank.supervisor import NO_GPU_ENV, RankSupervisor
from hvdrunner._launch.rank.worker import LIBRARY_DIRS_ENV, RANK_SETUP_ENV, RANK_TEARDOWN_ENV
from hvdrunner.distributed import cuda_visible_devices, host_gpus


@dataclass(frozen=True)
class TaskSpec:
    """Everything a launch slot needs; picklable and free of any Spark object."""

    driver_addr: str
    driver_port: int
    key: bytes
    payload: bytes
    forward_output: bool
    spread_host_gpus: bool
    pythonpath: tuple[str, ...] = ()
    limits: JobLimits = DEFAULTS  # host_timeout: the driver silent this long is gone
    # What the caller knows of frameworks, handed down: output markers never relayed
    # (without a GPU, ``quiet_without_gpu`` too), and "module:function" hooks each rank
    # calls before the user's function.
    quiet: tuple[str, ...] = ()
    quiet_without_gpu: tuple[str, ...] = ()
    rank_setup: tuple[str, ...] = ()
    rank_teardown: tuple[str, ...] = ()  # after the user's function returned
    library_dirs: tuple[str, ...] = ()  # where a stalled rank counts as inside a library

    def __repr__(self) -> str:  # the key never appears in logs or tracebacks
        return f"TaskSpec(driver={self.driver_addr}:{self.driver_port}, payload={len(self.payload)} bytes)"


def interface_for(address: str) -> str:
    """The local network interface that owns ``address`` (an IP or a host name).

    Raises:
        RuntimeError: when no local interface carries that address.
    """
    ip = ipaddress.ip_address(socket.gethostbyname(address))
    nics = psutil.net_if_addrs()
    for name, addrs in nics.items():
        for a in addrs:
            if a.family == socket.AF_INET and ipaddress.ip_address(a.address) == ip:
                return name
    if ip.is_loopback:  # 127.0.1.1 and friends live on the loopback device
        for name, addrs in nics.items():
            if any(a.family == socket.AF_INET and a.address.startswith("127.") for a in addrs):
                return name
    raise RuntimeError(
        f"No local network interface carries {address} ({ip}), the address Spark reports "
        f"for this task. Set SPARK_LOCAL_IP on the executors to an address of a local "
        f"interface."
    )


def local_ip_towards(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (no packet is sent: UDP connect)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return str(s.getsockname()[0])


#: Where the kernel takes the local ports of outgoing connections (Linux).
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
#: How many ports below that range a store's port is drawn from.
BELOW_EPHEMERAL = 12_000


def free_port(tries: int = 64) -> int:
    """A TCP port free on this host now, for rank 0's store (MASTER_PORT), released at once.

    Rank 0 binds it only after its imports, seconds later. A port of the kernel's own pick
    (``bind(("", 0))``, as TorchDistributor does) lies in the ephemeral range, where in those
    seconds any outgoing connection on this host may be given it: a restarted job's rank 0
    found its store's port taken that way (EADDRINUSE) on a busy CI machine. So the port is
    drawn at random from the ``BELOW_EPHEMERAL`` ports under that range, which no connection
    is given, and checked free; the kernel's pick where the range starts too low for that.

    >>> 0 < free_port() < 65536
    True
    """
    low = _ephemeral_low()
    if low - BELOW_EPHEMERAL >= 1024:
        for port in random.sample(range(low - BELOW_EPHEMERAL, low), tries):
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the ephemeral range, or 0 where it cannot be read."""
    try:
        with open(EPHEMERAL_RANGE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _rank_env(
    spec: TaskSpec, assigned: dict[str, str], address: str, ip: str, task_gpus: Sequence[str]
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(assigned)
    env.update(_horovod_knobs.rank_defaults(env))  # what the user left unset
    # The interface that reaches the driver (``ip``) is the one the ranks reach each other
    # on. Spark's task address is only a fallback: it can be the connection's source
    # (127.0.0.1) for executors of a standalone cluster.
    try:
        iface = interface_for(ip)
    except (OSError, RuntimeError):
        ip, iface = address, interface_for(address)
    # Before the rank exists: an unpatched horovod on a host whose name resolves to
    # loopback would abort every rank in hvd.init() (SIGABRT) once peers are elsewhere.
    multihost.check_host(int(assigned.get(protocol.NUM_HOSTS_ENV, "1")), cluster_ip=ip, iface=iface)
    env["HOROVOD_GLOO_IFACE"] = iface
    env["NCCL_SOCKET_IFNAME"] = iface
    env.setdefault("GLOO_SOCKET_IFNAME", iface)  # torch.distributed's gloo (the engine)
    gpus = cuda_visible_devices(
        task_gpus,
        int(assigned["HOROVOD_LOCAL_RANK"]),
        int(assigned["HOROVOD_LOCAL_SIZE"]),
        host_gpus() if spec.spread_host_gpus and not task_gpus else [],
    )
    if gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpus
    if not gpus and not host_gpus():
        env[NO_GPU_ENV] = "1"  # no GPU for this rank: GPU-probing lines are not news
    for name, values in ((RANK_SETUP_ENV, spec.rank_setup),
                         (RANK_TEARDOWN_ENV, spec.rank_teardown),
                         (LIBRARY_DIRS_ENV, spec.library_dirs)):  # fmt: skip
        if values:
            env[name] = ",".join(values)
    # Let the child import the driver's local modules when they exist here (local mode).
    extra = [p for p in spec.pythonpath if p and os.path.isdir(p)]
    if extra:
        env["PYTHONPATH"] = os.pathsep.join([p for p in [env.get("PYTHONPATH", "")] if p] + extra)
    return env


def run_slot(spec: TaskSpec, partition: int, address: str, task_gpus: Sequence[str]) -> int:
    """Register with the driver, then supervise this slot's rank; returns its exit code.

    ``address`` is this task's address as Spark reports it (it picks the network interface);
    the host itself is identified from inside the task, as Horovod on Spark does (hostname
    + kernel namespaces): Spark may report one address (the connection's source, e.g.
    127.0.0.1) for tasks on different workers.
    """
    host = assignments.host_id()
    try:
        channel = protocol.connect(spec.driver_addr, spec.driver_port, spec.key)
    except OSError as exc:
        raise RuntimeError(
            f"this task (host {socket.gethostname()}) cannot reach the driver service at "
            f"{spec.driver_addr}:{spec.driver_port} ({exc}): the ranks connect back to the "
            f"process that called HorovodRunner.run(). Classic Spark: set spark.driver.host to "
            f"an address the workers reach. Spark Connect: run the notebook on the cluster, or "
            f"set HVDRUNNER_DRIVER_ADDRESS to an address of that process the workers reach."
        ) from exc
    try:  # this host's address towards the driver: names it, and picks its interface
        ip = local_ip_towards(spec.driver_addr, spec.driver_port)
    except OSError:
        ip = address
    stopped = threading.Event()
    threading.Thread(target=protocol.beat_forever, args=(channel.send, stopped),
                     name="hvdrunner-beat", daemon=True).start()  # fmt: skip
    try:
        # hostname and ip name this host in errors (a lost host, a broken one).
        channel.send(protocol.Register(partition, host, address, socket.gethostname(), ip,
                                       multihost.horovod_build(), free_port()))  # fmt: skip
        message = protocol.expect(channel.recv(), protocol.TO_TASK, "the driver")
        while isinstance(message, protocol.Beat):
            message = protocol.expect(channel.recv(), protocol.TO_TASK, "the driver")
        if not isinstance(message, protocol.Assign):
            return 0  # aborted before the ranks were assigned
        assigned = message.env
        rank = int(assigned["HOROVOD_RANK"])
        try:
            env = _rank_env(spec, assigned, address, ip, task_gpus)
        except Exception as exc:  # noqa: BLE001 - reported to the driver as this rank's failure
            channel.send(protocol.ExitReport(rank, 1, "setup failed", protocol.error_report(exc)))
            return 1
        supervisor = RankSupervisor(
            channel, rank, env, spec.payload, spec.forward_output, spec.limits.host_timeout,
            quiet=spec.quiet, quiet_without_gpu=spec.quiet_without_gpu, commit=message.commit,
        )  # fmt: skip
        return supervisor.run()
    finally:
        stopped.set()
        channel.close()
