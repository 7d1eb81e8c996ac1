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

from hvdrunner import _horovod_knobs
from hvdrunner.core import recipe, schedule
from hvdrunner.core.settings import fit_signature, horovod_env
from hvdrunner.torch import collectives, loop
from hvdrunner.torch.checkpoint import CheckpointStore
from hvdrunner.torch.config import INPUTS, FitConfig, FitResult, make_config
from hvdrunner.torch.models import log_model
from hvdrunner.torch.options import OPTIMIZERS

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
    return recipe.run(_Torch(), cfg, build_model, data, validation)


fit.__signature__ = fit_signature(fit, FitConfig)  # type: ignore[attr-defined]


class _Torch:
    """PyTorch's parts of the one fit recipe (:mod:`hvdrunner.core.recipe`)."""

    device: torch.device

    def init(self, cfg: FitConfig) -> Any:
        hvd = collectives.engine_module()
        horovod_env(cfg, hvd.is_initialized())
        if cfg.bucket_cap_mb > 0:  # the gradients go out as grouped buckets
            _horovod_knobs.for_grouped_requests()
        self.device = collectives.init(cfg.seed, cfg.num_threads)
        return hvd

    def build(self, build_model: Callable[[], Any], cfg: FitConfig, size: int) -> recipe.Built:
        model, opt, lr = _build(build_model, cfg, size, self.device)
        # Each group's rate as built, before a restore overwrites it (mid-warmup perhaps).
        return recipe.Built(model, opt, lr, extra=[float(g["lr"]) for g in opt.param_groups])

    def store(self, cfg: FitConfig) -> CheckpointStore:
        assert cfg.checkpoint_dir is not None  # the recipe asks only when one is set
        return CheckpointStore(cfg.checkpoint_dir, cfg.keep_checkpoints)

    def broadcast(self, built: recipe.Built) -> None:
        collectives.broadcast_state(built.model, built.optimizer)

    def feed(self, data: Any, cfg: FitConfig, initial_epoch: int) -> tuple[int, int, Any]:
        return data.steps_per_epoch(cfg.batch_size), data.num_rows, data

    def params(self, cfg: FitConfig) -> dict[str, Any]:
        loss = cfg.loss
        name = getattr(loss, "__name__", type(loss).__name__) if callable(loss) else loss
        return {"loss": name, "torch": torch.__version__}

    def train(self, run: recipe.FitRun[FitConfig]) -> tuple[dict[str, list[Any]], Any]:
        return loop.Trainer(run, self.device).run()

    def log_model(self, model: Any, cfg: FitConfig, example: Any) -> str | None:
        return log_model(model, example, registered_name=cfg.registered_model_name)


def _make_optimizer(spec: Any, params: Any, lr: float) -> torch.optim.Optimizer:
    if callable(spec):
        return spec(params, lr)
    return OPTIMIZERS[spec.lower()](params, lr=lr)


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
        bucket_cap_mb=cfg.bucket_cap_mb,
    )  # fmt: skip
    return model, opt, lr


def _preflight(**kwargs: Any) -> dict[str, Any]:
    """Driver side, before any rank starts: every argument validated, checkpoint_dir usable;
    the arguments the ranks receive (the validated config among them)."""
    inputs, cfg = recipe.preflight(kwargs, "hvdrunner.torch.fit", INPUTS, make_config)
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
    return recipe.validated(inputs, cfg)


fit.hvdrunner_preflight = _preflight  # type: ignore[attr-defined]
