"""``hvd.init()`` after ``hvd.shutdown()``, many times (an elastic reset, Horovod's own test
suite, code that re-initialises): no rank dies in ``hvd.init()``.

The cause it guards against (hvdrunner/_launch/driver/rendezvous.py,
patches/horovod-0.28.1-rendezvous-scopes.patch): horovod 0.28.1's rendezvous server cleared
every scope's finished-rank list when one scope finished, so a scope could keep the previous
init's addresses and the next init connected to a closed port (SIGABRT). The scope rule is
checked first over real HTTP, for HorovodRunner's server and for the installed horovod's
(what horovodrun serves); then real ranks re-initialise 40 times under both launchers, with
the idle-wait patch's wait active and inactive."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from hvdrunner import HorovodRunner

CYCLES = 40


def _request(port: int, method: str, path: str, body: bytes | None = None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.parametrize("server", ["hvdrunner", "horovodrun"])
def test_a_finished_scope_forgets_only_itself(server):
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousServer

    from hvdrunner._launch.driver import rendezvous

    plan = get_host_assignments([HostInfo("h", 2)], 2)  # global(2), local_h(2), cross_0/1(1)
    if server == "hvdrunner":
        srv, port = rendezvous.start(plan)
    else:  # the installed horovod's own handler, as horovodrun serves it
        srv = RendezvousServer()
        port = srv.start(RendezvousHandler)
        srv.init(plan)
    try:
        for rank in (0, 1):
            assert _request(port, "PUT", f"global/rank_{rank}", b"old address") == 200
        # The order that lost the global scope's clearing: rank 0 finishes global, then its
        # one-rank cross scope (complete at once), then rank 1 finishes global.
        assert _request(port, "DELETE", "global/0") == 200
        assert _request(port, "DELETE", "cross_0/0") == 200
        assert _request(port, "DELETE", "global/1") == 200
        # The next init must not read the old addresses.
        assert _request(port, "GET", "global/rank_0") == 404
        assert _request(port, "GET", "global/rank_1") == 404
    finally:
        rendezvous.stop(srv)


def init_shutdown_cycles(cycles: int) -> list[float]:
    import horovod.torch as hvd
    import torch

    sums = []
    for _ in range(cycles):
        hvd.init()
        sums.append(float(hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)[0]))
        hvd.barrier()
        hvd.shutdown()
    return sums


_SCRIPT = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_reinit import init_shutdown_cycles
assert init_shutdown_cycles({CYCLES}) == [3.0] * {CYCLES}
"""


@pytest.mark.torch
@pytest.mark.stacks("gpu")  # horovod's own re-init (the engine's: tests/test_hvd_torch.py)
@pytest.mark.timeout(300)
@pytest.mark.parametrize("idle_wait", ["0", "20"], ids=["idle-wait-off", "idle-wait-20ms"])
@pytest.mark.parametrize("launcher", ["HorovodRunner", "horovodrun"])
def test_horovod_reinitialises_many_times(monkeypatch, tmp_path, launcher, idle_wait):
    monkeypatch.setenv("HOROVOD_IDLE_WAIT_MS", idle_wait)
    if launcher == "HorovodRunner":
        assert HorovodRunner(np=-2).run(init_shutdown_cycles, cycles=CYCLES) == [3.0] * CYCLES
        return
    script = tmp_path / "cycles.py"
    script.write_text(_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "horovod.runner.launch", "--gloo", "-np", "2", "-H", "localhost:2",
         sys.executable, str(script)],
        capture_output=True, text=True, timeout=280, env={**os.environ},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
