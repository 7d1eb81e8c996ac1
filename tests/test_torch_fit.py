"""hvdrunner.torch.fit on real ranks: accuracy and MLflow, exact data-parallel equivalence,
gradient-exchange knobs, averaged metrics, equal steps on uneven partitions, resume after a
SIGKILL, the sync check and errors before launch. CPU only here (no GPU)."""

from __future__ import annotations

import functools
import os
import signal

import mlflow
import numpy as np
import pandas as pd
import pytest

from conftest import rank_processes
from helpers import digits as digit_data
from helpers.docblocks import block
from hvdrunner import HorovodRunner, HorovodRunnerError
from hvdrunner.data import prepare

pytestmark = [pytest.mark.torch, pytest.mark.background]  # no time bound (tests/conftest.py)


def _fit():  # imported lazily: collection must not need torch on the TF stacks
    from hvdrunner.torch import fit

    return fit


def run_fit(**kwargs):
    return _fit()(**kwargs)


@pytest.fixture(scope="module")
def digits(spark, tmp_path_factory):
    return digit_data.prepared_split(spark, str(tmp_path_factory.mktemp("digits")))


def build_mlp():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def build_linear():
    import torch

    return torch.nn.Linear(4, 1)


def rank_metric(out, y):
    """Each rank's own rank number: its average over 2 ranks is 0.5, never 0 or 1."""
    import torch

    return torch.tensor(float(os.environ["HOROVOD_RANK"]))


@pytest.mark.stacks("19", "15.4", "16.4", "17.3", "18")  # every replica: a runtime's smoke test
@pytest.mark.timeout(300)
def test_two_rank_fit_reaches_accuracy_and_mlflow_agrees(digits, store, tmp_path, spark):
    import torch

    data, x_test, y_test = digits
    with mlflow.start_run() as run:
        result = HorovodRunner(np=2).run(
            run_fit, build_model=build_mlp, data=data, validation=data, epochs=8, batch_size=32,
            loss="cross_entropy", metrics=["accuracy", rank_metric], warmup_epochs=1,
            registered_model_name="hvdrunner-torch-digits",
        )  # fmt: skip
    assert result.num_ranks == 2 and len(result.history["loss"]) == 8
    # Averaged over ranks before anything sees them: history and MLflow alike.
    assert result.history["rank_metric"] == [0.5] * 8
    assert result.history["val_rank_metric"] == [0.5] * 8
    client = mlflow.MlflowClient()
    for key in ("loss", "val_loss", "rank_metric", "accuracy"):
        logged = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        np.testing.assert_allclose([m.value for m in logged], result.history[key], rtol=1e-6)
    model = mlflow.pytorch.load_model(result.model_uri)
    with torch.no_grad():
        pred = model(torch.tensor(x_test)).argmax(dim=1).numpy()
    assert float((pred == y_test).mean()) > 0.9  # held-out digits
    from helpers.pyfunc_probe import predict_without_horovod

    assert predict_without_horovod(mlflow.get_tracking_uri(), result.model_uri,
                                   x_test[:20].tolist()) == pred[:20].tolist()  # fmt: skip
    versions = client.search_model_versions("name='hvdrunner-torch-digits'")
    assert [v.run_id for v in versions] == [run.info.run_id]
    # docs/cluster.md's registration recipe as written (an alias, then the model and a Spark
    # UDF by models:/<name>@<alias>); the local registry's name in place of Unity Catalog's.
    code = block("cluster.md", "alias-and-score").replace(
        "ml.digits.classifier", "hvdrunner-torch-digits"
    )
    scope: dict = {"__name__": "docs_example", "spark": spark}
    exec(compile(code, "docs/cluster.md", "exec"), scope)  # noqa: S102 - the doc under test
    scored = np.asarray(scope["model"].predict(x_test[:20])).argmax(axis=1)
    assert scored.tolist() == pred[:20].tolist() and callable(scope["predict"])
    params = mlflow.get_run(run.info.run_id).data.params
    assert params["num_ranks"] == "2" and params["scaled_learning_rate"] == "0.002"
    assert params["loss"] == "cross_entropy" and params["torch"] == torch.__version__


def _linear(spark, tmp_path, idx, name, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1).astype("float32")
    frame = pd.DataFrame({"x": x[idx].tolist(), "y": y[idx]})
    data = prepare(spark.createDataFrame(frame), features="x", label="y",
                   cache_dir=str(tmp_path / name))  # fmt: skip
    return data, x, y


def _final_weights(ckpt: str, epochs: int) -> list[np.ndarray]:
    import torch

    state = torch.load(os.path.join(ckpt, f"epoch-{epochs:05d}", "model.pt"))
    return [state["weight"].numpy(), state["bias"].numpy()]


