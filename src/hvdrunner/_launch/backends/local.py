"""Start one supervisor per rank as threads of the driver process (``np < 0``)."""

from __future__ import annotations

import threading

from hvdrunner._launch.rank.task import TaskSpec, run_slot
from hvdrunner._logging import get_logger

_log = get_logger()


class LocalLaunch:
    """``-np`` ranks on this machine over loopback gloo, no Spark involved."""

    def __init__(self, num_proc: int, spec: TaskSpec) -> None:
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(
                target=self._slot, args=(spec, i), name=f"hvdrunner-rank{i}", daemon=True
            )
            for i in range(num_proc)
        ]

    def _slot(self, spec: TaskSpec, partition: int) -> None:
        try:
            run_slot(spec, partition, "127.0.0.1", [])
        except BaseException as exc:  # noqa: BLE001 - surfaced through error()
            _log.debug(f"driver slot {partition} failed", exc_info=True)
            self._error = exc

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def error(self) -> BaseException | None:
        return self._error

    def stop(self, cancel: bool) -> None:
        for t in self._threads:
            t.join(timeout=30)


class LocalBackend:
    """:class:`~hvdrunner._launch.backends.base.Backend` of ``np < 0``: driver processes."""

    where = "driver processes"
    bind = "127.0.0.1"
    spread_host_gpus = True

    @classmethod
    def active(cls) -> LocalBackend | None:
        """None: driver processes hold no session; the chooser picks them for ``np < 0``."""
        return None

    def describe_slots(self) -> str:
        return "no task slots: np<0 starts -np processes on this machine"

    def slots(self) -> int:  # pragma: no cover - np=0 never reaches the local backend
        raise ValueError("np=0 counts a Spark cluster's task slots; on the driver pass np=-N.")

    def preflight(self, np: int, min_np: int | None, wait_s: float) -> None:
        """Nothing to check: the driver starts its processes itself."""

    def slots_for_restart(self, np: int, min_np: int | None, wait_s: float) -> int:
        return np

    def driver_address(self) -> str:
        return "127.0.0.1"

    def launch(self, np: int, spec: TaskSpec) -> LocalLaunch:
        return LocalLaunch(np, spec)
