"""The petastorm recipes of docs/petastorm.md, run as written: real Spark, real Horovod ranks
over gloo. On lts the Keras recipe also runs with real petastorm (only its import line
swapped) and both reach the same accuracy; on torch the PyTorch recipe is compared with the
standard Horovod PyTorch recipe on the same rows in memory (no stack has torch and petastorm)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.digits import recipe_frames
from helpers.docblocks import block, run_as_notebook
from hvdrunner import HorovodRunner

DROP_IN = "from hvdrunner.petastorm.spark import"
# Equal accuracy, within what reruns move it (different initial weights and shuffles; the
# recipe validates on 320 of the 360 rows). The PyTorch recipe against the standard feed is
# held to it both ways. Against real petastorm the drop-in is held to "no worse": six
# interleaved reruns on 15.4 spread over 0.959-0.969 with the drop-in and 0.953-0.978 with
# petastorm 0.12.1 (benchmarks/results/petastorm_recipes-15.4.json), and one CI run had real
# petastorm at 0.919 against the drop-in's 0.972 - petastorm's own spread, which is not
# hvdrunner's to bound. A drop-in that feeds ranks wrongly learns less, and that still fails.
SAME = 0.04


def run_recipe(source: str, spark, cache_url: str) -> float:
    """Execute a recipe as a notebook would (module ``__main__``); its ``val_accuracy``."""
    _, (df_train, df_val) = recipe_frames(spark)
    namespace = run_as_notebook(source, "petastorm.md", spark=spark, df_train=df_train,
                                df_val=df_val, cache_url=cache_url)  # fmt: skip
    return float(namespace["val_accuracy"])  # type: ignore[arg-type]


@pytest.mark.keras
@pytest.mark.stacks("18")
@pytest.mark.timeout(300)
def test_the_keras_recipe_runs_with_one_changed_import_under_keras_3(spark, tmp_path):
    source = block("petastorm.md", "keras")
    assert DROP_IN in source and "import hvdrunner.hvd_keras as hvd" in source
    assert run_recipe(source, spark, f"file://{tmp_path}/cache") > 0.9


@pytest.mark.keras
@pytest.mark.stacks("15.4")
@pytest.mark.timeout(480)
def test_the_keras_recipe_matches_real_petastorm_on_keras_2(spark, tmp_path):
    source = block("petastorm.md", "keras")
    ours = run_recipe(source, spark, f"file://{tmp_path}/ours")
    real = source.replace(DROP_IN, "from petastorm.spark import")
    theirs = run_recipe(real, spark, f"file://{tmp_path}/theirs")
    assert theirs > 0.9 and ours > 0.9
    assert ours >= theirs - SAME, (ours, theirs)


def standard_recipe(x_train, y_train, x_val, y_val, batch_size=32, epochs=6, lr=0.002):
    """The same model and loop as the doc's PyTorch recipe, fed the standard Horovod
    way (TensorDataset + DistributedSampler): the reference accuracy."""
    import torch

    import hvdrunner.hvd_torch as hvd

    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=lr * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    dataset = torch.utils.data.TensorDataset(torch.tensor(x_train), torch.tensor(y_train))
    sampler = torch.utils.data.distributed.DistributedSampler(
        dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=0)  # fmt: skip
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb.long()).backward()
            optimizer.step()
    with torch.no_grad():
        pred = model(torch.tensor(x_val)).argmax(1).numpy()
    return float((pred == y_val).mean())


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_the_torch_recipe_runs_with_one_changed_import_and_matches_the_standard_feed(
    spark, tmp_path
):
    source = block("petastorm.md", "torch")
    assert DROP_IN in source and "import hvdrunner.hvd_torch as hvd" in source
    ours = run_recipe(source, spark, f"file://{tmp_path}/cache")
    (train, val), _ = recipe_frames(spark)
    reference = HorovodRunner(np=2).run(
        standard_recipe,
        x_train=np.array(train.pixels.tolist(), dtype="float32"), y_train=train.label.to_numpy(),
        x_val=np.array(val.pixels.tolist(), dtype="float32"), y_val=val.label.to_numpy(),
    )  # fmt: skip
    assert reference > 0.9 and ours > 0.9
    assert abs(ours - reference) <= SAME, (ours, reference)
