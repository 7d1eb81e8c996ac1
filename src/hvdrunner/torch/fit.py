"""``hvdrunner.torch.fit``: a plain supervised PyTorch model trained data-parallel in one call.

Built from this package's pieces (:mod:`~hvdrunner.torch.collectives`,
:mod:`~hvdrunner.torch.inputs`, :mod:`~hvdrunner.torch.checkpoint`) and the framework-neutral
core (settings, LR rules, checkpoint integrity, sync check) the Keras side uses too. The
settings are :class:`~hvdrunner.torch.config.FitConfig`'s fields (``fit``'s signature is
generated from them); the work is a few named steps, each a function below or in
:mod:`~hvdrunner.torch.loop`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hvdrunner import tracking
from hvdrunner.core import schedule
from hvdrunner.core.checkpoint import check_dir, resume
from hvdrunner.core.settings import fit_signature, horovod_env
from hvdrunner.distributed import is_rank0
from hvdrunner.torch import collectives, loop
from hvdrunner.torch.checkpoint import CheckpointStore
from hvdrunner.torch.config import INPUTS, FitConfig, FitResult, make_config
from hvdrunner.torch.models import log_model

__all__ = ["FitConfig", "FitResult", "fit"]

NOT_TORCH = (
    "build_model returned a {kind}, not a torch.nn.Module. Horovod data parallelism averages "
    "the gradients of a model trained by gradient descent; for scikit-learn-like estimators "
    "use Spark MLlib (pyspark.ml) or a hyperparameter search over Spark instead."
)


def fit(
    build_model: Callable[[], Any],
    data: Any,
    *,
    validation: Any = None,
    config: FitConfig | None = None,
    **settings: Any,
) -> FitResult | None:
    """Train ``build_model()`` (a ``torch.nn.Module``) data-parallel; run it with HorovodRunner.

    Settings are keyword arguments (the fields of :class:`FitConfig`: ``epochs``,
    ``batch_size``, ``loss`` required) or a whole ``config=FitConfig(...)``.

    In this order: ``hvd.init()``; this rank's GPU (or a share of the host's CPU cores);
    build the model (``TypeError`` if it is not a ``torch.nn.Module``); the optimizer at
    ``learning_rate`` scaled by the number of ranks, with a per-batch linear warmup over
    ``warmup_epochs``, averaging gradients over ranks (``compression``,
    ``backward_passes_per_step``: the loss is divided by N, so N batches' gradients are
    averaged, as on the Keras side); rank 0 restores the newest intact checkpoint; model and
    optimizer state broadcast from rank 0; this rank's shard of ``data``
    (:func:`hvdrunner.data.prepare`) with equal steps on every rank, reshuffled per epoch;
    loss and ``metrics`` averaged over ranks each epoch (``validation`` adds ``val_*``);
    after the first epoch, a check that all ranks hold identical weights
    (:class:`~hvdrunner.errors.RanksOutOfSyncError`); one line per epoch from rank 0; rank 0
    checkpoints every ``checkpoint_every`` epochs and logs params, averaged metrics and the
    model (``mlflow.pytorch``, with a signature) into the driver's MLflow run. Returns a
    :class:`FitResult` on rank 0, ``None`` elsewhere.

    ``loss``: ``"cross_entropy"`` (integer labels), ``"mse"``, ``"l1"``,
    ``"bce_with_logits"`` or a callable ``(output, target) -> scalar tensor``.
    ``optimizer``: ``"adam"``, ``"sgd"``, ``"adamw"``, ``"rmsprop"`` or ``(params, lr) ->
    torch.optim.Optimizer``. ``metrics``: ``"accuracy"`` or callables like the loss.
    ``in_memory``: as in :func:`hvdrunner.torch.batches` (``None`` = keep the shard in
    memory when it fits). ``num_threads``: torch CPU threads per rank (``None``: the host's
    cores shared out between its ranks).

    Example:
        >>> result = HorovodRunner(np=2).run(  # doctest: +SKIP
        ...     fit, build_model=build_model, data=data, epochs=5, batch_size=64,
        ...     loss="cross_entropy", metrics=["accuracy"])
    """
    cfg = make_config(config, settings)
    hvd, device = _init_horovod(cfg)
    model, opt, lr = _build(build_model, cfg, hvd.size(), device)
    group_lrs = [float(g["lr"]) for g in opt.param_groups]  # before a restore overwrites them
    store, initial_epoch = _restore(cfg, model, opt, hvd)
    collectives.broadcast_state(model, opt)
    steps = data.steps_per_epoch(cfg.batch_size)
    _log_params(cfg, hvd.size(), lr, steps, data.num_rows, initial_epoch)
    trainer = loop.Trainer(model, opt, cfg, lr, device, steps, store, group_lrs)
    history, example = trainer.run(data, validation, initial_epoch)
    model_uri = _log_model(model, cfg, example)
    if not is_rank0():
        return None
    return FitResult(
        history=history, model_uri=model_uri, initial_epoch=initial_epoch, epochs=cfg.epochs,
        steps_per_epoch=steps, num_ranks=hvd.size(),
    )  # fmt: skip


fit.__signature__ = fit_signature(fit, FitConfig)  # type: ignore[attr-defined]


def _init_horovod(cfg: FitConfig) -> tuple[Any, torch.device]:
    import horovod.torch as hvd

    horovod_env(cfg, hvd.is_initialized())
    return hvd, collectives.init(cfg.seed, cfg.num_threads)


def _make_optimizer(spec: Any, params: Any, lr: float) -> torch.optim.Optimizer:
    if callable(spec):
        return spec(params, lr)
    return {
        "adam": torch.optim.Adam,
        "sgd": torch.optim.SGD,
        "adamw": torch.optim.AdamW,
        "rmsprop": torch.optim.RMSprop,
    }[spec.lower()](params, lr=lr)


def _build(
    build_model: Callable[[], Any], cfg: FitConfig, size: int, device: torch.device
) -> tuple[torch.nn.Module, Any, float]:
    """The model on its device, its gradient-averaging optimizer, the scaled LR."""
    model = build_model()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            NOT_TORCH.format(kind=f"{type(model).__module__}.{type(model).__qualname__}")
        )
    model = model.to(device)
    lr = schedule.scaled_lr(cfg.learning_rate, size)
    opt = collectives.distributed_optimizer(
        _make_optimizer(cfg.optimizer, model.parameters(), lr), model,
        compression=cfg.compression, backward_passes_per_step=cfg.backward_passes_per_step,
    )  # fmt: skip
    return model, opt, lr


def _restore(cfg: FitConfig, model: Any, opt: Any, hvd: Any) -> tuple[Any, int]:
    """Rank 0 loads the newest intact checkpoint; every rank learns the epoch to start at."""
    store = (
        CheckpointStore(cfg.checkpoint_dir, cfg.keep_checkpoints) if cfg.checkpoint_dir else None
    )
    return store, resume(store, model, opt, hvd.broadcast_object)


def _log_params(
    cfg: FitConfig, size: int, lr: float, steps: int, rows: int, initial_epoch: int
) -> None:
    loss = (
        getattr(cfg.loss, "__name__", type(cfg.loss).__name__) if callable(cfg.loss) else cfg.loss
    )
    tracking.log_params(
        cfg.run_params(size, lr, steps, rows)
        | {"optimizer": getattr(cfg.optimizer, "__name__", cfg.optimizer), "loss": loss,
           "torch": torch.__version__}
    )  # fmt: skip
    tracking.set_tags({"hvdrunner.initial_epoch": initial_epoch})


def _log_model(model: torch.nn.Module, cfg: FitConfig, example: Any) -> str | None:
    """The model with a signature from a few training rows, into the run (rank 0)."""
    if not cfg.log_model or example is None:
        return None
    return log_model(model, example, registered_name=cfg.registered_model_name)


def _preflight(**kwargs: Any) -> None:
    """Driver side, before any rank starts: every argument validated, checkpoint_dir usable."""
    missing = [k for k in ("build_model", "data") if k not in kwargs]
    if missing:
        raise TypeError(f"hvdrunner.torch.fit() missing required argument(s): {', '.join(missing)}")
    inputs = {k: kwargs.pop(k, None) for k in INPUTS}
    cfg = make_config(kwargs.pop("config", None), kwargs)
    tracking.check_registered_model_name(cfg.registered_model_name)
    if cfg.checkpoint_dir:
        check_dir(cfg.checkpoint_dir)
    for name in ("data", "validation"):
        value = inputs[name]
        if value is not None and not hasattr(value, "steps_per_epoch"):
            raise TypeError(
                f"{name} must be prepared input (hvdrunner.data.prepare(df, ...)); got "
                f"{type(value).__name__}. For your own DataLoader, write the loop with "
                f"hvdrunner.torch's pieces (init, distributed_optimizer, broadcast_state)."
            )
        if value is not None and value.label is None:
            raise ValueError(
                f"{name} has no label column: prepare it with label='<column>' (fit trains "
                f"a supervised model: loss(model(x), y))"
            )


fit.hvdrunner_preflight = _preflight  # type: ignore[attr-defined]
