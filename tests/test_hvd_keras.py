"""hvdrunner's own Horovod Keras layer on real gloo ranks, on whichever Keras this stack has.

- The standard Horovod Keras recipe: unchanged on Keras 2 (lts, and tf_keras mode on 18),
  with the one-line import change (`hvdrunner.hvd_keras`) on Keras 3. Ranks end with
  identical weights that differ from the initial ones.
- Exact data-parallel equivalence of `hvd_keras.DistributedOptimizer`: np=2 x batch b equals
  np=1 x batch 2b (plain SGD, no shuffle) to 1e-5.
- No silent divergence: under Keras 3 `import horovod.tensorflow.keras` in a rank fails fast
  naming the fix; the weight-sync check fails a job whose ranks drifted apart.
- The tests marked ``keras_torch`` run again on 19, where Keras 3 trains on
  PyTorch (``horovod.torch``) and TensorFlow is not installed: the same recipes, asserts and
  tolerances. Their rank code reaches the framework through ``hvdrunner.keras.backend``.
"""

from __future__ import annotations

import importlib
import time

import numpy as np
import pytest

from hvdrunner import HorovodRunner, HorovodRunnerError
from hvdrunner.keras import backend, compat

# Mode-specific (Horovod's Keras layer and the guard / model saving / checkpoint files):
# also in tf_keras mode (make test-tf-keras).
pytestmark = [pytest.mark.keras, pytest.mark.keras_mode]

MODE = compat.mode()
# The one changed line of the migration, and only where Keras 3 needs it.
RECIPE_MODULE = "hvdrunner.hvd_keras" if MODE == "keras3" else "horovod.tensorflow.keras"


def keras_recipe(hvd_module: str, distributed: bool) -> dict:
    """The standard Horovod Keras recipe (hvd.init, pin GPU, scale LR, DistributedOptimizer,
    BroadcastGlobalVariablesCallback(0), MetricAverageCallback()); every rank's weights."""
    hvd = importlib.import_module(hvd_module)
    hvd.init()
    hvd_core, keras = backend.horovod(), compat.keras_module()
    if not backend.is_torch():
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if gpus:
            tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    rng = np.random.default_rng(100 + hvd.rank())  # each rank its own data
    x = rng.normal(size=(256, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 3.0, 0.5]) + hvd.rank()).astype("float32")
    keras.utils.set_random_seed(1 + hvd.rank())  # different init: the broadcast must fix it
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    root_initial = hvd_core.broadcast_object([w.tolist() for w in model.get_weights()], 0)
    opt = keras.optimizers.SGD(0.01 * hvd.size())
    if distributed:
        opt = hvd.DistributedOptimizer(opt)
    model.compile(optimizer=opt, loss="mse")
    model.fit(
        x,
        y,
        batch_size=32,
        epochs=2,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0),
            hvd.callbacks.MetricAverageCallback(),
        ],
        verbose=0,
    )
    return {
        "weights": hvd_core.allgather_object([w.tolist() for w in model.get_weights()]),
        "initial": root_initial,
        "keras": compat.keras_version(),
        "backend": backend.name(),
    }


@pytest.mark.keras_torch
def test_standard_recipe_keeps_ranks_in_sync(spark):
    # in Spark's barrier tasks; the test below runs the recipe in the driver's processes
    out = HorovodRunner(np=2).run(keras_recipe, hvd_module=RECIPE_MODULE, distributed=True)
    weights = out["weights"]
    assert len(weights) == 2
    for a, b in zip(weights[0], weights[1], strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-7)
    assert not np.allclose(np.array(weights[0][0]), np.array(out["initial"][0]))  # it trained
    assert out["keras"].startswith("3" if MODE == "keras3" else "2")
    assert out["backend"] == backend.name()  # the driver's Keras backend, in every rank


