"""Decoding on the ranks: petastorm's ``TransformSpec``, applied to each batch, checked.

A batch is ``{column: numpy array}``. :func:`apply` hands the transform a pandas DataFrame of
it (array columns as one numpy array per row, binary columns as ``bytes``, strings as
``str``, as petastorm does), and turns the DataFrame it returns back into arrays, checking
every column against what ``edit_fields`` declares (dtype and per-row shape) or, for a
column it does not declare, against the column it came from: a wrong dtype, shape, row
count or a missing column fails at the first batch, naming the column and what was
expected. Nothing is cast or reshaped silently. :func:`map_ahead` runs it on several
batches at once, in threads, ahead of the model (image decoders and numpy release the GIL).

Example:
    >>> import numpy as np
    >>> spec = TransformSpec(lambda df: df.assign(x=df.x * 2),
    ...                      edit_fields=[("x", np.float32, (), False)])
    >>> apply(spec, {"x": np.ones(3, np.float32)})["x"].tolist()
    [2.0, 2.0, 2.0]
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Field:
    """A column a transform produces: numpy dtype and per-row shape (``None``: any length
    along that axis, which must still be the same for every row of a batch)."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | None, ...]
    declared: bool = True  # in edit_fields; False: an input column passed through
    text: str | None = None  # "str" or "bytes": petastorm's np.str_ / np.bytes_ (as objects)


@dataclass(frozen=True, init=False)
class TransformSpec:
    """petastorm's ``TransformSpec``: a function over each batch and the columns it makes.

    Args:
        func: ``pandas.DataFrame -> pandas.DataFrame``, called on every batch on the ranks
            (``None``: only select/remove columns).
        edit_fields: the columns ``func`` adds or changes, each ``(name, numpy dtype, shape,
            nullable)`` (petastorm's form; a ``UnischemaField`` works too).
        removed_fields: columns dropped after ``func``.
        selected_fields: the columns kept, in this order (``None``: all that remain).

    Example:
        >>> spec = TransformSpec(decode, edit_fields=[("features", np.float32, (224, 224, 3), False)],  # doctest: +SKIP
        ...                      selected_fields=["features", "label_index"])
    """

    func: Callable[[Any], Any] | None
    edit_fields: tuple[Field, ...]
    removed_fields: tuple[str, ...]
    selected_fields: tuple[str, ...] | None
    _names: tuple[str, ...] = field(default=(), repr=False)

    def __init__(
        self,
        func: Callable[[Any], Any] | None = None,
        edit_fields: Iterable[Any] | None = None,
        removed_fields: Iterable[str] | None = None,
        selected_fields: Iterable[str] | None = None,
    ) -> None:
        if func is not None and not callable(func):
            raise TypeError(
                f"TransformSpec func must be callable (a DataFrame -> DataFrame), got {func!r}"
            )
        fields = tuple(_field(f) for f in (edit_fields or ()))
        object.__setattr__(self, "func", func)
        object.__setattr__(self, "edit_fields", fields)
        object.__setattr__(self, "removed_fields", tuple(removed_fields or ()))
        object.__setattr__(self, "selected_fields",
                           None if selected_fields is None else tuple(selected_fields))  # fmt: skip

    def variable_axes(self) -> dict[str, tuple[int, ...]]:
        """The axes of a batch (0: the rows) that vary from batch to batch: those its
        ``edit_fields`` declare ``None`` (one length within a batch, any across batches).

        Example:
            >>> TransformSpec(edit_fields=[("tokens", np.int64, (None,), False)]).variable_axes()
            {'tokens': (1,)}
        """
        return {f.name: tuple(i + 1 for i, n in enumerate(f.shape) if n is None)
                for f in self.edit_fields if None in f.shape}  # fmt: skip

    def output_names(self, inputs: Sequence[str]) -> tuple[str, ...]:
        """The columns a batch has after the transform, in order (petastorm's rule: the
        selected ones; else the inputs and new edited columns, less the removed ones)."""
        if self.selected_fields is not None:
            return self.selected_fields
        names = list(inputs) + [f.name for f in self.edit_fields if f.name not in inputs]
        return tuple(n for n in names if n not in self.removed_fields)


