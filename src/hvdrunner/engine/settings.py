"""The engine's settings: every environment variable it honours, read once at ``init()``.

Horovod reads its knobs when ``hvd.init()`` runs; so does the engine, into one frozen value
the rest of the engine is handed (the negotiator its cycle and deadlock bound, the executor
its fusion threshold, the world its timeouts). A setting changed between two ``init()``
calls takes effect at the second; one changed while the engine runs does not. A value that
is not what the variable takes fails ``init()`` naming the variable and what it takes.

Example:
    >>> s = Settings.from_environment({"HOROVOD_CYCLE_TIME": "5"})
    >>> s.cycle_s, s.deadlock_s, s.lane
    (0.005, 10.0, True)
    >>> Settings.from_environment({"HVDRUNNER_DEADLOCK_S": "soon"})
    Traceback (most recent call last):
    ...
    ValueError: HVDRUNNER_DEADLOCK_S='soon': a positive number of seconds (unset: 10)
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass

CYCLE_ENV, CYCLE_MS = "HOROVOD_CYCLE_TIME", 1.0
#: How long every rank of a set may wait on requests that cannot be matched before all of
#: them are told so (a deadlock: e.g. ranks made different numbers of unnamed collectives).
DEADLOCK_ENV, DEADLOCK_S = "HVDRUNNER_DEADLOCK_S", 10.0
#: Allreduces of one type fuse into buffers of up to this many bytes (Horovod's default).
FUSION_ENV, FUSION_BYTES = "HOROVOD_FUSION_THRESHOLD", 64 * 1024 * 1024
LANE_ENV = "HVDRUNNER_GRADIENT_LANE"
TIMELINE_ENV = "HOROVOD_TIMELINE"
#: How long ``init()`` waits for every rank to arrive (Horovod's gloo setting and default).
INIT_TIMEOUT_ENV, INIT_TIMEOUT_S = "HOROVOD_GLOO_TIMEOUT_SECONDS", 30.0
#: How long one collective on the data groups may take before the transport gives up.
DATA_TIMEOUT_ENV, DATA_TIMEOUT_S = "HVDRUNNER_COLLECTIVE_TIMEOUT_S", 1800.0
ELASTIC_ENV = "HOROVOD_ELASTIC"


@dataclass(frozen=True)
class Settings:
    """What one ``init()`` runs with (defaults: Horovod's, where Horovod has the knob)."""

    cycle_s: float = CYCLE_MS / 1000.0
    deadlock_s: float = DEADLOCK_S
    fusion_bytes: int = FUSION_BYTES
    lane: bool = True
    timeline: str = ""
    init_timeout_s: float = INIT_TIMEOUT_S
    data_timeout_s: float = DATA_TIMEOUT_S
    elastic: bool = False

    @property
    def data_timeout(self) -> datetime.timedelta:
        """``data_timeout_s`` as torch's process groups take it."""
        return datetime.timedelta(seconds=self.data_timeout_s)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings ``env`` (default: this process's environment) gives."""
        env = os.environ if env is None else env
        return cls(
            cycle_s=_number(env, CYCLE_ENV, CYCLE_MS, "a positive number of milliseconds",
                            allow_zero=True) / 1000.0,
            deadlock_s=_number(env, DEADLOCK_ENV, DEADLOCK_S, "a positive number of seconds"),
            fusion_bytes=int(_number(env, FUSION_ENV, FUSION_BYTES, "a number of bytes",
                                     allow_zero=True)),
            lane=env.get(LANE_ENV, "1").strip() != "0",
            timeline=env.get(TIMELINE_ENV, ""),
            init_timeout_s=_number(env, INIT_TIMEOUT_ENV, INIT_TIMEOUT_S,
                                   "a positive number of seconds"),
            data_timeout_s=_number(env, DATA_TIMEOUT_ENV, DATA_TIMEOUT_S,
                                   "a positive number of seconds"),
            elastic=env.get(ELASTIC_ENV) == "1",
        )  # fmt: skip


def _number(env: Mapping[str, str], name: str, default: float, takes: str,
            allow_zero: bool = False) -> float:  # fmt: skip
    raw = env.get(name, "").strip()
    if not raw:
        return float(default)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (value > 0 or (allow_zero and value == 0)):
        raise ValueError(f"{name}={raw!r}: {takes} (unset: {default:g})")
    return value
