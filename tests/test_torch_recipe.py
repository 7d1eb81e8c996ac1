"""Horovod's PyTorch recipe under HorovodRunner (Spark barrier tasks and driver processes) and
its faults, on both PyTorch engines: ``import hvdrunner.hvd_torch as hvd`` on 19
(no horovod installed there), the unchanged ``import horovod.torch as hvd`` on the gpu stack,
the one that keeps a compiled horovod - with that build's facts (the horovod hvdrunner builds
for torch >= 2.1: patches/horovod-0.28.1-torch-cxx17.patch, the idle-wait patch). Real ranks
over gloo. No GPU here: device pinning runs its CPU branch."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers.docblocks import block
from hvdrunner import HorovodRunner, HorovodRunnerError

pytestmark = pytest.mark.torch
ROOT = Path(__file__).resolve().parents[1]
ENGINE = "hvdrunner.hvd_torch"  # 19's: what `python -m hvdrunner migrate` writes
#: The compiled horovod.torch, unchanged code: the gpu stack keeps it.
COMPILED = pytest.param("horovod.torch", marks=pytest.mark.stacks("gpu"), id="compiled")
BOTH = [pytest.param(ENGINE, id="engine"), COMPILED]


def standard_recipe(ckpt: str, batch: int, rows: np.ndarray, targets: np.ndarray, epochs: int,
                    base_lr: float = 0.01, engine: str = ENGINE):  # fmt: skip
    """The recipe from Horovod's docs, as a user brings it (``import <engine> as hvd``):
    nothing else of hvdrunner."""
    import importlib

    import torch

    hvd = importlib.import_module(engine)

    hvd.init()
    torch.set_num_threads(1)
    torch.manual_seed(100 + hvd.rank())  # different initial weights: the broadcast must fix it
    x, y = torch.tensor(rows), torch.tensor(targets)
    dataset = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)  # fmt: skip
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=base_lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    initial = [p.detach().clone().numpy().tolist() for p in model.parameters()]
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb.reshape(-1, 1)).backward()
            optimizer.step()
    if hvd.rank() == 0:
        torch.save(model.state_dict(), ckpt)
    final = [p.detach().numpy().tolist() for p in model.parameters()]
    return {"initial": initial, "every_rank": hvd.allgather_object(final),
            "idle_wait_ms": os.environ.get("HOROVOD_IDLE_WAIT_MS")}  # fmt: skip


def linear_data(n: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1).astype("float32")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("np_", [2, -2], ids=["spark-barrier", "driver-processes"])
@pytest.mark.parametrize("engine", BOTH)
def test_the_standard_recipe_runs_and_keeps_ranks_identical(spark, tmp_path, np_, engine):
    import torch

    x, y = linear_data()
    ckpt = str(tmp_path / "model.pt")
    out = HorovodRunner(np=np_).run(standard_recipe, ckpt=ckpt, batch=16, rows=x, targets=y,
                                    epochs=2, engine=engine)  # fmt: skip
    rank0, rank1 = out["every_rank"]
    for a, b in zip(rank0, rank1, strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))  # bit-identical on both ranks
    assert not np.allclose(np.array(rank0[0]), np.array(out["initial"][0]), atol=1e-3)
    saved = torch.load(ckpt)  # rank 0's checkpoint holds those weights
    np.testing.assert_array_equal(saved["weight"].numpy(), np.array(rank0[0]))
    # HorovodRunner's default for the ranks of a horovod with the idle-wait patch (the
    # builder test asserts the gpu stack's has it): the recipe ran, unchanged, with it.
    if engine == "horovod.torch":
        assert out["idle_wait_ms"] == "20"


@pytest.mark.timeout(240)
def test_the_recipe_on_two_ranks_of_batch_b_equals_one_rank_of_batch_2b(tmp_path):
    # DistributedSampler(shuffle=False) gives rank r rows r, r+2, r+4, ...: the 2b rows of
    # step k on two ranks are rows [2bk, 2b(k+1)) - one rank's step k with batch 2b.
    x, y = linear_data()
    two = HorovodRunner(np=-2).run(standard_recipe, ckpt=str(tmp_path / "a.pt"), batch=16,
                                   rows=x, targets=y, epochs=2)  # fmt: skip
    one = HorovodRunner(np=-1).run(standard_recipe, ckpt=str(tmp_path / "b.pt"), batch=32,
                                   rows=x, targets=y, epochs=2, base_lr=0.02)  # fmt: skip
    # Same initial weights (rank 0's seed) and lr 0.02 in both (0.01 x 2 ranks; 0.02 x 1).
    np.testing.assert_array_equal(np.array(two["initial"][0]), np.array(one["initial"][0]))
    for a, b in zip(two["every_rank"][0], one["every_rank"][0], strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5, rtol=0)


def raise_in_backward_on_rank1(engine: str) -> None:
    import importlib

    import torch

    hvd = importlib.import_module(engine)

    class Boom(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise FloatingPointError("gradient exploded on rank 1")

    hvd.init()
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())  # fmt: skip
    for _ in range(10_000):  # rank 0 waits in allreduce for rank 1's gradients: forever
        opt.zero_grad()
        out = model(torch.ones(2, 4))
        if hvd.rank() == 1:
            out = Boom.apply(out)
        out.sum().backward()
        opt.step()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", BOTH)
def test_a_rank_raising_in_backward_ends_the_job_fast_naming_it(spark, engine):
    start = time.monotonic()
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=2).run(raise_in_backward_on_rank1, engine=engine)
    elapsed = time.monotonic() - start
    err = info.value
    assert err.rank == 1 and err.exc_type == "FloatingPointError"
    assert str(err).startswith("Rank 1 failed with FloatingPointError: gradient exploded on rank 1")
    assert "backward" in err.remote_traceback
    assert elapsed < 60, f"the job took {elapsed:.0f} s to fail"  # rank 0 was stuck in allreduce


@pytest.mark.stacks("gpu")
def test_doctor_reports_torch_and_horovods_torch_extension():
    proc = subprocess.run([sys.executable, "-m", "hvdrunner", "doctor"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The installed distribution's version, as doctor reads it (a CUDA wheel's
    # torch.__version__ adds "+cu130", which its metadata does not).
    version = importlib.metadata.version("torch")
    assert f"[x] horovod built with PyTorch: yes (torch {version})" in proc.stdout
    assert "[-] horovod built with TensorFlow: no (tensorflow not installed)" in proc.stdout
    assert f"[x] torch: {version}" in proc.stdout


@pytest.mark.stacks("gpu")
def test_the_builder_keys_and_checks_the_torch_build(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "HVDRUNNER_WHEEL_CACHE": str(tmp_path),
           "HVDRUNNER_HOROVOD_GPU": "nccl"}  # fmt: skip
    builder = ROOT / "scripts" / "install_horovod.sh"
    key = subprocess.run(["bash", str(builder), "--print-key"], capture_output=True, text=True,
                         env=env, timeout=120, check=True).stdout.strip()  # fmt: skip
    py = f"py{sys.version_info[0]}{sys.version_info[1]}"
    version = importlib.metadata.version("torch").replace("+", "")
    assert key.startswith(f"horovod-0.28.1-torch{version}-{py}-cuda")
    assert "-torchcxx17-" in key and "-tf" not in key  # the torch patch is in the key
    assert "-idlewait-" in key  # and the idle-wait patch (torch builds)
    check = subprocess.run(["bash", str(builder)], capture_output=True, text=True, env=env,
                           timeout=300)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "already installed with PyTorch, gloo and hvdrunner's patches" in check.stdout
    assert importlib.util.find_spec("horovod._hvdrunner_torch_cxx17") is not None
    from horovod._hvdrunner_idle_wait import VERSION

    assert VERSION >= 2  # single tensors gather for a cycle: HorovodRunner's default is for it


def idle_then_collectives(idle_s: float) -> dict:
    """Ranks that idle at different times, then meet: with HOROVOD_IDLE_WAIT_MS the loop
    of an idle rank sleeps until its own request; every collective must still pair up."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    r = hvd.rank()
    out = {}
    for i in range(3):  # rank 1 idles before each round; rank 0 waits inside the collective
        if r == 1:
            time.sleep(idle_s)
        t = time.monotonic()
        out[f"sum{i}"] = float(hvd.allreduce(torch.tensor([r + 1.0]), op=hvd.Sum, name=f"s{i}"))
        grouped = hvd.grouped_allreduce([torch.full((3,), r + 1.0), torch.ones(5) * r],
                                        op=hvd.Average, name=f"g{i}")  # fmt: skip
        out[f"grouped{i}"] = [g.tolist() for g in grouped]
        out[f"waited{i}"] = time.monotonic() - t
    out["idle_wait_ms"] = os.environ.get("HOROVOD_IDLE_WAIT_MS")
    return out


