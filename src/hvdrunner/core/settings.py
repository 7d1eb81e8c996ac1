"""The settings every framework's ``fit`` shares: one frozen base, one validator, the result.

:class:`TrainingSettings` holds what data-parallel training means whatever the framework
(epochs, batch size, the learning-rate rules, checkpoints, the gradient-exchange knobs);
``hvdrunner.keras.FitConfig`` and ``hvdrunner.torch.FitConfig`` add their own fields.
:func:`make_config` is the one entry from keyword arguments: under ``HorovodRunner`` it runs
once, on the driver before launch (``fit``'s preflight), and every rank uses that config as
it is; a ``fit`` called in a process of your own validates its arguments there; :func:`fit_signature` makes a ``fit``'s signature from its
config, so a setting is declared, defaulted and checked in one place.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True, kw_only=True)
    ... class Cfg(TrainingSettings):
    ...     pass
    >>> make_config(Cfg, None, {"epochs": 2, "batch_size": 32}, "fit").learning_rate
    0.001
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from hvdrunner._checks import is_int, is_number

C = TypeVar("C", bound="TrainingSettings")


def check_passes(value: Any) -> None:
    """``backward_passes_per_step`` must be a positive int (1 = exchange every batch)."""
    if not is_int(value, at_least=1):
        raise ValueError(
            f"backward_passes_per_step must be an int >= 1 (1 = exchange every batch; N = "
            f"accumulate N batches locally, then exchange once), got {value!r}"
        )


def check_named(kind: str, value: Any, names: tuple[str, ...], example: str) -> None:
    """A setting that is one of ``names`` (any case) or a callable; ValueError naming it.

    Example:
        >>> check_named("optimizer", "adam", ("adam", "sgd"), "optimizer=my_factory")
    """
    if callable(value):
        return
    if not isinstance(value, str) or value.lower() not in names:
        raise ValueError(
            f"{kind}={value!r} is not one of {names}; pass one of those or a callable, "
            f"e.g. {example}"
        )


def check_verbose(value: Any) -> None:
    """``verbose`` of every ``fit``: 0 (silent), 1 or 2 - an int, never a bool."""
    if not is_int(value, at_least=0) or value > 2:  # True == 1 to Python: refused
        raise ValueError(f"verbose must be 0 (silent), 1 or 2, got {value!r}")


def _positive_int(name: str, value: Any) -> None:
    if not is_int(value, at_least=1):
        raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class TrainingSettings:
    """Framework-neutral settings of a data-parallel ``fit`` (validated at construction).

    Attributes:
        epochs: passes over the data (required).
        batch_size: rows per step on each rank (required); the global batch is
            ``batch_size`` times the ranks.
        learning_rate: before scaling by the number of ranks. Default ``1e-3``.
        warmup_epochs: linear warmup of the scaled rate over this many epochs. Default ``0``.
        checkpoint_dir: rank 0's checkpoints (a volume on Databricks); a rerun or restart
            resumes from the newest intact one. Default ``None`` (none).
        checkpoint_every: epochs between checkpoints. Default ``1``.
        keep_checkpoints: how many are kept. Default ``3``.
        shuffle: a new permutation of each rank's shard every epoch. Default ``True``.
        seed: of the shuffle and the model's initialisation. Default ``0``.
        log_model: log the model to the driver's MLflow run at the end. Default ``True``.
        registered_model_name: also register it (Unity Catalog:
            ``<catalog>.<schema>.<model>``). Default ``None``.
        compression: ``"none"`` or ``"fp16"`` (gradients sent as float16). Default ``"none"``.
        backward_passes_per_step: batches accumulated locally per exchange. Default ``1``.
        fusion_threshold_mb: Horovod's tensor fusion buffer. Default ``None`` (Horovod's).
        cycle_time_ms: Horovod's cycle time. Default ``None`` (Horovod's).
        in_memory: keep the shard in memory (``None``: when it fits the budget). Default
            ``None``.
    """

    epochs: int
    batch_size: int
    learning_rate: float = 1e-3
    warmup_epochs: int = 0
    checkpoint_dir: str | None = None
    checkpoint_every: int = 1
    keep_checkpoints: int = 3
    shuffle: bool = True
    seed: int = 0
    log_model: bool = True
    registered_model_name: str | None = None
    compression: str = "none"
    backward_passes_per_step: int = 1
    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    in_memory: bool | None = None  # None: keep the shard in memory when it fits the budget

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "checkpoint_every", "keep_checkpoints"):
            _positive_int(name, getattr(self, name))
        if not is_int(self.warmup_epochs, at_least=0):
            raise ValueError(
                f"warmup_epochs must be an int >= 0 (0 = no warmup), got {self.warmup_epochs!r}"
            )
        if not is_number(self.learning_rate, above=0):  # True is an int to Python, not a rate
            raise ValueError(f"learning_rate must be a positive number, got {self.learning_rate!r}")
        if self.compression not in ("none", "fp16"):
            raise ValueError(
                f"compression must be 'none' or 'fp16' (gradients sent as float16), got "
                f"{self.compression!r}"
            )
        check_passes(self.backward_passes_per_step)
        if self.in_memory not in (None, True, False):
            raise ValueError(
                f"in_memory must be None (auto), True or False, got {self.in_memory!r}"
            )
        for name in ("fusion_threshold_mb", "cycle_time_ms"):
            value = getattr(self, name)
            if value is not None and not is_number(value, at_least=0):
                raise ValueError(
                    f"{name} must be a number >= 0 or None (Horovod's default), got {value!r}"
                )

    def run_params(self, size: int, lr: float, steps: int, rows: int) -> dict[str, Any]:
        """The MLflow params every framework's fit logs (the adapter adds its own)."""
        return {
            "epochs": self.epochs, "batch_size_per_rank": self.batch_size, "num_ranks": size,
            "learning_rate": self.learning_rate, "scaled_learning_rate": lr,
            "warmup_epochs": self.warmup_epochs, "steps_per_epoch": steps, "rows": rows,
            "compression": self.compression,
            "backward_passes_per_step": self.backward_passes_per_step,
            "fusion_threshold_mb": self.fusion_threshold_mb, "cycle_time_ms": self.cycle_time_ms,
        }  # fmt: skip