@pytest.mark.keras_torch
def test_without_distributed_optimizer_ranks_diverge():
    # Same recipe minus DistributedOptimizer: identical start (broadcast), different data,
    # so ranks must end apart. This is what makes the equality above meaningful.
    out = HorovodRunner(np=-2).run(keras_recipe, hvd_module=RECIPE_MODULE, distributed=False)
    weights = out["weights"]
    assert not np.allclose(np.array(weights[0][0]), np.array(weights[1][0]))
    # the recipe's start in the driver's processes (np<0): this Keras, the driver's backend
    assert out["keras"].startswith("3" if MODE == "keras3" else "2")
    assert out["backend"] == backend.name()
    for a, b in zip(weights[0], out["initial"], strict=True):  # it trained from the broadcast
        assert not np.allclose(np.array(a), np.array(b))


def sgd_steps(batch: int, lr: float) -> list:
    """hvd_keras.DistributedOptimizer on a fixed dataset: rank r takes its half, in order."""
    import hvdrunner.hvd_keras as hvd

    keras = compat.keras_module()
    hvd.init()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1).astype("float32")
    if hvd.size() == 2:
        half = len(x) // 2
        x, y = x[hvd.rank() * half : (hvd.rank() + 1) * half], y[hvd.rank() * half :][:half]
    else:  # one rank, batch 2b: step k holds block k of each half, as the two ranks do
        b = batch // 2
        half = len(x) // 2
        order = np.concatenate(
            [
                np.r_[k * b : (k + 1) * b, half + k * b : half + (k + 1) * b]
                for k in range(half // b)
            ]
        )
        x, y = x[order], y[order]
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr)), loss="mse")
    model.fit(
        x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )  # fmt: skip
    return [w.tolist() for w in model.get_weights()]


@pytest.mark.keras_torch
@pytest.mark.timeout(300)
def test_distributed_optimizer_two_ranks_of_b_equal_one_rank_of_2b():
    # Averaged gradients of two batches of b == the gradient of their union (batch 2b), so
    # with the same learning rate every step, and so the final weights, must agree.
    w2 = HorovodRunner(np=-2).run(sgd_steps, batch=8, lr=0.05)
    w1 = HorovodRunner(np=-1).run(sgd_steps, batch=16, lr=0.05)
    for a, c in zip(w2, w1, strict=True):
        np.testing.assert_allclose(np.array(a), np.array(c), atol=1e-5, rtol=0)
    assert not np.allclose(np.array(w2[0]), 0.0)


def sgd_accumulating(batch: int, lr: float, passes: int, average: bool = False) -> dict:
    """hvd_keras.DistributedOptimizer(backward_passes_per_step=passes), local gradients
    summed (Horovod's default) or averaged (``average_aggregated_gradients=True``): rank r
    trains on rows [64r, 64r+64) in order, 2 epochs."""
    import hvdrunner.hvd_keras as hvd

    keras = compat.keras_module()
    hvd.init()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1).astype("float32")
    mine = slice(64 * hvd.rank(), 64 * hvd.rank() + 64)
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    initial = [w.tolist() for w in model.get_weights()]
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr), backward_passes_per_step=passes,
                                   average_aggregated_gradients=average)  # fmt: skip
    model.compile(optimizer=opt, loss="mse")
    model.fit(
        x[mine], y[mine], batch_size=batch, epochs=2, shuffle=False, verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )  # fmt: skip
    return {
        "initial": hvd.broadcast_object(initial, 0),
        "final": hvd.allgather_object([w.tolist() for w in model.get_weights()]),
        "iterations": int(opt.iterations.numpy()),
        "x": x.tolist(),
        "y": y.tolist(),
    }