LINEAR = dict(build_model=build_linear, loss="mse", optimizer="sgd", shuffle=False,
              log_model=False, verbose=0)  # fmt: skip


@pytest.mark.timeout(300)
def test_two_ranks_of_batch_b_equal_one_rank_of_batch_2b(spark, tmp_path):
    b, half = 16, 128
    # np=2 reads rows [0,128) and [128,256) in order; step k of np=1 (batch 2b) must hold
    # the same 2b rows: block k of each half, interleaved.
    order = np.concatenate([np.r_[k * b : (k + 1) * b, half + k * b : half + (k + 1) * b]
                            for k in range(half // b)])  # fmt: skip
    two, _, _ = _linear(spark, tmp_path, np.arange(256), "two")
    one, _, _ = _linear(spark, tmp_path, order, "one")
    # fit scales the rate by the rank count: both runs step at 0.02.
    HorovodRunner(np=2).run(run_fit, data=two, batch_size=b, learning_rate=0.01, epochs=2,
                            checkpoint_dir=str(tmp_path / "c2"), **LINEAR)  # fmt: skip
    HorovodRunner(np=-1).run(run_fit, data=one, batch_size=2 * b, learning_rate=0.02, epochs=2,
                             checkpoint_dir=str(tmp_path / "c1"), **LINEAR)  # fmt: skip
    w2, w1 = _final_weights(str(tmp_path / "c2"), 2), _final_weights(str(tmp_path / "c1"), 2)
    for a, c in zip(w2, w1, strict=True):
        np.testing.assert_allclose(a, c, atol=1e-5, rtol=0)
    assert not np.allclose(w2[0], build_linear_initial()[0], atol=1e-3)  # it did train


def build_linear_initial() -> list[np.ndarray]:
    """The weights fit starts from: seed 0, then build_model() (rank 0's, broadcast)."""
    import torch

    torch.manual_seed(0)
    m = build_linear()
    return [
        m.weight.detach().numpy().astype("float64").T,
        m.bias.detach().numpy().astype("float64"),
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("compression,atol", [("none", 1e-5), ("fp16", 2e-3)])
def test_backward_passes_per_step_averages_local_batches(spark, tmp_path, compression, atol):
    # 2 ranks, batch 16, backward_passes_per_step=2: one update per 2 batches with the mean
    # gradient of the 64 rows both ranks passed, at the rank-scaled rate; checked against
    # plain numpy SGD. fp16 rounds the exchanged gradients: close, not exact.
    from helpers.sgd_reference import linear_sgd

    data, x, y = _linear(spark, tmp_path, np.arange(256), "d", seed=1)
    ckpt = str(tmp_path / "ckpt")
    HorovodRunner(np=2).run(run_fit, data=data, batch_size=16, backward_passes_per_step=2,
                            compression=compression, learning_rate=0.01, epochs=2,
                            checkpoint_dir=ckpt, **LINEAR)  # fmt: skip
    updates = [np.r_[32 * u : 32 * u + 32, 128 + 32 * u : 128 + 32 * u + 32]
               for u in range(4)] * 2  # fmt: skip
    w, bias = linear_sgd(*build_linear_initial(), x, y, updates, lr=0.01 * 2)
    final = _final_weights(ckpt, 2)
    np.testing.assert_allclose(final[0], w.T, atol=atol, rtol=0)
    np.testing.assert_allclose(final[1], bias, atol=atol, rtol=0)


def count_rows(data, batch_size: int, epochs: int):
    import hvdrunner.hvd_torch as hvd  # hvdrunner.torch's engine
    import hvdrunner.torch as ht

    ht.init()
    feed = ht.batches(data, batch_size, seed=3)
    steps = data.steps_per_epoch(batch_size)
    seen = [next(feed)[1].tolist() for _ in range(steps * epochs)]
    return hvd.allgather_object({"steps": steps, "labels": seen})


@pytest.mark.timeout(240)
def test_uneven_spark_partitions_still_give_every_rank_equal_steps(spark, tmp_path):
    small = spark.createDataFrame(pd.DataFrame({"x": [[0.0]] * 3, "id": range(3)}))
    big = spark.createDataFrame(pd.DataFrame({"x": [[1.0]] * 200, "id": range(3, 203)}))
    df = small.coalesce(1).union(big.repartition(4))  # partitions of 3 and ~50 rows
    data = prepare(df, features="x", label="id", cache_dir=str(tmp_path))
    ranks = HorovodRunner(np=-3).run(count_rows, data=data, batch_size=16, epochs=2)
    assert [r["steps"] for r in ranks] == [5, 5, 5]  # ceil(ceil(203 / 3) / 16)
    assert {len(r["labels"]) for r in ranks} == {10}
    first_epoch = {i for r in ranks for batch in r["labels"][:5] for i in batch}
    assert first_epoch == set(range(203))  # every row, each epoch
    assert ranks[0]["labels"][0] != ranks[0]["labels"][5]  # reshuffled per epoch


class KillRank1InEpoch3:
    """A model that, once (flag file), SIGKILLs rank 1 at epoch 3's first batch: ``build()``'s,
    or by default a small MLP for the digits."""

    def __new__(cls, flag: str, steps: int, build=None):
        import torch

        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.body = build() if build is not None else torch.nn.Sequential(
                    torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))  # fmt: skip
                self.calls = 0

            def forward(self, x):
                if self.training:
                    self.calls += 1
                    if self.calls == 2 * steps + 1 and not os.path.exists(flag):
                        import hvdrunner.hvd_torch as hvd  # fit's engine

                        # Rank 0 gets here only after saving epoch 2's checkpoint.
                        hvd.allreduce(torch.zeros(1), name="before-kill")
                        if hvd.rank() == 1:
                            open(flag, "w").close()
                            os.kill(os.getpid(), signal.SIGKILL)
                return self.body(x)

        return Net()


@pytest.mark.timeout(300)
def test_resume_after_sigkill_continues_at_epoch_3(digits, store, tmp_path):
    data, _, _ = digits
    ckpt = str(tmp_path / "ckpt")
    build = functools.partial(KillRank1InEpoch3, str(tmp_path / "killed"),
                              data.steps_per_epoch(32, 2))  # fmt: skip
    kwargs = dict(build_model=build, data=data, epochs=4, batch_size=32, loss="cross_entropy",
                  metrics=["accuracy"], checkpoint_dir=ckpt, keep_checkpoints=2, log_model=False)  # fmt: skip
    with pytest.raises(HorovodRunnerError) as info, mlflow.start_run() as failed:
        HorovodRunner(np=2).run(run_fit, **kwargs)
    assert info.value.rank == 1 and "SIGKILL" in str(info.value)
    assert mlflow.get_run(failed.info.run_id).info.status == "FAILED"
    assert sorted(os.listdir(ckpt)) == ["epoch-00001", "epoch-00002"]
    with mlflow.start_run(run_id=failed.info.run_id) as run:  # as a retried job task does
        result = HorovodRunner(np=2).run(run_fit, **kwargs)
    assert result.initial_epoch == 2 and len(result.history["loss"]) == 2
    steps = sorted(
        m.step for m in mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")
    )
    assert steps == [0, 1, 2, 3]
    resumed = mlflow.get_run(run.info.run_id)
    assert resumed.info.status == "FINISHED" and resumed.data.tags["hvdrunner.initial_epoch"] == "2"
    assert sorted(os.listdir(ckpt)) == ["epoch-00003", "epoch-00004"]


class DriftOnRank1:
    """A model whose rank 1 nudges its own weights once: the ranks no longer agree."""

    def __new__(cls):
        import torch

        class Net(torch.nn.Linear):
            def forward(self, x):
                if os.environ["HOROVOD_RANK"] == "1" and not getattr(self, "drifted", False):
                    self.drifted = True
                    with torch.no_grad():
                        self.weight.add_(0.5)
                return super().forward(x)

        return Net(4, 1)


@pytest.mark.timeout(240)
def test_ranks_that_drift_apart_fail_after_the_first_epoch(spark, tmp_path):
    data, _, _ = _linear(spark, tmp_path, np.arange(256), "d")
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2).run(run_fit, data=data, batch_size=16, epochs=3,
                                 **(LINEAR | {"build_model": DriftOnRank1}))  # fmt: skip
    assert info.value.exc_type == "RanksOutOfSyncError"
    assert "ranks [1] hold different weights than rank 0" in str(info.value)


def recording_sgd(seen_file: str):
    def make(params, lr):
        import torch

        class Recording(torch.optim.SGD):
            def step(self, closure=None):
                # Real updates only: horovod's broadcast_optimizer_state runs one step with
                # zero gradients to create an empty optimizer's state (it changes no weight).
                grads = [p.grad for g in self.param_groups for p in g["params"]]
                real = any(g is not None and bool(g.abs().sum() > 0) for g in grads)
                if os.environ["HOROVOD_RANK"] == "0" and real:
                    with open(seen_file, "a") as f:
                        f.write(f"{self.param_groups[0]['lr']}\n")
                return super().step(closure)

        return Recording(params, lr)

    return make


@pytest.mark.timeout(240)
def test_warmup_ramps_the_rate_per_batch_and_a_resume_past_it_starts_at_full_rate(digits, tmp_path):
    from hvdrunner.core.schedule import warmup_multiplier

    data, _, _ = digits
    seen = tmp_path / "lr.txt"
    args = dict(build_model=build_mlp, data=data, batch_size=64, learning_rate=0.01,
                warmup_epochs=2, optimizer=recording_sgd(str(seen)), loss="cross_entropy",
                log_model=False, checkpoint_dir=str(tmp_path / "ckpt"))  # fmt: skip
    first = HorovodRunner(np=-2).run(run_fit, epochs=2, **args)
    steps = first.steps_per_epoch
    rates = [float(v) for v in seen.read_text().split()]
    expected = [0.02 * warmup_multiplier(e + b / steps, size=2, warmup_epochs=2)
                for e in range(2) for b in range(steps)]  # fmt: skip
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    assert rates[0] == pytest.approx(0.01)  # 1/size of the scaled rate
    seen.unlink()
    resumed = HorovodRunner(np=-2).run(run_fit, epochs=3, **args)
    assert resumed.initial_epoch == 2
    np.testing.assert_allclose([float(v) for v in seen.read_text().split()], 0.02, rtol=1e-6)


@pytest.mark.parametrize(
    "change,error",
    [
        ({"loss": "hinge"}, "loss='hinge' is not one of"),
        ({"optimizer": "lbfgs"}, "optimizer='lbfgs' is not one of"),
        ({"epochs": 0}, "epochs must be a positive int"),
        ({"compression": "int8"}, "compression must be 'none' or 'fp16'"),
        ({"bucket_cap_mb": -1}, "bucket_cap_mb must be a number >= 0"),
        ({"data": [1, 2]}, "data must be prepared input"),
        ({"bogus": 1}, "unexpected argument(s) ['bogus']"),
    ],
)
def test_bad_arguments_are_refused_before_any_rank_starts(digits, change, error, launches):
    data, _, _ = digits
    kwargs = dict(build_model=build_mlp, data=data, epochs=1, batch_size=32, loss="cross_entropy")
    with pytest.raises((TypeError, ValueError)) as info:
        HorovodRunner(np=2).run(_fit(), **(kwargs | change))
    assert error in str(info.value)
    assert launches == [] and rank_processes() == []  # refused on the driver: nothing launched


def test_unlabelled_data_is_refused_before_launch(spark, tmp_path):
    frame = pd.DataFrame({"x": [[0.0, 1.0]] * 8})
    data = prepare(spark.createDataFrame(frame), features="x", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="data has no label column"):
        HorovodRunner(np=2).run(_fit(), build_model=build_linear, data=data, epochs=1,
                                batch_size=2, loss="mse")  # fmt: skip


def build_sklearn():
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression()


@pytest.mark.timeout(120)
def test_a_model_that_is_not_torch_is_refused_naming_the_alternative(digits):
    data, _, _ = digits
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2).run(run_fit, build_model=build_sklearn, data=data, epochs=1,
                                 batch_size=32, loss="cross_entropy")  # fmt: skip
    assert info.value.exc_type == "TypeError"
    assert "not a torch.nn.Module" in str(info.value) and "Spark MLlib" in str(info.value)


def test_gradients_go_out_in_ddp_like_buckets_each_parameter_once():
    # fit's DistributedOptimizer gets these groups: each a grouped allreduce once all its
    # gradients exist (one request per bucket, not per tensor). Pure: no ranks needed.
    import torch

    from hvdrunner.torch.collectives import buckets

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Linear(512, 512),
                                torch.nn.Linear(512, 10))  # fmt: skip
    model[0].bias.requires_grad_(False)  # frozen: never exchanged
    mb = 2**20
    groups = buckets(model, cap_mb=1.0)  # 512x512 float32 = 1 MB: a bucket of its own
    names = {id(p): n for n, p in model.named_parameters()}
    assert [[names[id(p)] for p in g] for g in groups] == [
        ["2.bias", "2.weight", "1.bias"], ["1.weight"], ["0.weight"],
    ]  # fmt: skip
    for g in groups:
        assert len(g) == 1 or sum(p.numel() * 4 for p in g) <= mb
    assert len(buckets(model)) == 1  # 25 MB, DDP's default: the whole model in one request
    # One size for both: fit's driver-side default (no engine import there) and the lane's.
    from hvdrunner.engine.grouping import BUCKET_BYTES
    from hvdrunner.torch.config import BUCKET_CAP_MB

    assert BUCKET_CAP_MB * mb == BUCKET_BYTES
