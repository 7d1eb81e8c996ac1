"""What a durable Horovod elastic commit costs (torch stack, 2 ranks on the driver).

``state.commit()`` of ``hvd.elastic.TorchState`` under HorovodRunner, which also sends the
committed state to the driver (src/hvdrunner/_launch/commits.py), against horovod's own
commit (``save()`` + ``check_host_updates()``, what ``commit()`` is without hvdrunner),
interleaved rep by rep in the same ranks, for a small MLP (784-256-10) and a 25 M-parameter
model (ResNet-50's size) with SGD momentum:

- ``commit_ms``: how long the training loop waits in ``commit()`` (the user's cost), which
  returns once the commit is in a file on local disk and its supervisor (another process,
  which sends it on to the driver) has the path.

Results in benchmarks/results/elastic_commit-torch.json.

    .venv-19/bin/python benchmarks/elastic_commit.py [--reps 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from _bench import context, save

RESULTS = Path(__file__).parent / "results" / "elastic_commit-torch.json"
MODELS = {"mlp_784_256_10": [784, 256, 10], "wide_25m": [2048] * 7}


def measure(layers: list[int], reps: int) -> dict:
    import horovod.torch as hvd
    import torch

    hvd.init()
    mods: list[torch.nn.Module] = []
    for a, b in zip(layers, layers[1:], strict=False):
        mods += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods[:-1])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    model(torch.randn(8, layers[0])).sum().backward()
    optimizer.step()  # momentum buffers exist: the optimizer state is as large as the model
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    stock, durable = [], []
    for rep in range(reps):
        state.batch = rep
        t0 = time.perf_counter()
        state.save()  # horovod's commit() without hvdrunner
        state.check_host_updates()
        stock.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        state.commit()
        durable.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    return {
        "params": params,
        "state_mb": round(2 * params * 4 / 2**20, 1),
        "stock_commit_ms": round(1000 * statistics.median(stock), 2),
        "commit_ms": round(1000 * statistics.median(durable), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    from hvdrunner import HorovodRunner

    results = {}
    for name, layers in MODELS.items():
        results[name] = HorovodRunner(np=-2).run(measure, layers=layers, reps=args.reps)
    save(RESULTS, {**context(), "reps": args.reps, "ranks": 2, "models": results})


if __name__ == "__main__":
    main()