@pytest.mark.keras_torch
@pytest.mark.timeout(300)
@pytest.mark.parametrize("average,factor", [(False, 2), (True, 1)], ids=["summed", "averaged"])
def test_backward_passes_per_step_sums_local_batches_then_exchanges_once(average, factor):
    # backward_passes_per_step=2 on 2 ranks with batch 8: each update sums 2 local batch
    # gradients (Horovod's default) and averages over ranks, i.e. 2 x the mean gradient of
    # the 32 rows of both ranks' 2 passes; average_aggregated_gradients=True alone makes it
    # 1 x that mean. Checked against plain numpy SGD on those rows.
    from helpers.sgd_reference import linear_sgd

    out = HorovodRunner(np=-2).run(sgd_accumulating, batch=8, lr=0.025, passes=2, average=average)
    x, y = np.array(out["x"]), np.array(out["y"])
    updates = (
        [  # passes 2u, 2u+1 of rank 0 (rows 0..63) and of rank 1 (rows 64..127)
            np.r_[16 * u : 16 * u + 16, 64 + 16 * u : 64 + 16 * u + 16] for u in range(4)
        ]
        * 2
    )  # 2 epochs, same order (no shuffle)
    w, b = linear_sgd(*map(np.array, out["initial"]), x, y, updates, lr=factor * 0.025)
    for rank_weights in out["final"]:
        np.testing.assert_allclose(np.array(rank_weights[0]), w, atol=1e-5, rtol=0)
        np.testing.assert_allclose(np.array(rank_weights[1]), b, atol=1e-5, rtol=0)
    assert out["iterations"] == 16  # every batch counted, as Horovod and Keras do


def import_horovod_keras() -> str:
    import horovod.tensorflow.keras as hvd  # noqa: F401 - the import is the test

    return "imported"


@pytest.mark.skipif(MODE != "keras3", reason=f"tf.keras is Keras 2 here ({MODE}): allowed")
def test_horovod_keras_layer_is_refused_under_keras3_with_the_fix():
    started = time.monotonic()
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2).run(import_horovod_keras)
    assert info.value.exc_type == "ImportError"
    message = info.value.remote_message or ""
    assert "Keras 3" in message and "hvdrunner.hvd_keras" in message
    assert "TF_USE_LEGACY_KERAS=1" in message
    assert time.monotonic() - started < 60  # before any training, not after


@pytest.mark.skipif(MODE == "keras3", reason="Horovod's Keras layer is refused under Keras 3")
def test_horovod_keras_layer_imports_where_tf_keras_is_keras2():
    assert HorovodRunner(np=-1).run(import_horovod_keras) == "imported"


def drifting_recipe() -> None:
    """DistributedOptimizer *not* used: ranks train apart; the sync check must stop it."""
    import hvdrunner.hvd_keras as hvd

    keras = compat.keras_module()
    hvd.init()
    x = np.random.default_rng(hvd.rank()).normal(size=(64, 3)).astype("float32")
    model = keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(
        x, x.sum(axis=1), batch_size=16, epochs=3, verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                   hvd.callbacks.WeightSyncCheckCallback()],
    )  # fmt: skip


@pytest.mark.keras_torch
def test_weight_sync_check_fails_a_diverging_job():
    with pytest.raises(HorovodRunnerError) as info:
        HorovodRunner(np=-2).run(drifting_recipe)
    assert info.value.exc_type == "RanksOutOfSyncError"
    assert "gradients were not averaged" in (info.value.remote_message or "")


@pytest.mark.keras_torch
def test_jax_and_a_backend_that_is_not_installed_are_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    if MODE != "keras3":
        compat.check_backend()  # Keras 2 has one backend: nothing to refuse
        return
    with pytest.raises(RuntimeError, match="Horovod has no JAX collectives.*KERAS_BACKEND=torch"):
        compat.check_backend()
    missing = "tensorflow" if backend.name() == "torch" else None
    if missing is not None:  # Keras' default backend on a machine without TensorFlow
        monkeypatch.delenv("KERAS_BACKEND")
        monkeypatch.setenv("KERAS_HOME", "/nonexistent")
        with pytest.raises(RuntimeError, match="'tensorflow'.*not installed.*KERAS_BACKEND=torch"):
            compat.check_backend()


