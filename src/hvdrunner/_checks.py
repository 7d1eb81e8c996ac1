"""The one numeric-argument check: an int (or a number) that is not a bool, within a bound.

Every argument check of hvdrunner asks it, each with its own message naming the argument
and the fix (``True`` is an int to Python, never a count or a number of seconds here).
"""

from __future__ import annotations

from typing import Any


def is_int(value: Any, at_least: int | None = None) -> bool:
    """Whether ``value`` is an int, not a bool, and ``>= at_least`` when given.

    Example:
        >>> is_int(2, at_least=1), is_int(True), is_int(0, at_least=1)
        (True, False, False)
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return at_least is None or value >= at_least


def is_number(value: Any, at_least: float | None = None, above: float | None = None) -> bool:
    """Whether ``value`` is an int or a float, not a bool, ``>= at_least`` / ``> above``.

    Example:
        >>> is_number(0.5, above=0), is_number(False), is_number(0, above=0)
        (True, False, False)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (at_least is None or value >= at_least) and (above is None or value > above)
