"""Secrets that must never reach a log line, a param, a tag or a file: which, and scrubbing.

A leaf (no hvdrunner import), used by the launcher on everything it shows and by tracking.

Example:
    >>> scrub("token=abc123", secrets_in({"DATABRICKS_TOKEN": "abc123"}))
    'token=[REDACTED]'
"""

from __future__ import annotations

from collections.abc import Mapping

#: Environment variables whose values are secrets.
SECRET_ENV = ("DATABRICKS_TOKEN",)


def secrets_in(env: Mapping[str, str]) -> list[str]:
    """The secret values among ``env`` (to scrub from anything shown or stored)."""
    return [env[k] for k in SECRET_ENV if env.get(k)]


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every secret value replaced by ``[REDACTED]``."""
    for s in secrets:
        text = text.replace(s, "[REDACTED]")
    return text
