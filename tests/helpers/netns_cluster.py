"""A real multi-host Spark standalone cluster on one machine, for tests and benchmarks.

Each host is a Linux network namespace with its own veth interface, address, hostname
(``unshare --uts``) and ``/etc/hosts`` (``ip netns exec`` bind-mounts
``/etc/netns/<ns>/hosts``), running one Spark standalone worker; the master and the driver
stay in this namespace on a bridge. Two name modes:

- ``resolving``: each host's name resolves to its own cluster address (a well-set cluster);
- ``loopback``: each host's name resolves to 127.0.1.1, as Debian's installer and
  cloud-init's Debian/Ubuntu template write it (the case that breaks unpatched horovod).

Optional link shaping per host (``tc tbf`` rate, ``tc netem`` delay) for benchmarks. Everything it
creates (namespaces, links, /etc/netns entries, processes in the namespaces, the work dir)
is removed by :meth:`NetnsCluster.stop`, at interpreter exit, on SIGTERM, and by
:func:`sweep` for the leftovers of a run that was SIGKILLed (its owner pid is in every name).

    with NetnsCluster(hosts=2, mode="loopback") as cluster:
        spark = local_session(cluster.master_url, **cluster.driver_conf())
        ...
        cluster.kill_host(1)        # the machine dies: every process in it, SIGKILL
        cluster.restart_worker(1)   # it comes back

Needs root and iproute2; :func:`unavailable` says why not where they are missing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

MODES = ("resolving", "loopback")
_NAME = re.compile(r"^hvt(\d+)(?:h\d+|br|v\d+|p\d+)$")
_ETC_NETNS = Path("/etc/netns")


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=30)


def unavailable() -> str | None:
    """Why network-namespace hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs {tool} (iproute2 / util-linux)"
    probe = f"hvt{os.getpid()}h99"
    made = sh("ip", "netns", "add", probe, check=False)
    sh("ip", "netns", "del", probe, check=False)
    return None if made.returncode == 0 else f"ip netns add refused: {made.stderr.strip()}"


