"""``hvdrunner.keras.fit``: the whole Horovod integration of a Keras model in one call."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdrunner import tracking
from hvdrunner._logging import get_logger
from hvdrunner.core import schedule
from hvdrunner.distributed import is_rank0
from hvdrunner.keras import callbacks as hk_callbacks
from hvdrunner.keras import compat
from hvdrunner.keras.checkpoint import CheckpointStore, check_dir
from hvdrunner.keras.inputs import is_petastorm_converter, training_input
from hvdrunner.keras.optimizer import check_passes, distribute

_OPTIMIZERS = ("adam", "sgd", "rmsprop", "adagrad")
NOT_KERAS = (
    "build_model returned a {kind}, not a Keras model. Horovod data parallelism averages the "
    "gradients of a model trained by gradient descent (Keras/TensorFlow here); it cannot "
    "parallelize estimators like scikit-learn's or XGBoost boosters. For distributed "
    "classical ML use Spark MLlib (pyspark.ml); to train many small models in parallel, "
    "run a hyperparameter search over Spark (e.g. Hyperopt with SparkTrials)."
)


@dataclass(frozen=True)
class FitConfig:
    """Validated settings of :func:`fit` (checked first thing on every rank)."""

    epochs: int
    batch_size: int
    loss: Any
    optimizer: str | Callable[[float], Any] = "adam"
    learning_rate: float = 1e-3
    metrics: tuple[Any, ...] = ()
    warmup_epochs: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    keep_checkpoints: int = 3
    shuffle: bool = True
    seed: int = 0
    log_model: bool = True
    registered_model_name: str | None = None
    verbose: int = 2
    callbacks: tuple[Any, ...] = field(default=())
    compression: str = "none"
    backward_passes_per_step: int = 1
    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    in_memory: bool | None = None

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "checkpoint_every", "keep_checkpoints"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if (
            isinstance(self.warmup_epochs, bool)
            or not isinstance(self.warmup_epochs, int)
            or self.warmup_epochs < 0
        ):
            raise ValueError(
                f"warmup_epochs must be an int >= 0 (0 = no warmup), got {self.warmup_epochs!r}"
            )
        if not isinstance(self.learning_rate, (int, float)) or not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        if self.compression not in ("none", "fp16"):
            raise ValueError(
                f"compression must be 'none' or 'fp16' (gradients sent as float16), got "
                f"{self.compression!r}"
            )
        check_passes(self.backward_passes_per_step)
        for name in ("fusion_threshold_mb", "cycle_time_ms"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
            ):
                raise ValueError(
                    f"{name} must be a number >= 0 or None (Horovod's default), got {value!r}"
                )
        if self.in_memory not in (None, True, False):
            raise ValueError(
                f"in_memory must be None (auto), True or False, got {self.in_memory!r}"
            )
        if isinstance(self.optimizer, str) and self.optimizer.lower() not in _OPTIMIZERS:
            raise ValueError(
                f"optimizer={self.optimizer!r} is not one of {_OPTIMIZERS}; pass one of those or "
                f"a function lr -> Keras optimizer, e.g. lambda lr: keras.optimizers.SGD(lr, momentum=0.9)"
            )


@dataclass(frozen=True)
class FitResult:
    """What rank 0 returns: small and picklable."""

    history: dict[str, list[float]]  # averaged over ranks, one value per epoch run
    model_uri: str | None  # runs:/… when the driver had an MLflow run
    initial_epoch: int  # > 0 when resumed from a checkpoint
    epochs: int
    steps_per_epoch: int
    num_ranks: int


def _make_optimizer(spec: str | Callable[[float], Any], lr: float) -> Any:
    keras = compat.tf_keras()
    if callable(spec):
        return spec(lr)
    return {
        "adam": keras.optimizers.Adam,
        "sgd": keras.optimizers.SGD,
        "rmsprop": keras.optimizers.RMSprop,
        "adagrad": keras.optimizers.Adagrad,
    }[spec.lower()](learning_rate=lr)


def fit(
    build_model: Callable[[], Any],
    data: Any,
    *,
    epochs: int,
    batch_size: int,
    loss: Any,
    optimizer: str | Callable[[float], Any] = "adam",
    learning_rate: float = 1e-3,
    metrics: Sequence[Any] = (),
    warmup_epochs: int = 0,
    checkpoint_dir: str | None = None,
    checkpoint_every: int = 1,
    keep_checkpoints: int = 3,
    shuffle: bool = True,
    seed: int = 0,
    log_model: bool = True,
    registered_model_name: str | None = None,
    verbose: int = 2,
    callbacks: Sequence[Any] = (),
    compression: str = "none",
    backward_passes_per_step: int = 1,
    fusion_threshold_mb: float | None = None,
    cycle_time_ms: float | None = None,
    in_memory: bool | None = None,
    validation: Any = None,
    features: str | None = None,
    label: str | None = None,
) -> FitResult | None:
    """Train ``build_model()`` data-parallel on this job's ranks; run it with HorovodRunner.

    Works on Keras 2 (TF 2.15, or ``tf_keras`` with ``TF_USE_LEGACY_KERAS=1``) and Keras 3,
    with hvdrunner's own Horovod layer (never ``horovod.tensorflow.keras``). In this order:
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

    Gradient exchange knobs (see the README's performance section for measured effects):
    ``compression="fp16"`` sends gradients as float16 (half the bytes per allreduce);
    ``backward_passes_per_step=N`` averages N batches' gradients locally and exchanges once
    per N batches (N times fewer allreduces; one update per N batches, so an effective
    batch of ``N * batch_size * ranks`` at the same learning rate); ``fusion_threshold_mb``
    and ``cycle_time_ms`` set Horovod's ``HOROVOD_FUSION_THRESHOLD`` (tensor fusion buffer)
    and ``HOROVOD_CYCLE_TIME`` (background loop period) for this job. ``in_memory``: as in
    :meth:`PreparedData.tf_dataset` (``None`` = keep the shard in memory when it fits).

    ``data`` may also be a Petastorm ``SparkDatasetConverter`` (``make_spark_converter(df)``;
    stacks with petastorm only): pass ``features=`` and ``label=`` column names. Every rank
    reads an endless stream of its (unequal) row-group shard for a common
    ``ceil(rows / (batch_size * ranks))`` steps per epoch, so no rank runs out first.

    Arguments are validated on the driver by ``HorovodRunner.run`` before any rank starts
    (including that ``checkpoint_dir`` is a writable directory).

    Example:
        >>> result = HorovodRunner(np=2).run(  # doctest: +SKIP
        ...     fit, build_model=build_model, data=data, epochs=5, batch_size=64,
        ...     loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    """
    cfg = _config(locals())

    import horovod.tensorflow as hvd
    import tensorflow as tf

    keras = compat.tf_keras()
    _horovod_env(hvd, cfg)
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    keras.utils.set_random_seed(cfg.seed)

    model = build_model()
    if not isinstance(model, keras.Model):
        raise TypeError(
            NOT_KERAS.format(kind=f"{type(model).__module__}.{type(model).__qualname__}")
        )
    scaled_lr = schedule.scaled_lr(cfg.learning_rate, hvd.size())
    opt = distribute(
        _make_optimizer(cfg.optimizer, scaled_lr),
        compression=cfg.compression,
        backward_passes_per_step=cfg.backward_passes_per_step,
    )
    # jit_compile=False: XLA has no kernel for Horovod's allreduce (Keras 3 turns XLA on
    # by itself on GPUs).
    model.compile(optimizer=opt, loss=cfg.loss, metrics=list(cfg.metrics), jit_compile=False)
    compat.build_optimizer(opt, model.trainable_variables)  # state exists before restore

    store = (
        CheckpointStore(cfg.checkpoint_dir, cfg.keep_checkpoints) if cfg.checkpoint_dir else None
    )
    initial_epoch = 0
    if store is not None and is_rank0():
        latest = store.latest()
        if latest is not None:
            initial_epoch = store.restore(latest[1], model, opt)
            get_logger().info(f"resuming after epoch {initial_epoch} from {latest[1]}")
    initial_epoch = int(
        hvd.broadcast_object(initial_epoch, root_rank=0, name="hvdrunner.initial_epoch")
    )
    hk_callbacks.broadcast_model(model, root_rank=0)

    steps, rows, train_input = training_input(
        data, cfg.batch_size, shuffle=cfg.shuffle, seed=cfg.seed, first_epoch=initial_epoch,
        features=features, label=label, in_memory=cfg.in_memory,
    )  # fmt: skip
    cbs: list[Any] = [hk_callbacks.MetricAverageCallback()]
    if cfg.warmup_epochs and initial_epoch < cfg.warmup_epochs:
        cbs.append(hk_callbacks.LearningRateWarmupCallback(
            initial_lr=scaled_lr, warmup_epochs=cfg.warmup_epochs, steps_per_epoch=steps))  # fmt: skip
    else:
        compat.set_learning_rate(opt, scaled_lr)  # a resume past the warmup: the full rate
    cbs.append(hk_callbacks.WeightSyncCheckCallback())
    cbs.append(hk_callbacks.MLflowCallback())
    if store is not None:
        cbs.append(_checkpoint_callback(store, opt, cfg.checkpoint_every, cfg.epochs))
    cbs.extend(cfg.callbacks)
    tracking.log_params(
        {"epochs": cfg.epochs, "batch_size_per_rank": cfg.batch_size, "num_ranks": hvd.size(),
         "learning_rate": cfg.learning_rate, "scaled_learning_rate": scaled_lr,
         "warmup_epochs": cfg.warmup_epochs, "optimizer": getattr(cfg.optimizer, "__name__", cfg.optimizer),
         "steps_per_epoch": steps, "rows": rows, "compression": cfg.compression,
         "backward_passes_per_step": cfg.backward_passes_per_step,
         "fusion_threshold_mb": cfg.fusion_threshold_mb, "cycle_time_ms": cfg.cycle_time_ms,
         "keras": f"{compat.mode()} {compat.keras_version()}"}
    )  # fmt: skip
    # Changes on every resume of the same run: a tag, not a param (params are immutable).
    tracking.set_tags({"hvdrunner.initial_epoch": initial_epoch})
    val_batch = min(cfg.batch_size, validation.rows_per_rank()) if validation else None
    val_steps = validation.steps_per_epoch(val_batch) if validation else None
    with contextlib.ExitStack() as stack:
        ds = stack.enter_context(train_input)
        val_ds = (
            stack.enter_context(
                validation.tf_dataset(val_batch, shuffle=False, in_memory=cfg.in_memory)
            )
            if validation is not None
            else None
        )
        history = model.fit(
            ds, steps_per_epoch=steps, epochs=cfg.epochs, initial_epoch=initial_epoch,
            validation_data=val_ds, validation_steps=val_steps,
            callbacks=cbs, verbose=cfg.verbose if is_rank0() else 0,
        )  # fmt: skip
        example = next(iter(ds))
    features = example[0] if isinstance(example, tuple) else example
    model_uri = None
    if cfg.log_model:
        sample = tf.nest.map_structure(lambda t: t.numpy()[:5], features)
        model_uri = tracking.log_model(model, sample, registered_name=cfg.registered_model_name)
    if not is_rank0():
        return None
    return FitResult(
        history={k: [float(v) for v in vs] for k, vs in history.history.items()},
        model_uri=model_uri, initial_epoch=initial_epoch, epochs=cfg.epochs,
        steps_per_epoch=steps, num_ranks=hvd.size(),
    )  # fmt: skip


def _horovod_env(hvd: Any, cfg: FitConfig) -> None:
    """Fusion/cycle settings are read by ``hvd.init()``: set them first, or refuse."""
    env = {}
    if cfg.fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(cfg.fusion_threshold_mb * 1024 * 1024))
    if cfg.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = str(cfg.cycle_time_ms)
    if env and hvd.is_initialized():
        raise RuntimeError(
            "fusion_threshold_mb/cycle_time_ms are read by hvd.init(), which already ran in "
            "this rank: do not call hvd.init() before fit, or set "
            f"{', '.join(env)} in the environment instead"
        )
    os.environ.update(env)


def _config(arguments: dict[str, Any]) -> FitConfig:
    """FitConfig from fit's keyword arguments (the sequences made tuples)."""
    kwargs = {k: v for k, v in arguments.items() if k in FitConfig.__dataclass_fields__}
    kwargs["metrics"] = tuple(kwargs.get("metrics", ()))
    kwargs["callbacks"] = tuple(kwargs.get("callbacks", ()))
    return FitConfig(**kwargs)


def _preflight(**kwargs: Any) -> None:
    """Driver side, before any rank starts: every argument validated, checkpoint_dir usable."""
    missing = [
        k for k in ("build_model", "data", "epochs", "batch_size", "loss") if k not in kwargs
    ]
    if missing:
        raise TypeError(f"fit() missing required argument(s): {', '.join(missing)}")
    unknown = sorted(
        set(kwargs)
        - set(FitConfig.__dataclass_fields__)
        - {"build_model", "data", "validation", "features", "label"}
    )
    if unknown:
        raise TypeError(
            f"fit() got unexpected argument(s) {unknown}; see help(hvdrunner.keras.fit)"
        )
    cfg = _config(kwargs)
    compat.check_backend()
    tracking.check_registered_model_name(cfg.registered_model_name)
    if cfg.checkpoint_dir:
        check_dir(cfg.checkpoint_dir)
    for name in ("data", "validation"):
        value = kwargs.get(name)
        if name == "data" and is_petastorm_converter(value):
            if not kwargs.get("features"):
                raise ValueError(
                    "data is a Petastorm converter: pass features='<column>' (and "
                    "label='<column>') so fit knows which columns to feed"
                )
            continue
        if (name == "data" or value is not None) and not hasattr(value, "steps_per_epoch"):
            raise TypeError(
                f"{name} must be prepared input (hvdrunner.data.prepare(df, ...)) or, for "
                f"data, a Petastorm converter; got {type(value).__name__}"
            )


fit.hvdrunner_preflight = _preflight  # type: ignore[attr-defined]


def _checkpoint_callback(store: Any, optimizer: Any, every: int, epochs: int) -> Any:
    """Rank 0 saves every ``every`` epochs and after the last one."""
    base: type = compat.tf_keras().callbacks.Callback

    class CheckpointCallback(base):
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            done = epoch + 1
            if is_rank0() and (done % every == 0 or done == epochs):
                store.save(self.model, optimizer, done)

    return CheckpointCallback()