def _field(spec: Any) -> Field:
    """A ``(name, dtype, shape, nullable)`` tuple or a petastorm ``UnischemaField``."""
    if hasattr(spec, "numpy_dtype") and hasattr(spec, "name"):
        name, dtype, shape = spec.name, spec.numpy_dtype, spec.shape
    else:
        try:
            name, dtype, shape = spec[0], spec[1], spec[2]
        except (TypeError, IndexError):
            raise ValueError(
                f"edit_fields item {spec!r}: pass (name, numpy dtype, shape, nullable), e.g. "
                f"('features', np.float32, (224, 224, 3), False)"
            ) from None
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as exc:
        raise ValueError(f"edit_fields {name!r}: {dtype!r} is not a numpy dtype") from exc
    if np_dtype.kind in "US":  # petastorm's np.str_ / np.bytes_: Python objects in a batch
        text = "str" if np_dtype.kind == "U" else "bytes"
        return Field(str(name), np.dtype(object), tuple(shape or ()), text=text)
    return Field(str(name), np_dtype, tuple(shape or ()))


def apply(spec: TransformSpec, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``spec`` on one batch; the checked arrays, in :meth:`TransformSpec.output_names` order.

    Raises:
        TypeError: ``func`` did not return a DataFrame.
        ValueError: a column is missing, has another row count, dtype or shape than declared.
    """
    import pandas as pd

    rows = len(next(iter(batch.values())))
    frame = pd.DataFrame({k: list(v) if v.ndim > 1 else v for k, v in batch.items()})
    out = frame if spec.func is None else spec.func(frame)
    if not isinstance(out, pd.DataFrame):
        raise TypeError(
            f"the TransformSpec's func returned {type(out).__name__}, not a pandas DataFrame: "
            f"return the batch's DataFrame with its columns changed"
        )
    if len(out) != rows:
        raise ValueError(
            f"the TransformSpec's func returned {len(out)} rows for {rows}: it must "
            f"keep every row (filter rows in Spark before prepare(): every rank must run the "
            f"same steps)"
        )
    declared = {f.name: f for f in spec.edit_fields}
    result = {}
    for name in spec.output_names(list(batch)):
        if name not in out.columns:
            raise ValueError(
                f"the TransformSpec names column {name!r}, but the transform's output has only "
                f"{list(out.columns)}"
            )
        want = declared.get(name) or _as_input(name, batch)
        result[name] = _column(name, out[name], want)
    return result


def _as_input(name: str, batch: dict[str, np.ndarray]) -> Field:
    if name not in batch:
        raise ValueError(
            f"column {name!r} is made by the transform but not declared: add "
            f"({name!r}, <numpy dtype>, <shape per row>, False) to edit_fields"
        )
    arr = batch[name]
    return Field(name, arr.dtype, arr.shape[1:], declared=False)


def _column(name: str, series: Any, want: Field) -> np.ndarray:
    """A DataFrame column as one array of ``want``'s dtype and per-row shape, or ValueError."""
    values = series.to_numpy()
    if want.shape:
        cells = list(values)
        bad = next((c for c in cells if not _fits(np.shape(c), want.shape)), None)
        if bad is not None:
            raise ValueError(
                f"the transform's column {name!r} has a row of shape {np.shape(bad)}; "
                f"{_declared(want)} declares {want.shape}"
            )
        # Every row's type, not the first's: np.stack would widen a float64 row among
        # float32 ones, and the batch would say float32 while holding float64.
        kinds = [np.asarray(c).dtype for c in cells]
        row = next((i for i, k in enumerate(kinds) if k != want.dtype), None)
        if row is not None and len(set(kinds)) > 1:  # one row differs (all differ: below)
            raise ValueError(
                f"the transform's column {name!r} has a row of {kinds[row]} "
                f"(row {row} of the batch); {_declared(want)} declares {want.dtype} (cast it "
                f"in the transform, e.g. .astype(np.{want.dtype.name}))"
            )
        try:
            values = np.stack(cells)
        except ValueError as exc:  # rows of different lengths along a None axis
            raise ValueError(
                f"the transform's column {name!r} has rows of different shapes ({exc}): a "
                f"batch needs one"
            ) from exc
        dtype = values.dtype if not cells else kinds[0]
    elif want.text is not None:
        kind = str if want.text == "str" else bytes
        bad = next((v for v in values if not isinstance(v, kind)), None)
        if bad is not None or values.dtype.kind != "O":
            found = type(bad).__name__ if bad is not None else str(values.dtype)
            raise ValueError(
                f"the transform's column {name!r} holds {found}; edit_fields declares "
                f"np.{'str_' if kind is str else 'bytes_'}: every row must be a Python {kind.__name__}"
            )
        dtype = values.dtype
    else:
        dtype = values.dtype
        if dtype.kind == "O" and want.dtype.kind != "O":
            raise ValueError(
                f"the transform's column {name!r} holds Python objects (e.g. "
                f"{type(values[0]).__name__}); {_declared(want)} declares {want.dtype} (strings "
                f"and bytes: declare np.str_, np.bytes_ or object)"
            )
    if np.dtype(dtype) != want.dtype:
        raise ValueError(
            f"the transform's column {name!r} is {np.dtype(dtype)}; {_declared(want)} declares "
            f"{want.dtype} (cast it in the transform, e.g. .astype(np.{want.dtype.name}))"
        )
    return values


def _fits(shape: tuple[int, ...], want: tuple[int | None, ...]) -> bool:
    return len(shape) == len(want) and all(
        w is None or s == w for s, w in zip(shape, want, strict=True)
    )


def fed_columns(
    spec: Any, features: str | Sequence[str], label: str | None, columns: Sequence[str]
) -> tuple[str, ...]:
    """The ``features`` a feed transformed by ``spec`` gives the model, checked (with
    ``label``) against the columns ``spec`` makes of ``columns``: one rule for every handle's
    ``transformed`` (``PreparedData``, ``MdsData``).

    Raises:
        TypeError: ``spec`` is no ``TransformSpec``.
        ValueError: a feature or the label is not a column of the transform's output.

    Example:
        >>> fed_columns(TransformSpec(lambda df: df), "x", "y", ["x", "y"])
        ('x',)
    """
    if not isinstance(spec, TransformSpec):
        raise TypeError(f"pass a TransformSpec (hvdrunner.petastorm.TransformSpec), got {spec!r}")
    feats = (features,) if isinstance(features, str) else tuple(features)
    names = spec.output_names(list(columns))
    unknown = [n for n in [*feats, *([label] if label else [])] if n not in names]
    if unknown:
        raise ValueError(
            f"features/label {unknown} are not columns of the transform's output {list(names)}"
        )
    return feats


def as_fed(batch: dict[str, Any], features: Sequence[str], label: str | None, single: bool) -> Any:
    """A ``{column: array}`` batch as the model is fed: ``x`` or ``(x, label)``, where ``x``
    is the one feature column's array (``single``) or a dict of the feature columns.

    Example:
        >>> as_fed({"x": 1, "y": 2}, ["x"], "y", single=True)
        (1, 2)
    """
    x = batch[features[0]] if single else {f: batch[f] for f in features}
    return x if label is None else (x, batch[label])


def _declared(want: Field) -> str:
    return "edit_fields" if want.declared else "its input column (not in edit_fields)"


def map_ahead(fn: Callable[[T], R], items: Iterator[T], workers: int) -> Iterator[R]:
    """``fn`` over ``items`` in ``workers`` threads, up to ``workers`` results ahead of the
    consumer, in order. Stopping early cancels what is queued and leaves no thread."""
    if workers <= 1:
        yield from (fn(x) for x in items)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="hvdrunner-transform")
    pending: collections.deque[Future[R]] = collections.deque()
    try:
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) > workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True)
        close = getattr(items, "close", None)
        if close is not None:  # the reader behind: its read-ahead threads stop too
            close()
