"""hvdrunner.hvd_torch (Horovod's PyTorch API on torch.distributed) on real ranks over gloo:
every collective against numpy, Horovod's errors on every rank, process sets, join, the
optimizer's options, SyncBatchNorm and the timeline under torchrun's environment with horovod
uninstalled as far as Python can tell (tests/helpers/no_horovod); HorovodRunner and
hvdrunner.torch without horovod; the docs' recipe; the unchanged recipe under HorovodRunner
bit for bit against the compiled horovod; a dead peer fails the others fast. CPU only here: NCCL is not exercised (no GPU)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.docblocks import block, run_with_last_line
from helpers.engine_jobs import battery, torchrun, without_horovod_env
from hvdrunner import HorovodRunner

pytestmark = pytest.mark.torch

HELPERS = Path(__file__).parent / "helpers"
SRC = Path(__file__).resolve().parents[1] / "src"


def _install_built_wheel(tmp_path: Path) -> Path:
    """hvdrunner as a user's one ``%pip install`` gets it: its wheel built from a copy of the
    tree, installed alone (``--no-deps``: the runtime has torch and pyspark) into a folder."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md"):
        shutil.copy(SRC.parent / name, tree / name)
    shutil.copytree(SRC, tree / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    built = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                            str(tmp_path / "dist"), str(tree)], capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("hvdrunner-*-py3-none-any.whl")
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                          str(site), str(wheel)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    return site


def test_horovods_api_under_torchrun_without_horovod(tmp_path):
    started = time.monotonic()
    for rank, (ran, failed) in battery("engine_battery.py", tmp_path, timeout=300).items():
        assert ran >= 15 and not failed, f"rank {rank}: {failed}"
    assert time.monotonic() - started < 240


@pytest.mark.stacks("19", "15.4")  # 15.4: torch 2.3.1, where a lane step whose peer never
# came deadlocked hvd.shutdown() (engine/keepalive.py joins its workers without the GIL)
def test_the_gradient_lane_gives_the_negotiated_paths_bits(tmp_path):
    """DistributedOptimizer's buckets on the gradient lane (no negotiation round a step):
    the same weights bit for bit as with the lane off, for the optimizer's options and an
    uneven join (the joined rank serves zeros on the lane); float16 gradients stay
    negotiated; a rank that steps while its peer makes another collective gets the deadlock
    verdict naming it, not a hang (tests/helpers/lane_battery.py)."""
    for rank, (ran, failed) in battery("lane_battery.py", tmp_path, timeout=300).items():
        assert ran == 10 and not failed, f"rank {rank}: {failed}"


def _recipe(engine: str) -> tuple[list[float], list, dict[str, str | None]]:
    """Horovod's PyTorch recipe, unchanged but for its import."""
    import importlib

    import torch

    hvd = importlib.import_module(engine)
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * hvd.size(), momentum=0.9,
                          weight_decay=1e-4)  # fmt: skip
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    g = torch.Generator().manual_seed(100 + hvd.rank())
    losses = []
    for _ in range(30):
        x = torch.randn(16, 20, generator=g)
        y = x[:, :3].argmax(dim=1)  # learnable: the largest of the first three features
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(hvd.allreduce(loss.detach(), name="loss").item())
    params = [p.detach().clone() for p in model.parameters()]
    env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    hvd.shutdown()
    return losses, params, env


def _adagrad_through_the_wrapper() -> tuple[bool, bool]:
    """On 2 ranks with the same batch (the average is each rank's own gradient, exactly):
    whether Adagrad trains the same wrapped as alone, and whether a state loaded before
    wrapping is the wrapped optimizer's."""
    import torch

    import hvdrunner.hvd_torch as hvd

    hvd.init()
    x = torch.arange(12.0).view(3, 4) / 10

    def trained(wrap: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.Adagrad(model.parameters(), lr=0.5, initial_accumulator_value=0.25)
        if wrap:
            opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
        for _ in range(2):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
        return model, opt

    (alone, saved), (wrapped, _) = trained(False), trained(True)
    pairs = zip(alone.parameters(), wrapped.parameters(), strict=True)
    same = all(torch.equal(a, b) for a, b in pairs)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.5)
    opt.load_state_dict(saved.state_dict())
    resumed = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    kept = all(torch.equal(resumed.state[p]["sum"], saved.state[q]["sum"])
               for p, q in zip(model.parameters(), alone.parameters(), strict=True))  # fmt: skip
    hvd.shutdown()
    return same, kept


@pytest.mark.stacks("19", "15.4")
def test_an_optimizer_s_own_state_survives_the_wrapper():
    """DistributedOptimizer keeps what the user's optimizer made in its __init__ (Adagrad's
    "sum", which its step() reads: the wrapper made a bare Optimizer's, and the step failed
    with KeyError, found by Horovod's own suite on 15.4) and a state it loaded before."""
    same, kept = HorovodRunner(np=-2).run(_adagrad_through_the_wrapper)
    assert same and kept


@pytest.mark.stacks("gpu")  # the stack that keeps a compiled horovod.torch
def test_the_recipe_on_the_engine_matches_compiled_horovod_bit_for_bit():
    # driver processes (np=-2): the launch is not under test here (the docs' recipe below
    # runs on Spark barrier tasks), the arithmetic is
    import torch

    engine = HorovodRunner(np=-2).run(_recipe, engine="hvdrunner.hvd_torch")
    compiled = HorovodRunner(np=-2).run(_recipe, engine="horovod.torch")
    assert engine[0] == compiled[0]  # every step's averaged loss, exactly
    assert all(torch.equal(a, b) for a, b in zip(engine[1], compiled[1], strict=True))
    assert engine[0][-1] < engine[0][0]  # it trained
    # HorovodRunner gave rank 0 torch's standard environment
    assert engine[2]["RANK"] == "0" and engine[2]["WORLD_SIZE"] == "2"
    assert engine[2]["LOCAL_RANK"] == "0" and engine[2]["MASTER_ADDR"]