@dataclass(frozen=True)
class FitResult:
    """What rank 0's ``fit`` returns: small and picklable."""

    history: dict[str, list[float]]  # averaged over ranks, one value per epoch run
    model_uri: str | None  # runs:/… when the driver had an MLflow run
    initial_epoch: int  # > 0 when resumed from a checkpoint
    epochs: int
    steps_per_epoch: int
    num_ranks: int


def make_config(
    cls: type[C],
    config: C | None,
    settings: Mapping[str, Any],
    fn_name: str,
    tuples: tuple[str, ...] = (),
) -> C:
    """``config`` (or the defaults) with ``settings`` applied, validated; the one entry.

    Raises:
        TypeError: an unknown setting, or a required one missing (naming ``fn_name``).
        ValueError: a setting out of range (from ``cls``).
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(settings) - set(fields))
    if unknown:
        raise TypeError(f"{fn_name}() got unexpected argument(s) {unknown}; see help({fn_name})")
    values: dict[str, Any] = {k: tuple(v) if k in tuples else v for k, v in settings.items()}
    if config is not None:
        # A config validated once (on the driver, by fit's preflight) is used as it is.
        return dataclasses.replace(config, **values) if values else config
    missing = [
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
        and name not in values
    ]
    if missing:
        raise TypeError(f"{fn_name}() missing required argument(s): {', '.join(missing)}")
    return cls(**values)


def fit_signature(fn: Callable[..., Any], cls: type) -> inspect.Signature:
    """``fn``'s inputs, then one keyword per field of ``cls``: help() and IDEs show them all."""

    def default(f: dataclasses.Field[Any]) -> Any:
        if f.default is not dataclasses.MISSING:
            return f.default
        if f.default_factory is not dataclasses.MISSING:
            return f.default_factory()
        return inspect.Parameter.empty

    own = inspect.signature(fn)
    inputs = [p for p in own.parameters.values() if p.kind != p.VAR_KEYWORD]
    settings = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default(f),
                          annotation=f.type)
        for f in dataclasses.fields(cls)
    ]  # fmt: skip
    return own.replace(parameters=[*inputs, *settings])


def cpu_threads(local_size: int, num_threads: int | None = None) -> int:
    """A CPU rank's share of this host's cores (``num_threads`` if given), so that the
    host's ranks do not fight over every core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return num_threads or max(1, (cores or 1) // local_size)


def horovod_env(cfg: TrainingSettings, initialized: bool) -> None:
    """Fusion/cycle settings are read by ``hvd.init()``: set them first, or refuse."""
    env = {}
    if cfg.fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(cfg.fusion_threshold_mb * 1024 * 1024))
    if cfg.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = str(cfg.cycle_time_ms)
    if env and initialized:
        raise RuntimeError(
            "fusion_threshold_mb/cycle_time_ms are read by hvd.init(), which already ran in "
            "this rank: do not call hvd.init() before fit, or set "
            f"{', '.join(env)} in the environment instead"
        )
    os.environ.update(env)
