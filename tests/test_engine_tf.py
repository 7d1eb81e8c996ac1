"""Horovod's TensorFlow API on hvdrunner's engine (hvdrunner.hvd_tensorflow,
hvdrunner.engine.tf): nothing compiled. Real ranks over gloo under torchrun with horovod
unimportable, and Keras' ``fit`` under HorovodRunner on the engine beside the same job on the
compiled horovod (the parity reference; 18 has both). CPU only: the GPU path
(DLPack of CUDA tensors, NCCL) is not run here."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import digits as digit_data
from helpers.docblocks import block, run_with_last_line
from helpers.engine_jobs import battery
from hvdrunner import HorovodRunner

pytestmark = [pytest.mark.keras, pytest.mark.tf_engine]


@pytest.mark.timeout(300)
def test_the_tensorflow_battery(tmp_path):
    """tests/helpers/tf_engine_battery.py: every collective against numpy, eagerly and in
    tf.function; Horovod's gradients; DistributedGradientTape; mismatches as Horovod's errors
    on both ranks; a TensorFlow 1 graph of many collectives run at once."""
    ran = battery("tf_engine_battery.py", tmp_path, timeout=240)
    for rank, (count, failed) in ran.items():
        assert count == 10, f"rank {rank} ran {count} cases"
        assert not failed, f"rank {rank}: " + "\n".join(f"{k}: {v}" for k, v in failed.items())


def _fit_losses_and_weights(data):
    """One rank of a Keras fit on the digits; which Horovod ran it, its losses, its weights."""
    import hvdrunner.keras.backend as backend
    from hvdrunner.keras import compat, fit

    keras = compat.keras_module()
    keras.utils.set_random_seed(7)
    grabbed: dict = {"loss": []}

    class Grab(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            grabbed["loss"].append(float(logs["loss"]))

        def on_train_end(self, logs=None):
            grabbed["w"] = [w.tolist() for w in self.model.get_weights()]

    def build():
        return keras.Sequential([keras.Input(shape=(64,)),
                                 keras.layers.Dense(32, activation="relu"),
                                 keras.layers.Dense(10, activation="softmax")])  # fmt: skip

    fit(build_model=build, data=data, epochs=2, batch_size=32, shuffle=False,
                 loss="sparse_categorical_crossentropy", log_model=False, verbose=0,
                 callbacks=[Grab()])  # fmt: skip
    return backend.horovod().__name__, grabbed["loss"], grabbed["w"]


@pytest.mark.timeout(600)
def test_keras_fit_on_the_engine_matches_the_compiled_horovod(spark, tmp_path, monkeypatch):
    """The same job, same seed and data order: losses and weights as the compiled horovod's
    (averaging two ranks' float32 gradients: the same sums, so within 1e-6)."""
    data, _, _ = digit_data.prepared_split(spark, str(tmp_path / "digits"), "int32")
    monkeypatch.delenv("HVDRUNNER_ENGINE", raising=False)
    ours = HorovodRunner(np=2).run(_fit_losses_and_weights, data=data)
    monkeypatch.setenv("HVDRUNNER_ENGINE", "horovod")
    theirs = HorovodRunner(np=2).run(_fit_losses_and_weights, data=data)
    assert ours[0] == "hvdrunner.engine.tf" and theirs[0] == "horovod.tensorflow"
    np.testing.assert_allclose(ours[1], theirs[1], rtol=0, atol=1e-6)
    for a, b in zip(ours[2], theirs[2], strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)
    assert ours[1][-1] < ours[1][0]  # it trained


def test_the_drop_in_has_horovod_tensorflows_names():
    """Every public name of horovod.tensorflow 0.28.1's collectives is in the drop-in."""
    import hvdrunner.hvd_tensorflow as hvd

    names = ["allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "broadcast", "broadcast_", "alltoall", "reducescatter", "grouped_reducescatter", "join", "barrier", "broadcast_variables", "broadcast_global_variables", "broadcast_object", "broadcast_object_fn", "allgather_object", "DistributedGradientTape", "PartialDistributedGradientTape", "DistributedOptimizer", "Compression", "Average", "Sum", "Min", "Max", "Product", "Adasum", "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size", "rank_op", "size_op", "local_rank_op", "local_size_op", "process_set_included_op", "ProcessSet", "global_process_set", "add_process_set", "remove_process_set", "elastic"]  # fmt: skip
    assert [n for n in names if not hasattr(hvd, n)] == []


def test_tf1_optimizers_are_refused_with_the_way_out():
    import tensorflow as tf

    import hvdrunner.hvd_tensorflow as hvd

    with pytest.raises(NotImplementedError, match="Keras optimizer"):
        hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))


@pytest.mark.timeout(300)
def test_the_docs_recipe_runs_as_written(spark):
    """docs/tensorflow.md's one-changed-import recipe, executed verbatim on 2 barrier tasks."""
    last, loss = run_with_last_line(block("tensorflow.md", "one-import"), "tensorflow.md")
    assert last == "HorovodRunner(np=2).run(train)"
    assert 0 < loss < 1.0  # ln 3 = 1.10 untrained