def _die_with_parent() -> None:
    """preexec_fn: SIGKILL this child when its owner dies, even by SIGKILL (Linux)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(ns: str) -> None:
    pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def sweep(owner: int | None = None) -> list[str]:
    """Remove the namespaces, links and /etc/netns entries of dead owners (or of ``owner``).

    Returns what it removed. Safe to call any time: a live owner's cluster is left alone.
    """

    def doomed(name: str) -> bool:
        m = _NAME.match(name)
        return bool(m) and (int(m.group(1)) == owner if owner else not _alive(int(m.group(1))))

    removed = []
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        if doomed(ns):
            _kill_namespace_processes(ns)
            sh("ip", "netns", "del", ns, check=False)
            removed.append(ns)
    for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if doomed(name):
            sh("ip", "link", "del", name, check=False)
            removed.append(name)
    if _ETC_NETNS.is_dir():
        for entry in _ETC_NETNS.iterdir():
            if doomed(entry.name):
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(str(entry))
    for work in Path(tempfile.gettempdir()).glob("hvd-netns-*-*"):  # the clusters' folders
        pid = work.name.split("-")[2]
        if pid.isdigit() and (int(pid) == owner if owner else not _alive(int(pid))):
            shutil.rmtree(work, ignore_errors=True)
            removed.append(str(work))
    return removed


@dataclass(frozen=True)
class Shape:
    """Link shaping for every host's link, both directions: rate with ``tc tbf``, delay
    with ``tc netem`` (a kernel without sch_netem, as this VM's, refuses delay loudly)."""

    delay_ms: float | None = None
    rate_mbit: float | None = None

    def qdisc(self) -> list[str]:
        if self.delay_ms:
            netem = ["netem", "delay", f"{self.delay_ms}ms"]
            return netem + (["rate", f"{self.rate_mbit}mbit"] if self.rate_mbit else [])
        if self.rate_mbit:
            # burst: 4 ms at the rate (a burst below rate/HZ caps the rate itself)
            burst = max(64 * 1024, int(self.rate_mbit * 1e6 / 8 * 0.004))
            return ["tbf", "rate", f"{self.rate_mbit}mbit", "burst", str(burst), "latency", "20ms"]
        return []


@dataclass
class Host:
    index: int
    ns: str
    name: str  # its hostname
    addr: str
    outer: str  # veth end on the bridge (this namespace)
    inner: str  # veth end inside the host
    worker: subprocess.Popen[bytes] | None = field(default=None, repr=False)


class NetnsCluster:
    """N hosts (network namespaces), one Spark standalone worker each; see the module doc."""

    def __init__(
        self,
        hosts: int = 2,
        mode: str = "resolving",
        cores: int = 2,
        memory: str = "2g",
        shape: Shape | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        pid = os.getpid()
        self.prefix = f"hvt{pid}"
        self.mode = mode
        self.cores = cores
        self.memory = memory
        self.shape = shape
        net = pid % 200 + 20  # a per-owner /24 inside 10.231.0.0/16
        self.master_ip = f"10.231.{net}.1"
        self.bridge = f"{self.prefix}br"
        self.hosts = [
            Host(
                i,
                f"{self.prefix}h{i}",
                f"{self.prefix}-h{i}",
                f"10.231.{net}.{i + 2}",
                f"{self.prefix}v{i}",
                f"{self.prefix}p{i}",
            )  # fmt: skip
            for i in range(hosts)
        ]
        # named for its owner, as the namespaces are, so that a sweep finds a dead owner's
        self.work = tempfile.mkdtemp(prefix=f"hvd-netns-{os.getpid()}-")
        self.master_url = ""
        self._master: subprocess.Popen[bytes] | None = None
        self._stopped = False

    # -- lifecycle -----------------------------------------------------------------------
    def __enter__(self) -> NetnsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> NetnsCluster:
        sweep()  # leftovers of SIGKILLed runs
        atexit.register(self.stop)
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            # SIGTERM (a CI timeout, a cancelled job) must still run stop().
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            self._make_network()
            self._start_master()
            for host in self.hosts:
                self.start_worker(host.index)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for host in self.hosts:
            _kill_namespace_processes(host.ns)
            if host.worker is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    host.worker.wait(timeout=10)
        if self._master is not None:
            self._master.terminate()
            try:
                self._master.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._master.kill()
        sweep(owner=os.getpid())
        shutil.rmtree(self.work, ignore_errors=True)

    # -- network -------------------------------------------------------------------------
    def _hosts_file(self, host: Host) -> str:
        lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost"]
        own = "127.0.1.1" if self.mode == "loopback" else host.addr
        lines.append(f"{own} {host.name}")
        lines += [f"{h.addr} {h.name}" for h in self.hosts if h is not host]
        return "\n".join(lines) + "\n"

    def _make_network(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.master_ip}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for h in self.hosts:
            etc = _ETC_NETNS / h.ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(self._hosts_file(h))
            sh("ip", "netns", "add", h.ns)
            sh("ip", "link", "add", h.outer, "type", "veth", "peer", "name", h.inner)
            sh("ip", "link", "set", h.inner, "netns", h.ns)
            sh("ip", "link", "set", h.outer, "master", self.bridge)
            sh("ip", "link", "set", h.outer, "up")
            self.in_host(h.index, "ip", "addr", "add", f"{h.addr}/24", "dev", h.inner)
            self.in_host(h.index, "ip", "link", "set", h.inner, "up")
            self.in_host(h.index, "ip", "link", "set", "lo", "up")
            qdisc = self.shape.qdisc() if self.shape is not None else []
            if qdisc:
                sh("tc", "qdisc", "add", "dev", h.outer, "root", *qdisc)
                self.in_host(h.index, "tc", "qdisc", "add", "dev", h.inner, "root", *qdisc)

    def in_host(self, i: int, *cmd: str) -> subprocess.CompletedProcess[str]:
        return sh("ip", "netns", "exec", self.hosts[i].ns, *cmd)

    # -- Spark ---------------------------------------------------------------------------
    @staticmethod
    def spark_class() -> str:
        import pyspark

        return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")

    def _free_port(self) -> int:
        with socket.socket() as s:
            s.bind((self.master_ip, 0))
            return int(s.getsockname()[1])

    def _start_master(self) -> None:
        env = dict(os.environ, SPARK_LOCAL_IP=self.master_ip, SPARK_LOG_DIR=self.work)
        port, ui = self._free_port(), self._free_port()
        log = open(os.path.join(self.work, "master.log"), "ab")  # noqa: SIM115 - lives with the process
        self._master = subprocess.Popen(
            [self.spark_class(), "org.apache.spark.deploy.master.Master", "--host",
             self.master_ip, "--port", str(port), "--webui-port", str(ui)],
            env=env, stdout=log, stderr=log, preexec_fn=_die_with_parent)  # fmt: skip
        _wait_for_port(self.master_ip, port)
        self.master_url = f"spark://{self.master_ip}:{port}"

    def start_worker(self, i: int) -> None:
        """Start host ``i``'s worker (under its own hostname), e.g. after :meth:`kill_host`."""
        h = self.hosts[i]
        wdir = os.path.join(self.work, f"worker{i}")
        os.makedirs(wdir, exist_ok=True)
        env = dict(os.environ, SPARK_LOCAL_IP=h.addr, SPARK_WORKER_DIR=wdir, SPARK_LOG_DIR=wdir)
        log = open(os.path.join(self.work, f"worker{i}.log"), "ab")  # noqa: SIM115
        # One pid all the way: ip netns exec -> unshare -> sh -> spark-class -> java. The
        # host's own /dev/shm, as two machines have (ip netns exec gives the worker a mount
        # namespace of its own): shared memory one host makes is not another's.
        h.worker = subprocess.Popen(
            ["ip", "netns", "exec", h.ns, "unshare", "--uts", "--", "sh", "-c",
             'hostname "$0" && mount -t tmpfs -o size=512m hvdrunner-shm /dev/shm && exec "$@"',
             h.name, self.spark_class(),
             "org.apache.spark.deploy.worker.Worker", "--host", h.addr, "--cores",
             str(self.cores), "--memory", self.memory, "--webui-port", "0", self.master_url],
            env=env, stdout=log, stderr=log, preexec_fn=_die_with_parent)  # fmt: skip

    def driver_conf(self, executor_memory: str = "1g") -> dict[str, str]:
        """Spark conf for a driver in this namespace using every host's cores."""
        return {
            "spark.driver.host": self.master_ip,
            "spark.driver.bindAddress": self.master_ip,
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * len(self.hosts)),
            "spark.executor.memory": executor_memory,
            "spark.executorEnv.PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }

    def wait_for_executors(self, sc: object, n: int | None = None, timeout: float = 120) -> None:
        """Block until ``n`` (default: one per host) executors registered with ``sc``."""
        want = len(self.hosts) if n is None else n
        deadline = time.monotonic() + timeout
        while self._executors(sc) < want:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{want} executors did not register in {timeout:g}s")
            time.sleep(0.5)

    @staticmethod
    def _executors(sc: object) -> int:
        """Executors registered now; -1 after a py4j network error (once seen in CI between
        scenarios, the JVM alive: py4j answers a broken connection with a bare error, and
        the next call opens a new one), reported so that a recurring one shows in the log."""
        from py4j.protocol import Py4JError

        try:
            jsc = sc._jsc.sc()  # type: ignore[attr-defined]
            return int(jsc.getExecutorMemoryStatus().size()) - 1  # minus the driver
        except Py4JError as exc:
            print(f"wait_for_executors: {exc!r}; asking again", flush=True)
            return -1

    # -- faults --------------------------------------------------------------------------
    def pids(self, i: int) -> list[int]:
        """Every process running in host ``i``."""
        return [int(p) for p in sh("ip", "netns", "pids", self.hosts[i].ns).stdout.split()]

    def kill_host(self, i: int) -> None:
        """Host ``i`` dies: SIGKILL every process in it (worker, executor, ranks)."""
        _kill_namespace_processes(self.hosts[i].ns)
        worker = self.hosts[i].worker
        if worker is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.wait(timeout=10)

    def cut_link(self, i: int) -> None:
        """Host ``i`` drops off the network (its processes keep running)."""
        sh("ip", "link", "set", self.hosts[i].outer, "down")

    def restore_link(self, i: int) -> None:
        sh("ip", "link", "set", self.hosts[i].outer, "up")

    def hide_path(self, i: int, path: str) -> None:
        """From now on host ``i`` sees an empty ``path`` (e.g. a share not mounted there)."""
        worker = self.hosts[i].worker
        assert worker is not None, "hide_path needs the host's worker running"
        sh("nsenter", f"--target={worker.pid}", "--mount", "mount", "-t", "tmpfs", "tmpfs", path)


def _wait_for_port(ip: str, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex((ip, port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"nothing listens on {ip}:{port} after {timeout}s")