def test_the_docs_recipe_runs_as_written(spark):
    # docs/pytorch.md's one-changed-import recipe, executed verbatim on 2 barrier tasks.
    last, loss = run_with_last_line(block("pytorch.md", "one-import"), "pytorch.md")
    assert last == "HorovodRunner(np=2).run(train)"
    assert 0 < loss < 1.0  # ln 3 = 1.10 untrained


NO_HOROVOD_JOB = """
import json, sys
from hvdrunner import HorovodRunner

def train():
    import sys, torch
    import hvdrunner.torch as ht
    device = ht.init(seed=0)
    model = torch.nn.Linear(4, 2)
    opt = ht.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    ht.broadcast_state(model, opt)
    for _ in range(5):
        x = torch.randn(8, 4)
        loss = torch.nn.functional.cross_entropy(model(x), x[:, 0].gt(0).long())
        opt.zero_grad(); loss.backward(); opt.step()
    ht.check_in_sync(model)
    import hvdrunner
    return {"loss": ht.average_metrics({"loss": loss.item()})["loss"],
            "rank_has_horovod": any(m.startswith("horovod") for m in sys.modules),
            "rank_hvdrunner": hvdrunner.__file__}

import hvdrunner
out = HorovodRunner(np=-2).run(train)
out["driver_has_horovod"] = any(m.startswith("horovod") for m in sys.modules)
out["driver_hvdrunner"] = hvdrunner.__file__
print("RESULT " + json.dumps(out))
"""


def test_hvdrunners_wheel_alone_runs_a_pytorch_job_without_horovod(tmp_path):
    # docs/install.md's one-%pip path: hvdrunner's built wheel, nothing compiled beside it;
    # horovod neither importable nor in the package metadata, for the driver and the ranks
    site = _install_built_wheel(tmp_path)
    script = tmp_path / "job.py"
    script.write_text(NO_HOROVOD_JOB)
    proc = subprocess.run([sys.executable, str(script)], env=without_horovod_env(site),
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(lines[0][len("RESULT ") :])
    assert out["loss"] > 0 and not out["rank_has_horovod"] and not out["driver_has_horovod"]
    # the installed wheel ran, not the source tree
    assert out["driver_hvdrunner"].startswith(str(site)), out["driver_hvdrunner"]
    assert out["rank_hvdrunner"].startswith(str(site)), out["rank_hvdrunner"]


_STEP = "opt.zero_grad(); model(torch.randn(3, 4)).sum().backward(); opt.step()"


@pytest.mark.parametrize("action", ["hvd.allreduce(torch.ones(1))", _STEP],
                         ids=["collective", "optimizer step on the gradient lane"])  # fmt: skip
def test_a_dead_peer_fails_the_others_fast(tmp_path, action):
    """Rank 1 dies without a word; rank 0's next collective (or optimizer step, whose
    buckets took the gradient lane after the first steps) raises HorovodInternalError
    naming the cause, within a bound, and its process ends."""
    script = tmp_path / "die.py"
    script.write_text(
        "import os, sys, time, torch\n"
        "import hvdrunner.hvd_torch as hvd\n"
        "hvd.init()\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))\n"
        "for _ in range(3):\n"
        f"    {_STEP}\n"
        "from hvdrunner.engine import state\n"
        "assert state.current().lane.layout is not None\n"
        "pids = hvd.allgather_object(os.getpid())\n"
        "if hvd.rank() == 1:\n"
        "    os._exit(3)\n"
        # Dead, not dying: rank 0 acts as soon as rank 1 has exited (gone, or a zombie until
        # torchrun reaps it), well before torchrun's monitor would stop the job.
        "def alive(pid):\n"
        "    try:\n"
        "        return ' Z' not in open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1][:3]\n"
        "    except OSError:\n"
        "        return False\n"
        "while alive(pids[1]):\n"
        "    time.sleep(0.01)\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        f"    {action}\n"
        "except hvd.HorovodInternalError as e:\n"
        "    print('RAISED', round(time.monotonic() - t0, 1), e, flush=True)\n"
        "    os._exit(0)\n"
        "os._exit(5)\n"
    )  # fmt: skip
    proc = torchrun("--max-restarts", "0", "--monitor-interval", "5", str(script), timeout=120)
    out = proc.stdout + proc.stderr
    assert "RAISED" in out, out[-3000:]
    line = next(ln for ln in out.splitlines() if "RAISED" in ln)
    assert float(line.split()[1]) < 30, line
    assert "peer" in line or "shut down" in line, line


@pytest.mark.stacks("19", "gpu")
def test_cuda_tensors_go_over_nccl_where_torch_has_it(monkeypatch):
    """No GPU here: only CUDA's presence is faked (it cannot exist on this machine); whether
    torch has NCCL is torch's own answer - yes on the gpu stack's CUDA build, no on the CPU
    wheel. The engine's data group then takes CPU tensors over gloo, CUDA ones over NCCL."""
    import torch
    import torch.distributed as dist

    from hvdrunner.engine import world

    if os.environ.get("STACK") == "gpu":
        assert dist.is_nccl_available()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    expected = "cpu:gloo,cuda:nccl" if dist.is_nccl_available() else "gloo"
    assert world.data_backend() == expected
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert world.data_backend() == "gloo"
