"""One line of ``hvdrunner doctor``'s checklist: what the build, stack and environment
checks return (doctor.build, doctor)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One checklist line. ``ok=None`` is information only; ``required`` failures exit 1."""

    name: str
    ok: bool | None
    detail: str
    fix: str = ""
    required: bool = True
