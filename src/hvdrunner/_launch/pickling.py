"""Serialize the user's function before launch, and explain what blocks pickling."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import cloudpickle

_HINTS = {
    "SparkSession": "a SparkSession lives on the driver only; do not use `spark` inside the "
    "training function (read data on the driver, e.g. with hvdrunner.data)",
    "SparkContext": "a SparkContext lives on the driver only; do not use `sc` inside the "
    "training function",
    "DataFrame": "a Spark DataFrame cannot travel to workers; convert it first (hvdrunner.data)",
    "RLock": "a lock or thread object cannot travel to another process",
    "lock": "a lock or thread object cannot travel to another process",
    "socket": "an open socket or connection cannot travel to another process; open it inside "
    "the function",
    "TextIOWrapper": "an open file cannot travel to another process; open it inside the function",
    "BufferedReader": "an open file cannot travel to another process; open it inside the function",
    "BufferedWriter": "an open file cannot travel to another process; open it inside the function",
}


def _references(fn: Callable[..., Any]) -> Iterator[tuple[str, Any]]:
    """Objects a function drags along: closure cells, referenced globals, defaults."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    if fn.__closure__:
        for name, cell in zip(code.co_freevars, fn.__closure__, strict=False):
            try:
                yield f"closure variable {name!r}", cell.cell_contents
            except ValueError:
                continue
    globs = getattr(fn, "__globals__", {})
    names = set(code.co_names)
    for const in code.co_consts:  # names used by nested functions and comprehensions
        if inspect.iscode(const):
            names.update(const.co_names)
    for name in sorted(names):
        if name in globs:
            yield f"global {name!r}", globs[name]
    for i, default in enumerate(fn.__defaults__ or ()):
        yield f"default argument #{i + 1}", default


def _culprit(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> str | None:
    for key, value in kwargs.items():
        try:
            cloudpickle.dumps(value)
        except Exception:  # noqa: BLE001
            return f"keyword argument {key!r} ({type(value).__name__})"
    seen: set[int] = set()
    stack = [(f"function {getattr(fn, '__qualname__', fn)!r}", fn)]
    while stack:
        where, obj = stack.pop()
        for name, value in _references(obj):
            if id(value) in seen or inspect.ismodule(value):
                continue
            seen.add(id(value))
            try:
                cloudpickle.dumps(value)
            except Exception:  # noqa: BLE001
                if inspect.isfunction(value):
                    stack.append((f"{where} -> {name}", value))
                    continue
                return f"{name} ({type(value).__name__}) used by {where}"
    return None


def dumps_payload(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> bytes:
    """Cloudpickle ``(fn, kwargs)``; on failure name the object that cannot travel.

    Raises:
        ValueError: the function or an argument cannot be pickled.
    """
    try:
        return cloudpickle.dumps((fn, dict(kwargs)))
    except Exception as exc:  # noqa: BLE001 - pickling raises many types
        culprit = _culprit(fn, kwargs)
        type_name = culprit.split("(")[-1].split(")")[0] if culprit else ""
        hint = _HINTS.get(type_name, "create it inside the function instead of capturing it")
        where = f" The culprit is {culprit}: {hint}." if culprit else ""
        raise ValueError(
            f"The training function cannot be sent to the Horovod ranks because it cannot be "
            f"pickled ({type(exc).__name__}: {exc}).{where} Everything the function uses "
            f"from outside must be picklable; import modules and build clients inside it."
        ) from exc
