"""``hvdrunner.keras.fit``: the whole Horovod integration of a Keras model in one call."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdrunner.distributed import is_rank0

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
    import tensorflow as tf

    if callable(spec):
        return spec(lr)
    return {
        "adam": tf.keras.optimizers.Adam,
        "sgd": tf.keras.optimizers.SGD,
        "rmsprop": tf.keras.optimizers.RMSprop,
        "adagrad": tf.keras.optimizers.Adagrad,
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
) -> FitResult | None:
    """Train ``build_model()`` data-parallel on this job's ranks; run it with HorovodRunner.

    In this order: ``hvd.init()``; pin this rank's GPU (memory growth on); build the model
    (``TypeError`` if it is not Keras); scale ``learning_rate`` by the number of ranks, with
    a linear warmup over ``warmup_epochs``; wrap the optimizer in
    ``hvd.DistributedOptimizer``; restore the newest checkpoint on rank 0 (if any); broadcast
    model and optimizer state from rank 0; feed this rank's shard of ``data``
    (:func:`hvdrunner.data.prepare`) with equal steps on every rank; average metrics over
    ranks; Keras progress on rank 0 only; rank 0 checkpoints every ``checkpoint_every``
    epochs (keeping ``keep_checkpoints``) and logs params, averaged metrics and the model to
    the driver's MLflow run. Returns a :class:`FitResult` on rank 0, ``None`` elsewhere.

    Example:
        >>> result = HorovodRunner(np=2).run(  # doctest: +SKIP
        ...     fit, build_model=build_model, data=data, epochs=5, batch_size=64,
        ...     loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    """
    cfg = FitConfig(
        epochs=epochs, batch_size=batch_size, loss=loss, optimizer=optimizer, learning_rate=learning_rate,
        metrics=tuple(metrics), warmup_epochs=warmup_epochs, checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints, shuffle=shuffle, seed=seed,
        log_model=log_model, registered_model_name=registered_model_name, verbose=verbose,
        callbacks=tuple(callbacks),
    )  # fmt: skip
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    from hvdrunner import tracking
    from hvdrunner._checkpoint import CheckpointStore
    from hvdrunner.keras import MLflowCallback

    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    tf.keras.utils.set_random_seed(cfg.seed)

    model = build_model()
    if not isinstance(model, tf.keras.Model):
        raise TypeError(
            NOT_KERAS.format(kind=f"{type(model).__module__}.{type(model).__qualname__}")
        )
    scaled_lr = cfg.learning_rate * hvd.size()
    opt = hvd.DistributedOptimizer(_make_optimizer(cfg.optimizer, scaled_lr))
    model.compile(optimizer=opt, loss=cfg.loss, metrics=list(cfg.metrics))
    opt.build(model.trainable_variables)  # optimizer state exists before restore/broadcast

    store = (
        CheckpointStore(cfg.checkpoint_dir, cfg.keep_checkpoints) if cfg.checkpoint_dir else None
    )
    initial_epoch = 0
    if store is not None and is_rank0():
        latest = store.latest()
        if latest is not None:
            initial_epoch = store.restore(latest[1], model, opt)
            print(f"[hvdrunner] resuming after epoch {initial_epoch} from {latest[1]}", flush=True)
    initial_epoch = int(
        hvd_tf.broadcast_object(initial_epoch, root_rank=0, name="hvdrunner.initial_epoch")
    )
    hvd_tf.broadcast_variables(model.variables + list(opt.variables), root_rank=0)

    steps = data.steps_per_epoch(cfg.batch_size)
    cbs: list[Any] = [hvd.callbacks.MetricAverageCallback()]
    if cfg.warmup_epochs:
        cbs.append(hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=scaled_lr, warmup_epochs=cfg.warmup_epochs, steps_per_epoch=steps, verbose=0))  # fmt: skip
    cbs.append(MLflowCallback())
    if store is not None:
        cbs.append(_checkpoint_callback(store, opt, cfg.checkpoint_every, cfg.epochs))
    cbs.extend(cfg.callbacks)
    tracking.log_params(
        {"epochs": cfg.epochs, "batch_size_per_rank": cfg.batch_size, "num_ranks": hvd.size(),
         "learning_rate": cfg.learning_rate, "scaled_learning_rate": scaled_lr,
         "warmup_epochs": cfg.warmup_epochs, "optimizer": getattr(cfg.optimizer, "__name__", cfg.optimizer),
         "initial_epoch": initial_epoch, "steps_per_epoch": steps, "rows": data.num_rows}
    )  # fmt: skip
    with data.tf_dataset(
        cfg.batch_size, shuffle=cfg.shuffle, seed=cfg.seed, first_epoch=initial_epoch
    ) as ds:
        history = model.fit(
            ds, steps_per_epoch=steps, epochs=cfg.epochs, initial_epoch=initial_epoch,
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


def _checkpoint_callback(store: Any, optimizer: Any, every: int, epochs: int) -> Any:
    """Rank 0 saves every ``every`` epochs and after the last one."""
    import tensorflow as tf

    class CheckpointCallback(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            done = epoch + 1
            if is_rank0() and (done % every == 0 or done == epochs):
                store.save(self.model, optimizer, done)

    return CheckpointCallback()
