"""A job's limits, as one frozen value: built and validated once in ``HorovodRunner.__init__``,
passed whole to the driver service, the task and the rank supervisor. The defaults are written
here only (``HorovodRunner``'s signature reads them from :data:`DEFAULTS`).

Example:
    >>> limits = JobLimits(timeout=3600.0)
    >>> limits.host_timeout, limits.deadline(now=100.0)
    (30.0, 3700.0)
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from hvdrunner._checks import is_int, is_number


@dataclass(frozen=True)
class JobLimits:
    """How long a job may take, and how often it may start again.

    Attributes:
        start_timeout: seconds for all ranks to start (free task slots), per attempt.
        stall_timeout: seconds a rank may wait inside one framework or Horovod call while
            another does not.
        exit_grace: seconds the other ranks get to exit after rank 0 returned.
        timeout: the whole job's bound in seconds, every attempt included (None: none).
        host_timeout: seconds without a heartbeat before a host (or the driver, seen from a
            task) counts as lost.
        max_restarts: how many times a failed job is started again.
    """

    start_timeout: float = 600.0
    stall_timeout: float = 600.0
    exit_grace: float = 60.0
    timeout: float | None = None
    host_timeout: float = 30.0
    max_restarts: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "max_restarts":
                if not is_int(value, at_least=0):
                    raise ValueError(f"max_restarts must be an int >= 0, got {value!r}.")
            elif not (f.name == "timeout" and value is None):
                if not is_number(value, above=0):
                    raise ValueError(
                        f"{f.name} must be a positive number of seconds, got {value!r}."
                    )
                object.__setattr__(self, f.name, float(value))

    def deadline(self, now: float) -> float | None:
        """When ``timeout`` runs out for a job started at ``now`` (``time.monotonic()``)."""
        return None if self.timeout is None else now + self.timeout


#: The defaults, for signatures that repeat the fields (HorovodRunner's).
DEFAULTS = JobLimits()
