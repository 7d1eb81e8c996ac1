"""Start one supervisor per rank as threads of the driver process (``np < 0``)."""

from __future__ import annotations

import threading
import traceback

from hvdrunner._launch.task import TaskSpec, run_slot


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
            traceback.print_exc()
            self._error = exc

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def error(self) -> BaseException | None:
        return self._error

    def stop(self, cancel: bool) -> None:
        for t in self._threads:
            t.join(timeout=30)
