"""``hvdrunner.keras.fit``: the whole Horovod integration of a Keras model in one call.

The settings are :class:`~hvdrunner.keras.config.FitConfig`'s fields (``fit``'s signature
is generated from them); the work is a few named steps, each a function below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from hvdrunner import _horovod_knobs
from hvdrunner.core import recipe, schedule, settings
from hvdrunner.core.settings import fit_signature, horovod_env
from hvdrunner.data.handle import prepared_behind
from hvdrunner.distributed import is_rank0
from hvdrunner.keras import backend, compat
from hvdrunner.keras import callbacks as hk_callbacks
from hvdrunner.keras.checkpoint import CheckpointStore
from hvdrunner.keras.config import INPUTS, OPTIMIZERS, FitConfig, FitResult, make_config
from hvdrunner.keras.inputs import is_petastorm_converter, prepared_input, training_input
from hvdrunner.keras.models import log_model
from hvdrunner.keras.optimizer import distribute

__all__ = ["FitConfig", "FitResult", "fit"]

NOT_KERAS = (
    "build_model returned a {kind}, not a Keras model. Horovod data parallelism averages the "
    "gradients of a model trained by gradient descent (Keras/TensorFlow here); it cannot "
    "parallelize estimators like scikit-learn's or XGBoost boosters. For distributed "
    "classical ML use Spark MLlib (pyspark.ml); to train many small models in parallel, "
    "run a hyperparameter search over Spark (e.g. Hyperopt with SparkTrials)."
)


def fit(
    build_model: Callable[[], Any],
    data: Any,
    *,
    validation: Any = None,
    features: str | None = None,
    label: str | None = None,
    config: FitConfig | None = None,
    **settings: Any,
) -> FitResult | None:
    """Train ``build_model()`` data-parallel on this job's ranks; run it with HorovodRunner.

    Settings are keyword arguments (the fields of :class:`FitConfig`: ``epochs``,
    ``batch_size``, ``loss`` required) or a whole ``config=FitConfig(...)`` (keywords then
    override it).

    Works on Keras 2 (TF 2.15, or ``tf_keras`` with ``TF_USE_LEGACY_KERAS=1``) and Keras 3
    on TensorFlow or PyTorch (``KERAS_BACKEND=torch``, no TensorFlow needed), with
    hvdrunner's own Horovod layer (never ``horovod.tensorflow.keras``). In this order:
    ``hvd.init()``; pin this rank's GPU (memory growth on); build the model (``TypeError``
    if it is not Keras); scale ``learning_rate`` by the number of ranks, with a linear
    warmup over ``warmup_epochs``; make the optimizer average gradients over ranks; restore
    the newest intact checkpoint on rank 0 (if any); broadcast model and optimizer state
    from rank 0; feed this rank's shard of ``data`` (:func:`hvdrunner.data.prepare`) with
    equal steps on every rank; average metrics over ranks; check after the first epoch that
    all ranks hold identical weights; Keras progress on rank 0 only; rank 0 checkpoints
    every ``checkpoint_every`` epochs (keeping ``keep_checkpoints``) and logs params,
    averaged metrics and the model to the driver's MLflow run. Returns a
    :class:`FitResult` on rank 0, ``None`` elsewhere.

    ``validation`` (prepared like ``data``) adds ``val_*`` metrics per epoch: every rank
    evaluates its equal share of it (same number of steps everywhere; the last rank's share
    wraps around to the first rows), and the metrics are averaged over ranks before any
    callback sees them, so an ``EarlyStopping`` in ``callbacks`` decides the same on every
    rank (a rank that stopped alone would hang the others).

    Gradient exchange knobs (measured effects: docs/benchmarks.md):
    ``compression="fp16"`` sends gradients as float16 (half the bytes per allreduce);
    ``backward_passes_per_step=N`` averages N batches' gradients locally and exchanges once
    per N batches (N times fewer allreduces; one update per N batches, so an effective
    batch of ``N * batch_size * ranks`` at the same learning rate); ``fusion_threshold_mb``
    and ``cycle_time_ms`` set Horovod's ``HOROVOD_FUSION_THRESHOLD`` (tensor fusion buffer)
    and ``HOROVOD_CYCLE_TIME`` (background loop period) for this job. ``in_memory``: as in
    :meth:`PreparedData.tf_dataset` (``None`` = keep the shard in memory when it fits).

    ``data`` may also be a converter (``make_spark_converter(df)``): pass ``features=`` and
    ``label=`` column names. hvdrunner's (:mod:`hvdrunner.petastorm.spark`, every stack) is
    read as prepared data. A real Petastorm one (stacks with petastorm only) is read as an
    endless stream of each rank's (unequal) row-group shard for a common
    ``ceil(rows / (batch_size * ranks))`` steps per epoch, so no rank runs out first.

    Arguments are validated on the driver by ``HorovodRunner.run`` before any rank starts
    (including that ``checkpoint_dir`` is a writable directory).

    Example:
        >>> result = HorovodRunner(np=2).run(  # doctest: +SKIP
        ...     fit, build_model=build_model, data=data, epochs=5, batch_size=64,
        ...     loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    """
    cfg = make_config(config, settings)
    return recipe.run(_Keras(features, label), cfg, build_model, data, validation)


fit.__signature__ = fit_signature(fit, FitConfig)  # type: ignore[attr-defined]


class _Keras:
    """Keras' parts of the one fit recipe (:mod:`hvdrunner.core.recipe`)."""

    def __init__(self, features: str | None, label: str | None) -> None:
        self.features, self.label = features, label

    def init(self, cfg: FitConfig) -> Any:
        return _init_horovod(cfg)

    def build(self, build_model: Callable[[], Any], cfg: FitConfig, size: int) -> recipe.Built:
        return recipe.Built(*_build(build_model, cfg, size))

    def store(self, cfg: FitConfig) -> CheckpointStore:
        assert cfg.checkpoint_dir is not None  # the recipe asks only when one is set
        return CheckpointStore(cfg.checkpoint_dir, cfg.keep_checkpoints)

    def broadcast(self, built: recipe.Built) -> None:
        hk_callbacks.broadcast_model(built.model, root_rank=0)

    def feed(self, data: Any, cfg: FitConfig, initial_epoch: int) -> tuple[int, int, Any]:
        return training_input(
            data, cfg.batch_size, shuffle=cfg.shuffle, seed=cfg.seed, first_epoch=initial_epoch,
            features=self.features, label=self.label, in_memory=cfg.in_memory,
        )  # fmt: skip

    def params(self, cfg: FitConfig) -> dict[str, Any]:
        return {"keras": f"{compat.mode()} {compat.keras_version()}",
                "keras_backend": backend.name()}  # fmt: skip

    def train(self, run: recipe.FitRun[FitConfig]) -> tuple[dict[str, list[Any]], Any]:
        return _train(run, _callbacks(run))

    def log_model(self, model: Any, cfg: FitConfig, example: Any) -> str | None:
        return _log_model(model, cfg, example)


def _init_horovod(cfg: FitConfig) -> Any:
    """``hvd.init()`` with this job's fusion/cycle settings; this rank's GPU; the seed."""
    hvd = backend.horovod()
    horovod_env(cfg, hvd.is_initialized())
    if backend.is_torch():  # the gradients go out as one grouped request per step
        _horovod_knobs.for_grouped_requests()
    backend.init()
    if backend.is_torch():
        import torch

        if torch.cuda.is_available():  # Keras' torch backend places tensors on "cuda"
            torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        else:  # the host's CPU ranks share its cores, as hvdrunner.torch's do
            torch.set_num_threads(settings.cpu_threads(hvd.local_size()))
    else:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        if gpus:
            tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    compat.keras_module().utils.set_random_seed(cfg.seed)
    return hvd


def _make_optimizer(spec: str | Callable[[float], Any], lr: float) -> Any:
    keras = compat.keras_module()
    if callable(spec):
        return spec(lr)
    return getattr(keras.optimizers, OPTIMIZERS[spec.lower()])(learning_rate=lr)


def _build(build_model: Callable[[], Any], cfg: FitConfig, size: int) -> tuple[Any, Any, float]:
    """The compiled model, its gradient-averaging optimizer (state built), the scaled LR."""
    model = build_model()
    if not isinstance(model, compat.keras_module().Model):
        raise TypeError(
            NOT_KERAS.format(kind=f"{type(model).__module__}.{type(model).__qualname__}")
        )
    lr = schedule.scaled_lr(cfg.learning_rate, size)
    opt = distribute(
        _make_optimizer(cfg.optimizer, lr),
        compression=cfg.compression,
        backward_passes_per_step=cfg.backward_passes_per_step,
    )
    # jit_compile=False: XLA has no kernel for Horovod's allreduce (Keras 3 turns XLA on
    # by itself on GPUs), nor has torch.compile a graph for it.
    model.compile(optimizer=opt, loss=cfg.loss, metrics=list(cfg.metrics), jit_compile=False)
    compat.build_optimizer(opt, model.trainable_variables)  # state exists before restore
    return model, opt, lr


def _callbacks(run: recipe.FitRun[FitConfig]) -> list[Any]:
    """Averaging, warmup (or the full rate on a resume past it), sync check, MLflow, saves."""
    cfg, store, opt, lr, ledger = run.cfg, run.store, run.built.optimizer, run.built.lr, run.ledger
    steps, initial_epoch = run.steps, run.initial_epoch
    cbs: list[Any] = [hk_callbacks.MetricAverageCallback()]
    if cfg.warmup_epochs and initial_epoch < cfg.warmup_epochs:
        cbs.append(hk_callbacks.LearningRateWarmupCallback(
            initial_lr=lr, warmup_epochs=cfg.warmup_epochs, steps_per_epoch=steps))  # fmt: skip
    else:
        compat.set_learning_rate(opt, lr)
    cbs.append(hk_callbacks.WeightSyncCheckCallback())
    cbs.append(hk_callbacks.MLflowCallback(ledger))
    if store is not None:
        cbs.append(_checkpoint_callback(store, opt, cfg.checkpoint_every, cfg.epochs, ledger))
    return [*cbs, *cfg.callbacks]


def _train(run: recipe.FitRun[FitConfig], cbs: list[Any]) -> tuple[dict[str, list[Any]], Any]:
    """Keras' fit on this rank's shard (progress on rank 0 only); the history, one batch."""
    model, cfg, train_input, validation = run.built.model, run.cfg, run.feed, run.validation
    steps, initial_epoch = run.steps, run.initial_epoch
    val_ds, val_steps = None, None
    with contextlib.ExitStack() as stack:
        ds = stack.enter_context(train_input)
        if validation is not None:
            val_batch = min(cfg.batch_size, validation.rows_per_rank())
            val_steps = validation.steps_per_epoch(val_batch)
            val_ds = stack.enter_context(
                prepared_input(validation, val_batch, shuffle=False, in_memory=cfg.in_memory)
            )
        history = model.fit(  # shuffle=False: the input shuffles itself (Keras would warn)
            ds, steps_per_epoch=steps, epochs=cfg.epochs, initial_epoch=initial_epoch,
            validation_data=val_ds, validation_steps=val_steps, shuffle=False,
            callbacks=cbs, verbose=cfg.verbose if is_rank0() else 0,
        )  # fmt: skip
        example = next(iter(ds))
    return history.history, example


def _log_model(model: Any, cfg: FitConfig, example: Any) -> str | None:
    """The model with a signature from a few training rows, into the run (rank 0)."""
    # (x, y); a torch DataLoader hands the pair over as a list
    features = example[0] if isinstance(example, tuple | list) else example
    return log_model(model, _head(features), registered_name=cfg.registered_model_name)


def _head(structure: Any, rows: int = 5) -> Any:
    """The first ``rows`` rows of a batch (a tensor, an array or a dict of them), as numpy."""
    if isinstance(structure, dict):
        return {k: _head(v, rows) for k, v in structure.items()}
    value = structure.numpy() if hasattr(structure, "numpy") else structure
    return np.asarray(value)[:rows]


def _preflight(**kwargs: Any) -> dict[str, Any]:
    """Driver side, before any rank starts: every argument validated, checkpoint_dir usable;
    the arguments the ranks receive (the validated config among them)."""
    compat.check_backend()
    inputs, cfg = recipe.preflight(kwargs, "hvdrunner.keras.fit", INPUTS, make_config)
    _check_inputs(inputs)
    return recipe.validated(inputs, cfg)


def _check_inputs(inputs: dict[str, Any]) -> None:
    data, validation = inputs["data"], inputs["validation"]
    if is_petastorm_converter(data):
        if not inputs["features"]:
            raise ValueError(
                "data is a Petastorm converter: pass features='<column>' (and "
                "label='<column>') so fit knows which columns to feed"
            )
        prepared_behind(data, inputs["features"], inputs["label"])  # names checked here
    elif not hasattr(data, "steps_per_epoch"):
        raise TypeError(
            f"data must be prepared input (hvdrunner.data.prepare(df, ...)) or a Petastorm "
            f"converter; got {type(data).__name__}"
        )
    if validation is not None and not hasattr(validation, "steps_per_epoch"):
        raise TypeError(
            f"validation must be prepared input (hvdrunner.data.prepare(df, ...)); got "
            f"{type(validation).__name__}"
        )


fit.hvdrunner_preflight = _preflight  # type: ignore[attr-defined]


def _checkpoint_callback(store: Any, optimizer: Any, every: int, epochs: int, ledger: Any) -> Any:
    """Rank 0 saves every ``every`` epochs and after the last one, with the epochs' metrics
    not logged yet; once saved, they are logged."""
    base: type = compat.keras_module().callbacks.Callback

    class CheckpointCallback(base):
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            done = epoch + 1
            if is_rank0() and recipe.checkpoint_due(done, every, epochs):
                recipe.save_checkpoint(store, ledger, self.model, optimizer, done)

    return CheckpointCallback()