def local_variables_recipe(hvd_module: str) -> list:
    """A shared layer and a per-rank head: the head's kernel is registered local with the
    optimizer (gradient not averaged) and excluded from the initial broadcast."""
    hvd = importlib.import_module(hvd_module)
    hvd.init()
    keras = compat.keras_module()
    rng = np.random.default_rng(7 + hvd.rank())
    x = rng.normal(size=(128, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 3.0, 0.5]) * (1 + hvd.rank())).astype("float32")
    keras.utils.set_random_seed(3 + hvd.rank())
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3),
                              keras.layers.Dense(1)])  # fmt: skip
    head = model.layers[1].kernel
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01))
    opt.register_local_var(head)
    model.compile(optimizer=opt, loss="mse")
    initial_head = np.array(head.numpy())
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[head])])  # fmt: skip
    return backend.horovod().allgather_object({
        "shared": model.layers[0].kernel.numpy().tolist(), "head": head.numpy().tolist(),
        "head_initial": initial_head.tolist(),
    })  # fmt: skip


# hvdrunner's layer everywhere; Horovod's own beside it where it works (Keras 2): same rules.
LOCAL_MODULES = ["hvdrunner.hvd_keras"] + ([] if MODE == "keras3" else ["horovod.tensorflow.keras"])


@pytest.mark.keras_torch
@pytest.mark.timeout(300)
@pytest.mark.parametrize("module", LOCAL_MODULES)
def test_local_variables_keep_their_own_values_and_gradients(module):
    ranks = HorovodRunner(np=-2).run(local_variables_recipe, hvd_module=module)
    shared = [np.array(r["shared"]) for r in ranks]
    np.testing.assert_allclose(shared[0], shared[1], rtol=0, atol=1e-6)  # averaged, broadcast
    heads = [np.array(r["head"]) for r in ranks]
    initial = [np.array(r["head_initial"]) for r in ranks]
    assert not np.allclose(initial[0], initial[1])  # rank 1's own head survived the broadcast
    assert not np.allclose(heads[0], heads[1])  # each applied its own gradients
    assert not np.allclose(heads[1], initial[1])  # and it trained


def partial_recipe(hvd_module: str) -> list:
    """Horovod's own test of PartialDistributedOptimizer (test_tensorflow2_keras.py): 0, 1
    and 2 local layers, one fit step each through the module's normal path. Weights start at
    the rank's number, so an averaged gradient differs from a rank's own; SGD(1.0) makes the
    step the gradient. A rank's own gradient is the step of a plain SGD(1.0) on a twin model
    (backend-neutral: no GradientTape)."""
    hvd = importlib.import_module(hvd_module)
    hvd.init()
    keras = compat.keras_module()

    def model_and_step(opt_of: object) -> tuple:
        init = keras.initializers.Constant(hvd.rank() + 1.0)
        model = keras.Sequential([
            keras.Input(shape=(3,)),
            keras.layers.Dense(2, kernel_initializer=init, bias_initializer=init),
            keras.layers.Dense(3, kernel_initializer=init, bias_initializer=init),
        ])  # fmt: skip
        x = np.full((4, 3), 1.0 + hvd.rank(), "float32")
        before = [w.numpy() for w in model.trainable_weights]
        model.compile(optimizer=opt_of(model), loss="mse")
        model.fit(x, np.zeros((4, 3), "float32"), batch_size=4, epochs=1, shuffle=False,
                  verbose=0)  # fmt: skip
        return [(b - w.numpy()).tolist() for b, w in zip(before, model.trainable_weights,
                                                          strict=True)]  # fmt: skip

    out = []
    for num_local in range(3):
        own = model_and_step(lambda m: keras.optimizers.SGD(1.0))
        step = model_and_step(lambda m, n=num_local: hvd.PartialDistributedOptimizer(
            keras.optimizers.SGD(1.0), local_layers=m.layers[:n]))  # fmt: skip
        out.append({"own": own, "step": step})
    return backend.horovod().allgather_object(out)


