"""The one recipe of ``fit``, for every framework: the order of its steps, and what each
framework supplies (:class:`Framework`).

    init → build → restore (rank 0) → broadcast → feed → params → train → model → result

``hvdrunner.keras.fit`` and ``hvdrunner.torch.fit`` are this recipe with their framework's
parts: how to build and distribute the model, how to feed and run the epochs, how to save
the model. A change to *how fit works* is made here, once.

Example:
    >>> result = run(KerasParts(), cfg, build_model, data, validation)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from hvdrunner import tracking
from hvdrunner.core.checkpoint import check_dir, resume
from hvdrunner.core.ledger import MetricLedger
from hvdrunner.core.settings import FitResult, TrainingSettings
from hvdrunner.distributed import is_rank0

#: A fit's own settings: :class:`TrainingSettings` and its framework's fields.
C = TypeVar("C", bound=TrainingSettings)


@dataclass
class Built:
    """What a framework built: the model, its distributed optimizer, the scaled rate, and
    anything else its epochs need (``extra``)."""

    model: Any
    optimizer: Any
    lr: float
    extra: Any = None


@dataclass(frozen=True)
class FitRun(Generic[C]):
    """One fit as its epochs see it, made once by :func:`run`: the framework's ``train``
    takes this value, not its fields one by one."""

    built: Built
    cfg: C
    feed: Any  # this rank's input (Framework.feed)
    validation: Any  # prepared validation data, or None
    steps: int  # steps per epoch, equal on every rank
    store: Any  # the framework's checkpoint store, or None without checkpoint_dir
    initial_epoch: int  # 0, or the epoch a resume starts at
    ledger: MetricLedger


class Framework(Protocol[C]):
    """A framework's parts of :func:`run`, for its own settings ``C``."""

    def init(self, cfg: C) -> Any:
        """``hvd.init()``, this rank's device and seed; Horovod's module (``size``,
        ``broadcast_object``)."""

    def build(self, build_model: Callable[[], Any], cfg: C, size: int) -> Built: ...

    def store(self, cfg: C) -> Any:
        """The checkpoint store of ``cfg.checkpoint_dir`` (called only when one is set)."""

    def broadcast(self, built: Built) -> None:
        """Model and optimizer state from rank 0 to every rank."""

    def feed(self, data: Any, cfg: C, initial_epoch: int) -> tuple[int, int, Any]:
        """``(steps_per_epoch, rows, input)``: this rank's shard, equal steps everywhere."""

    def params(self, cfg: C) -> dict[str, Any]:
        """The framework's own MLflow params, beside :meth:`TrainingSettings.run_params`."""

    def train(self, run: FitRun[C]) -> tuple[dict[str, list[Any]], Any]:
        """Epochs ``run.initial_epoch..`` with averaged metrics, rank-0 progress, checkpoints
        when :func:`checkpoint_due`; the history and a few input rows. Each epoch's averaged
        metrics go to ``run.ledger.epoch_end``; a checkpoint is saved with
        ``ledger.carried()``, then ``ledger.saved()``."""

    def log_model(self, model: Any, cfg: C, example: Any) -> str | None: ...


def run(
    framework: Framework[C],
    cfg: C,
    build_model: Callable[[], Any],
    data: Any,
    validation: Any,
) -> FitResult | None:
    """``fit``: every step in its order; a :class:`FitResult` on rank 0, ``None`` elsewhere."""
    hvd = framework.init(cfg)
    built = framework.build(build_model, cfg, hvd.size())
    store = framework.store(cfg) if cfg.checkpoint_dir else None
    ledger = MetricLedger(durable=store is not None)
    initial_epoch = resume(store, built.model, built.optimizer, hvd.broadcast_object, ledger)
    framework.broadcast(built)
    steps, rows, feed = framework.feed(data, cfg, initial_epoch)
    # "horovod": which Horovod trained (hvdrunner's engine, or a compiled horovod)
    tracking.log_params(cfg.run_params(hvd.size(), built.lr, steps, rows)
                        | {"optimizer": _name(getattr(cfg, "optimizer", None)),
                           "horovod": getattr(hvd, "__name__", type(hvd).__name__)}
                        | framework.params(cfg))  # fmt: skip
    # Changes on every resume of the same run: a tag, not a param (params are immutable).
    tracking.set_tags({"hvdrunner.initial_epoch": initial_epoch})
    history, example = framework.train(
        FitRun(built, cfg, feed, validation, steps, store, initial_epoch, ledger)
    )
    model_uri = None
    if cfg.log_model and example is not None:
        model_uri = framework.log_model(built.model, cfg, example)
    if not is_rank0():
        return None
    return FitResult(
        history={k: [float(v) for v in vs] for k, vs in history.items()},
        model_uri=model_uri, initial_epoch=initial_epoch, epochs=cfg.epochs,
        steps_per_epoch=steps, num_ranks=hvd.size(),
    )  # fmt: skip


def checkpoint_due(done: int, every: int, epochs: int) -> bool:
    """Rank 0 saves after epoch ``done`` (1-based) every ``every`` epochs and after the last.

    Example:
        >>> [d for d in range(1, 6) if checkpoint_due(d, 2, 5)]
        [2, 4, 5]
    """
    return done % every == 0 or done == epochs


def save_checkpoint(
    store: Any, ledger: MetricLedger, model: Any, optimizer: Any, done: int
) -> None:
    """Rank 0: checkpoint ``done`` carrying the epochs' metrics not logged yet, then log them
    (now durable). Both fits' checkpoint step."""
    store.save(model, optimizer, done, metrics=ledger.carried())
    ledger.saved()


def preflight(
    kwargs: dict[str, Any], name: str, inputs: tuple[str, ...],
    make_config: Callable[[Any, dict[str, Any]], TrainingSettings],
) -> tuple[dict[str, Any], TrainingSettings]:  # fmt: skip
    """Driver side, before any rank starts: the inputs and the validated settings of ``fit``
    ``name``; a usable ``checkpoint_dir`` and registered model name. The framework then
    checks its inputs and hands :func:`validated` to the ranks."""
    missing = [k for k in ("build_model", "data") if k not in kwargs]
    if missing:
        raise TypeError(f"{name}() missing required argument(s): {', '.join(missing)}")
    given = {k: kwargs.pop(k, None) for k in inputs}
    cfg = make_config(kwargs.pop("config", None), kwargs)
    tracking.check_registered_model_name(cfg.registered_model_name)
    if cfg.checkpoint_dir:
        check_dir(cfg.checkpoint_dir)
    return given, cfg


def validated(inputs: dict[str, Any], cfg: TrainingSettings) -> dict[str, Any]:
    """``fit``'s arguments as the ranks receive them: the inputs and the config the driver
    validated (each rank uses it as it is: one validation per job)."""
    return {**{k: v for k, v in inputs.items() if v is not None}, "config": cfg}


def _name(spec: Any) -> Any:
    return getattr(spec, "__name__", spec)


__all__ = [
    "Built", "FitRun", "Framework", "checkpoint_due", "preflight", "run", "save_checkpoint",
    "validated",
]  # fmt: skip
