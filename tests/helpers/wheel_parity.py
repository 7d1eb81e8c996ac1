"""One fixed job, printed as JSON, for comparing two PyTorch engines (tests/test_gpu_wheel.py
runs it on the gpu stack under its CUDA + NCCL horovod wheel and under hvdrunner's engine):
on 2 ranks of a local[2] Spark session, an allreduce of seeded tensors (sum and average),
five steps of Horovod's PyTorch recipe, ``hvdrunner.torch.fit`` and ``hvdrunner.keras.fit``
on Keras 3's PyTorch backend (``KERAS_BACKEND=torch``) for two epochs each - all on CPU
tensors, the paths a GPU wheel also takes for CPU data.

    python tests/helpers/wheel_parity.py CACHE_DIR ENGINE    # ENGINE: horovod or hvdrunner
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np


def _model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    ).double()


def collectives_and_recipe() -> dict[str, Any]:
    import torch

    from hvdrunner.torch.collectives import engine_module

    hvd = engine_module()  # horovod.torch or hvdrunner.engine, as HVDRUNNER_TORCH_ENGINE says
    hvd.init()
    gen = torch.Generator().manual_seed(100 + hvd.rank())
    x = torch.randn(1000, generator=gen, dtype=torch.float64)
    out = {"sum": hvd.allreduce(x, op=hvd.Sum, name="s")[:5].tolist(),
           "avg": hvd.allreduce(x, op=hvd.Average, name="a")[:5].tolist()}  # fmt: skip
    model = _model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())  # fmt: skip
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for step in range(5):
        g = torch.Generator().manual_seed(step * 10 + hvd.rank())
        xb = torch.randn(32, 8, generator=g, dtype=torch.float64)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), xb.sum(dim=1, keepdim=True)).backward()
        opt.step()
    out["recipe"] = [p.detach().flatten()[:6].tolist() for p in model.parameters()]
    return out


def build_linear() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def fit_job(data: Any) -> Any:
    import hvdrunner.torch as ht

    result = ht.fit(build_linear, data, epochs=2, batch_size=16, loss="mse", optimizer="sgd",
                    shuffle=False, log_model=False, verbose=0)  # fmt: skip
    return None if result is None else result.history["loss"]


def build_keras_linear() -> Any:
    import keras

    return keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])


def keras_fit_job(data: Any) -> Any:
    from hvdrunner.keras import fit

    result = fit(build_keras_linear, data, epochs=2, batch_size=16, loss="mse", optimizer="sgd",
                 shuffle=False, log_model=False, verbose=0)  # fmt: skip
    return None if result is None else result.history["loss"]


def main(cache: str, engine: str) -> None:
    import pandas as pd

    from hvdrunner import HorovodRunner
    from hvdrunner.data import prepare
    from hvdrunner.spark import local_session

    # every job below runs on the engine under comparison (HorovodRunner passes the setting)
    os.environ["HVDRUNNER_TORCH_ENGINE"] = engine
    spark = local_session("local[2]", app_name="wheel-parity")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1).astype("float32")
    data = prepare(spark.createDataFrame(pd.DataFrame({"x": x.tolist(), "y": y})),
                   features="x", label="y", cache_dir=cache)  # fmt: skip
    out = HorovodRunner(np=2).run(collectives_and_recipe)
    out["fit_loss"] = HorovodRunner(np=2).run(fit_job, data=data)
    out["keras_fit_loss"] = HorovodRunner(np=2).run(keras_fit_job, data=data)
    spark.stop()
    print("PARITY " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