@pytest.mark.timeout(120)
@pytest.mark.stacks("gpu")
def test_collectives_pair_up_across_idle_ranks_with_the_idle_wait_patch(monkeypatch):
    # patches/horovod-0.28.1-idle-wait.patch: an idle rank's background loop waits for an
    # enqueue (up to N ms) instead of a round per 1 ms cycle; a group's round starts at
    # once, a single tensor's one cycle later. Rank 1 idles 0.3 s each time, longer than
    # the wait: the rounds must still pair up, in order, with exact results. The user's own
    # value (here 25) is what the ranks get, not HorovodRunner's default (20).
    monkeypatch.setenv("HOROVOD_IDLE_WAIT_MS", "25")
    t = time.monotonic()
    out = HorovodRunner(np=-2).run(idle_then_collectives, idle_s=0.3)
    assert out["idle_wait_ms"] == "25"
    for i in range(3):
        assert out[f"sum{i}"] == 3.0
        assert out[f"grouped{i}"] == [[1.5] * 3, [0.5] * 5]
        assert out[f"waited{i}"] > 0.2  # rank 0 did wait for rank 1, inside the collective
    assert time.monotonic() - t < 60


@pytest.mark.timeout(240)
def test_the_docs_pieces_example_runs_as_written(spark, tmp_path):
    # docs/pytorch.md's `hvdrunner.torch` loop, executed verbatim (only its last line's
    # `data` and `build_model` come from here), on 2 Spark barrier tasks.
    import pandas as pd
    import torch

    from hvdrunner.data import prepare

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype("float32")
    frame = pd.DataFrame({"x": x.tolist(), "label": (x[:, 0] > 0).astype("int64")})
    data = prepare(spark.createDataFrame(frame), features="x", label="label",
                   cache_dir=str(tmp_path))  # fmt: skip
    code = block("pytorch.md", "fit-loop")
    namespace = {"__name__": "docs_example", "data": data,
                 "build_model": lambda: torch.nn.Linear(8, 2)}  # fmt: skip
    body, last = code.rstrip().rsplit("\n", 1)
    exec(compile(body, "docs/pytorch.md", "exec"), namespace)  # noqa: S102 - the doc under test
    assert last.startswith("HorovodRunner(np=2).run(train")
    logs = eval(compile(last, "docs/pytorch.md", "eval"), namespace)  # noqa: S307
    assert set(logs) == {"loss"} and 0 < logs["loss"] < 0.7  # ln 2 = 0.69 at the start