# Horovod's horovod.keras beside hvdrunner's where it works (Keras 2): the same steps.
PARTIAL_MODULES = ["hvdrunner.hvd_keras"] + ([] if MODE == "keras3" else ["horovod.keras"])


@pytest.mark.keras_torch
@pytest.mark.timeout(300)
def test_partial_distributed_optimizer_keeps_local_layers_gradients_local():
    steps = {}
    for module in PARTIAL_MODULES:
        ranks = HorovodRunner(np=-2).run(partial_recipe, hvd_module=module)
        for num_local in range(3):
            own = [[np.array(g) for g in r[num_local]["own"]] for r in ranks]
            for rank, r in enumerate(ranks):
                for i, step in enumerate(r[num_local]["step"]):  # 0-1: layer 0, 2-3: layer 1
                    # local: this rank's own gradient scaled by 1/size; else the ranks' average
                    local = i // 2 < num_local
                    expected = own[rank][i] / 2 if local else (own[0][i] + own[1][i]) / 2
                    np.testing.assert_allclose(step, expected, rtol=1e-5, atol=1e-6)
        steps[module] = ranks
    if len(steps) == 2:  # Horovod's layer took the same steps
        ours, theirs = steps.values()
        np.testing.assert_allclose(
            np.concatenate([np.ravel(s) for r in ours for c in r for s in c["step"]]),
            np.concatenate([np.ravel(s) for r in theirs for c in r for s in c["step"]]),
            rtol=1e-6, atol=1e-7,
        )  # fmt: skip
    with pytest.raises(ValueError, match="All local layers must be of tf.keras.layers.Layer"):
        importlib.import_module("hvdrunner.hvd_keras").PartialDistributedOptimizer(
            None, local_layers=["dense"]
        )


def collective_names(hvd_module: str) -> list:
    """Each name user code takes from the Horovod Keras module, called as Horovod documents
    it, on 2 ranks (rank r holds [r+1, 2(r+1)]); names the module lacks are reported. Values
    go in as numpy (Horovod's Keras layer makes tensors of them, as does hvdrunner's)."""
    hvd = importlib.import_module(hvd_module)
    hvd.init()
    r = hvd.rank()
    x = np.array([float(r + 1), 2.0 * (r + 1)], "float32")

    def values(a):  # Horovod's Keras collectives return numpy values, not tensors
        return np.asarray(a).tolist()

    def broadcast_variables():
        if backend.is_torch():
            v = compat.keras_module().Variable([float(r)])
        else:
            import tensorflow as tf

            v = tf.Variable([float(r)])
        hvd.broadcast_variables([v], root_rank=1)
        return values(v.numpy())

    calls = {  # name the module must have -> the call
        "topology": ("cross_size", lambda: [hvd.size(), hvd.local_rank() == r, hvd.local_size(),
                                            hvd.cross_rank(), hvd.cross_size(), hvd.is_initialized()]),
        "allreduce": ("allreduce", lambda: values(hvd.allreduce(x))),  # Average by default
        "allreduce_sum": ("allreduce", lambda: values(hvd.allreduce(x, op=hvd.Sum))),
        "allgather": ("allgather", lambda: values(hvd.allgather(np.array([[float(r)]], "float32")))),
        "broadcast": ("broadcast", lambda: values(hvd.broadcast(x, root_rank=1))),
        "broadcast_object": ("broadcast_object", lambda: hvd.broadcast_object({"r": r}, root_rank=1)),
        "allgather_object": ("allgather_object", lambda: hvd.allgather_object(r)),
        "build": ("gloo_built", lambda: [hvd.gloo_built(), hvd.mpi_built(), hvd.nccl_built()]),
        "broadcast_variables": ("broadcast_variables", broadcast_variables),
    }  # fmt: skip
    out = {name: call() if hasattr(hvd, attr) else "absent" for name, (attr, call) in calls.items()}
    everyone = backend.horovod().allgather_object(out)
    hvd.shutdown()
    return [everyone, hvd.is_initialized()]


