"""A real Spark standalone cluster whose two workers are two "hosts": each worker runs in
its own Linux network namespace with its own interface and address on a test bridge (the
master and the driver stay in this namespace). Runs HorovodRunner(np=4) on it and prints one
JSON line with what every rank was given (host grouping, interface). It stops before
hvd.init(): gloo's own connections between namespaces failed here (a peer advertised
127.0.0.1), an open item. Needs root and `ip`; exits 3 (skip) where namespaces
cannot be made. Everything it creates is removed at exit.

    python tests/helpers/netns_cluster.py
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PREFIX = f"hvt{os.getpid() % 10000}"
BRIDGE = f"{PREFIX}br"
SUBNET = "10.231.{n}.{h}"
NET = os.getpid() % 200 + 20  # a per-run /24 inside 10.231.0.0/16: parallel runs never clash
MASTER_IP = SUBNET.format(n=NET, h=1)
HOSTS = [SUBNET.format(n=NET, h=h) for h in (2, 3)]
_procs: list[subprocess.Popen[bytes]] = []


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=30)


def teardown() -> None:
    for p in _procs:
        p.terminate()
    for p in _procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
    for i in range(len(HOSTS)):
        subprocess.run(["ip", "netns", "del", f"{PREFIX}h{i}"], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{PREFIX}v{i}"], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def make_network() -> None:
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{MASTER_IP}/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for i, addr in enumerate(HOSTS):
        ns, outer, inner = f"{PREFIX}h{i}", f"{PREFIX}v{i}", f"{PREFIX}p{i}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", ns)
        sh("ip", "link", "set", outer, "master", BRIDGE)
        sh("ip", "link", "set", outer, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", inner)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((MASTER_IP, 0))
        return int(s.getsockname()[1])


def spark_class() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def wait_for_port(ip: str, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex((ip, port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"nothing listens on {ip}:{port} after {timeout}s")


def start_cluster(work: str) -> str:
    env = dict(os.environ, SPARK_LOCAL_IP=MASTER_IP, SPARK_LOG_DIR=work)
    port, ui = free_port(), free_port()
    log = open(os.path.join(work, "master.log"), "wb")  # noqa: SIM115 - lives with the process
    _procs.append(subprocess.Popen(
        [spark_class(), "org.apache.spark.deploy.master.Master", "--host", MASTER_IP,
         "--port", str(port), "--webui-port", str(ui)], env=env, stdout=log, stderr=log))  # fmt: skip
    wait_for_port(MASTER_IP, port)
    url = f"spark://{MASTER_IP}:{port}"
    for i, addr in enumerate(HOSTS):
        wdir = os.path.join(work, f"worker{i}")
        os.makedirs(wdir)
        wenv = dict(env, SPARK_LOCAL_IP=addr, SPARK_WORKER_DIR=wdir)
        wlog = open(os.path.join(work, f"worker{i}.log"), "wb")  # noqa: SIM115
        _procs.append(subprocess.Popen(
            ["ip", "netns", "exec", f"{PREFIX}h{i}", spark_class(),
             "org.apache.spark.deploy.worker.Worker", "--host", addr, "--cores", "2",
             "--memory", "2g", "--webui-port", "0", url], env=wenv, stdout=wlog, stderr=wlog))  # fmt: skip
    return url


def report(out_dir: str) -> None:
    """What this rank was given: Horovod's host grouping and the network interface."""
    keys = ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
            "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME", "HOROVOD_GLOO_IFACE")  # fmt: skip
    seen = {k: os.environ.get(k) for k in keys}
    seen["netns"] = os.readlink("/proc/self/ns/net")
    with open(os.path.join(out_dir, f"rank-{seen['HOROVOD_RANK']}.json"), "w") as f:
        json.dump(seen, f)


def main() -> int:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("SKIP needs root and iproute2 (ip) to make network namespaces")
        return 3
    atexit.register(teardown)
    try:
        make_network()
    except subprocess.CalledProcessError as exc:
        print(f"SKIP network namespaces not permitted here: {exc.stderr.decode().strip()}")
        return 3
    work = tempfile.mkdtemp(prefix="hvd-netns-")
    url = start_cluster(work)
    from hvdrunner import HorovodRunner
    from hvdrunner.spark import local_session

    spark = local_session(url, app_name="hvdrunner-netns", **{
        "spark.driver.host": MASTER_IP, "spark.driver.bindAddress": MASTER_IP,
        "spark.executor.cores": "2", "spark.cores.max": "4", "spark.executor.memory": "1g",
        "spark.executorEnv.PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    })  # fmt: skip
    deadline = time.monotonic() + 120
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 3:  # 2 + driver
        if time.monotonic() > deadline:
            raise RuntimeError("the two workers' executors did not register in 120 s")
        time.sleep(1)
    out = os.path.join(work, "ranks")
    os.makedirs(out)
    HorovodRunner(np=4, start_timeout=120).run(report, out_dir=out)
    ranks = [json.loads(Path(out, n).read_text()) for n in sorted(os.listdir(out))]
    print("RESULT " + json.dumps({"ranks": ranks, "prefix": PREFIX}), flush=True)
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