def neutral_helpers_job(path: str, engine: str) -> dict:
    """Every framework-neutral helper of hvdrunner (its top level and hvdrunner.distributed)
    under ``import <engine> as hvd``: rank facts, rank-0-only work, rank 0 first, logging to
    the driver, shutdown - and which TensorFlow modules that imported."""
    import importlib
    import sys
    import time

    hvd = importlib.import_module(engine)

    from hvdrunner import distributed, is_rank0, log_to_driver, on_rank0, rank0_first

    hvd.init()
    facts = (distributed.rank(), distributed.size(), distributed.local_rank(), is_rank0())
    assert facts == (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.rank() == 0), facts
    with rank0_first():
        if hvd.rank() == 0:
            time.sleep(1.0)  # rank 1 would get in first if it did not wait
        with open(path, "a") as f:
            f.write(f"{hvd.rank()}\n")
    only_rank0 = on_rank0(lambda: hvd.rank())()
    log_to_driver(f"rank {hvd.rank()} used every helper")
    distributed.shutdown()
    return {"only_rank0": only_rank0, "initialized_after": hvd.is_initialized(),
            "tf": sorted(m for m in ("tensorflow", "horovod.tensorflow") if m in sys.modules)}  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize("engine", BOTH)
def test_every_framework_neutral_helper_works_in_a_torch_job_without_tensorflow(
    spark, tmp_path, engine
):
    order = tmp_path / "order"
    out = HorovodRunner(np=2).run(neutral_helpers_job, path=str(order), engine=engine)
    assert order.read_text().split() == ["0", "1"]  # rank0_first
    assert out["only_rank0"] == 0 and out["initialized_after"] is False  # on_rank0, shutdown
    assert out["tf"] == []  # a torch job on a runtime without TensorFlow works