#: What Horovod 0.28.1 answers on 2 driver-process ranks of one host, for every rank.
HOROVOD_ANSWERS = {
    "topology": [2, True, 2, 0, 1, True], "allreduce": [1.5, 3.0], "allreduce_sum": [3.0, 6.0],
    "allgather": [[0.0], [1.0]], "broadcast": [2.0, 4.0], "broadcast_object": {"r": 1},
    "allgather_object": [0, 1], "build": [True, False, False], "broadcast_variables": [1.0],
}  # fmt: skip


def _engine_nccl() -> int | bool:
    from hvdrunner import _versions

    if _versions.version("torch") is None:  # TensorFlow without torch: the compiled horovod
        return False
    from hvdrunner.engine import build_info

    return build_info.nccl_built() or False


@pytest.mark.keras_torch
@pytest.mark.timeout(300)
@pytest.mark.parametrize("module", LOCAL_MODULES)
def test_the_collectives_answer_what_horovod_answers(module):
    everyone, initialized_after_shutdown = HorovodRunner(np=-2).run(collective_names,
                                                                    hvd_module=module)  # fmt: skip
    # nccl_built() is NCCL's version where the transport has NCCL: the engine's where torch
    # is a CUDA build (18's), the compiled CPU horovod's 0/False elsewhere
    nccl = _engine_nccl() if module.startswith("hvdrunner.") else False
    for rank, answers in enumerate(everyone):
        for name, expected in (HOROVOD_ANSWERS | {"build": [True, False, nccl]}).items():
            got = answers[name]
            if module.startswith("horovod.") and got == "absent":
                continue  # not in Horovod's Keras module (*_object, broadcast_variables): ours adds it
            assert got == expected, f"{module} rank {rank}: {name} gave {got}"
    assert initialized_after_shutdown is False


@pytest.mark.keras_torch
def test_the_drop_in_names_and_signatures_follow_horovod():
    import inspect

    import hvdrunner.hvd_keras as hvd

    for name in ("shutdown", "local_size", "allreduce", "broadcast", "broadcast_variables",
                 "allgather", "cross_size", "cross_rank", "load_model", "elastic"):  # fmt: skip
        assert hasattr(hvd, name), name
    params = inspect.signature(hvd.DistributedOptimizer).parameters
    assert list(params)[:3] == ["optimizer", "name", "device_dense"]
    assert {"groups", "num_groups", "process_set", "gradient_predivide_factor",
            "scale_local_gradients"} <= set(params)  # fmt: skip
    # Horovod's elastic Keras API: on TensorFlow over the engine (tests/test_elastic_tf.py)
    if backend.is_torch() or not backend.horovod().__name__.startswith("hvdrunner."):
        with pytest.raises(NotImplementedError, match="max_restarts=N"):
            hvd.elastic.KerasState  # noqa: B018 - the attribute access is what raises
    else:
        assert hvd.elastic.KerasState.__module__ == "hvdrunner.keras.elastic"
    with pytest.raises(RuntimeError, match="BroadcastGlobalVariablesCallback"):
        hvd.broadcast_global_variables(0)
    with pytest.raises(ValueError, match="only the global process set"):
        hvd.DistributedOptimizer(object(), process_set=object())


@pytest.mark.skipif(MODE != "keras3", reason=f"tf.keras is Keras 2 here ({MODE}): allowed")
@pytest.mark.parametrize("module", ["horovod.tensorflow.keras", "horovod.keras", "horovod._keras"])
def test_every_horovod_keras_module_is_refused_by_the_rank_guard_under_keras3(module):
    import subprocess
    import sys

    code = (
        "from hvdrunner._import_guard import install_import_guard\n"
        "install_import_guard()\n"
        f"try:\n    import {module}\n    print('imported')\n"
        "except ImportError as e:\n    print('refused', 'hvdrunner.hvd_keras' in str(e))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "refused True", out.stdout + out.stderr
