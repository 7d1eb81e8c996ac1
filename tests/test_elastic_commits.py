"""Unchanged Horovod elastic code (``@hvd.elastic.run`` with ``hvd.elastic.TorchState``)
under ``HorovodRunner(max_restarts=N)``: a rank killed mid-epoch, and the restarted job
resumes from the last ``state.commit()`` (model, optimizer, ``epoch``/``batch``), calls the
reset callbacks as Horovod does after a failure, and ends with the undisturbed job's weights.
Real gloo ranks; float64 so that "the same" means the same."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from hvdrunner import HorovodRunner

pytestmark = [pytest.mark.torch, pytest.mark.background]  # no time bound (tests/conftest.py)


def elastic_recipe(marks: str, die_at: tuple[int, int] | None, engine: str, epochs: int = 3,
                   batches: int = 8) -> dict:  # fmt: skip
    """Horovod's elastic PyTorch recipe, as its docs write it (the batch counter committed
    after the step it counts), with ``import <engine> as hvd``."""
    import importlib

    import torch

    hvd = importlib.import_module(engine)

    from hvdrunner.distributed import attempt

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02 * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    starts: list[tuple[int, int]] = []

    def on_reset() -> None:
        Path(marks, f"reset-attempt{attempt()}-rank{hvd.rank()}").touch()

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        starts.append((state.epoch, state.batch))
        for state.epoch in range(state.epoch, epochs):  # noqa: B020 - Horovod's own idiom
            while state.batch < batches:
                if attempt() == 1 and (state.epoch, state.batch) == die_at and hvd.rank() == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                g = torch.Generator().manual_seed(
                    1000 * state.epoch + 10 * state.batch + hvd.rank()
                )
                x = torch.randn(16, 4, generator=g, dtype=torch.float64)
                y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x).squeeze(1), y).backward()
                optimizer.step()
                state.batch += 1
                if state.batch % 2 == 0:
                    state.commit()
            state.batch = 0
            state.commit()

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    state.register_reset_callbacks([on_reset])
    train(state)
    return {"weights": [p.detach().numpy().tolist() for p in model.parameters()],
            "start": starts[0], "attempt": attempt()}  # fmt: skip


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", [
    "hvdrunner.hvd_torch",  # 19: hvdrunner's engine
    pytest.param("horovod.torch", marks=pytest.mark.stacks("gpu"))])  # the compiled horovod  # fmt: skip
def test_elastic_code_resumes_from_its_last_commit_after_a_killed_rank(tmp_path, engine):
    (tmp_path / "undisturbed").mkdir()
    (tmp_path / "killed").mkdir()
    reference = HorovodRunner(np=-2).run(elastic_recipe, marks=str(tmp_path / "undisturbed"),
                                         die_at=None, engine=engine)  # fmt: skip
    got = HorovodRunner(np=-2, max_restarts=1).run(
        elastic_recipe, marks=str(tmp_path / "killed"), die_at=(1, 5), engine=engine
    )
    assert reference["attempt"] == 1 and tuple(reference["start"]) == (0, 0)
    assert got["attempt"] == 2
    # Killed before batch 5 of epoch 1: the last commit was after batch 4 (batch counter 4).
    assert tuple(got["start"]) == (1, 4)
    for mine, theirs in zip(got["weights"], reference["weights"], strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-12)
    # Horovod's reset callbacks ran once on each rank of the resumed attempt, and never in
    # an attempt that started fresh.
    assert sorted(p.name for p in (tmp_path / "killed").iterdir()) == [
        "reset-attempt2-rank0", "reset-attempt2-rank1"]  # fmt: skip
    assert list((tmp_path / "undisturbed").iterdir()) == []
