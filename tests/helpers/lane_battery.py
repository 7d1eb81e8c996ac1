"""The gradient lane (hvdrunner.engine.lane) on real ranks: run under torchrun by
tests/test_hvd_torch.py. Each training runs twice, the lane on and off (HVDRUNNER_GRADIENT_LANE,
read at init()), from the same seeds: the weights must be equal bit for bit, and the lane
must really have carried the steps. Writes ``rank<r>.json``: check name -> "ok" or the error.

    python -m torch.distributed.run --standalone --nproc-per-node 2 lane_battery.py OUT
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch

import hvdrunner.hvd_torch as hvd
from hvdrunner.engine import settings, state

RESULTS: dict[str, str] = {}


def train(
    options: dict[str, Any], extra_steps: int = 0, steps: int = 6
) -> tuple[torch.Tensor, int, int]:
    """A small MLP trained ``steps`` steps (plus ``extra_steps * rank``), then ``join()``:
    its weights, join's answer and how many steps the lane carried."""
    hvd.init()
    r = hvd.rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), **options)  # fmt: skip
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(10 + r)
    passes = options.get("backward_passes_per_step", 1)
    for _ in range(steps + extra_steps * r):
        opt.zero_grad()
        for _ in range(passes):
            x = torch.randn(8, 6, generator=g)
            torch.nn.functional.cross_entropy(model(x), x[:, :3].argmax(1)).backward()
        opt.step()
    last = hvd.join()
    found = state.current().lane
    carried = found.steps if found is not None and found.layout is not None else 0
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    hvd.shutdown()
    return weights, last, carried


def both_ways(options: dict[str, Any], extra_steps: int = 0) -> tuple[int, int]:
    os.environ[settings.LANE_ENV] = "1"
    on, last_on, carried = train(options, extra_steps)
    os.environ[settings.LANE_ENV] = "0"
    off, last_off, carried_off = train(options, extra_steps)
    os.environ[settings.LANE_ENV] = "1"
    assert carried_off == 0, carried_off
    assert torch.equal(on, off), (options, (on - off).abs().max().item())
    assert last_on == last_off, (last_on, last_off)
    return carried, last_on


def check(name: str, fn: Any) -> None:
    try:
        fn()
        RESULTS[name] = "ok"
    except BaseException as exc:  # noqa: BLE001 - every check reports
        RESULTS[name] = f"{type(exc).__name__}: {exc}"
        hvd.shutdown()  # the next check starts afresh


def main(out: str) -> None:
    r = int(os.environ["RANK"])

    def same_bits(options: dict[str, Any]) -> Any:
        def run() -> None:
            carried, _ = both_ways(options)
            assert carried == 5, carried  # the first step agrees on the buckets

        return run

    check("same bits, default buckets", same_bits({}))
    check("same bits, one group", same_bits({"groups": 1}))
    check("same bits, a group per parameter", same_bits({"groups": 4}))
    check("same bits, two backward passes a step", same_bits({"backward_passes_per_step": 2}))
    check("same bits, predivided average", same_bits({"gradient_predivide_factor": 2.0}))
    check("same bits, sum", same_bits({"op": hvd.Sum}))

    def one_request_per_gradient() -> None:
        """``groups=None`` means Horovod's one request per gradient on the negotiated path
        (the lane, off here, buckets them); ``groups=1`` one request for all four."""
        os.environ[settings.LANE_ENV] = "0"
        try:
            for options, want in (({}, [1, 1, 1, 1]), ({"groups": 1}, [4])):
                hvd.init()
                model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Linear(16, 3))
                opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                               named_parameters=model.named_parameters(),
                                               **options)  # fmt: skip
                model(torch.randn(8, 6)).sum().backward()
                opt.step()
                names = {n for n, _ in model.named_parameters()}
                agreed = state.negotiator_of(0)._cached  # every request the ranks agreed on
                sent = sorted(sig.arguments for name, kind, _, sig in agreed
                              if kind == "allreduce" and name in names)  # fmt: skip
                assert sent == want, (options, sent)
                hvd.shutdown()
        finally:
            os.environ[settings.LANE_ENV] = "1"

    check("groups=None: one request per gradient, as Horovod", one_request_per_gradient)

    def uneven_join() -> None:
        carried, last = both_ways({}, extra_steps=3)  # rank 1 has 3 more batches
        assert last == 1, last
        assert carried == 8, carried  # rank 0 served rank 1's last 3 steps with zeros

    check("uneven join serves zeros on the lane", uneven_join)

    def fp16_stays_negotiated() -> None:
        _, _, carried = train({"compression": hvd.Compression.fp16})
        assert carried == 0, carried

    check("fp16 gradients stay on the negotiated path", fp16_stays_negotiated)

    def different_collectives_are_named() -> None:
        """Rank 0 steps (the lane), rank 1 makes an allreduce rank 0 never makes: both raise,
        naming it, within the deadlock bound (HVDRUNNER_DEADLOCK_S) plus the lane's stall."""
        hvd.init()
        model = torch.nn.Linear(4, 2)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())  # fmt: skip
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
        assert state.current().lane is not None and state.current().lane.layout is not None
        started = time.monotonic()
        try:
            if r == 0:
                opt.zero_grad()
                model(torch.randn(3, 4)).sum().backward()
                opt.step()
            else:
                hvd.allreduce(torch.ones(1), name="metric.only.on.rank1")
            raise AssertionError("no error")
        except RuntimeError as exc:
            assert "metric.only.on.rank1" in str(exc), exc
            assert time.monotonic() - started < 30, time.monotonic() - started
        hvd.shutdown()

    check("different collectives are named, not hung", different_collectives_are_named)
    with open(os.path.join(out, f"rank{r}.json"), "w") as f:
        json.dump(RESULTS, f)


if __name__ == "__main__":
    main(sys.argv[1])
