"""Rank 0's per-epoch metrics on their way into the job's MLflow run: every step once.

A restart (``HorovodRunner(max_restarts=N)``, or a rerun into the same run) trains again the
epochs after the checkpoint it resumes from. Had those epochs' metrics reached MLflow the
first time, their steps would hold two values each (MLflow keeps both). So:

- with a checkpoint store, an epoch's metrics are logged right after the checkpoint that
  covers it is saved, and that checkpoint carries them (``metrics`` in its ``state.json``):
  a restart from it logs whatever the failed attempt saved but had not logged yet;
- without one, each epoch is logged at its end;
- either way a step the run already holds is never logged again. (A restart without
  checkpoints trains from scratch: the run keeps the first attempt's values of those
  steps, and a warning says so.)

Example:
    >>> ledger = MetricLedger(durable=True)
    >>> ledger.epoch_end(0, {"loss": 0.5})
    >>> ledger.carried()
    {'0': {'loss': 0.5}}
    >>> ledger.saved()      # the checkpoint holding epoch 0 is on disk: epoch 0 is logged
"""

from __future__ import annotations

from collections.abc import Mapping

from hvdrunner import tracking
from hvdrunner._logging import get_logger
from hvdrunner.distributed import is_rank0

_log = get_logger()


class MetricLedger:
    """The epochs' averaged metrics of one fit, logged to MLflow once they are durable.

    Args:
        durable: a checkpoint store saves the epochs (log after each save); ``False``: log
            each epoch at its end.
    """

    def __init__(self, durable: bool) -> None:
        self.durable = durable
        self.pending: dict[int, dict[str, float]] = {}
        self._logged: set[tuple[str, int]] | None = None  # (key, step) the run holds

    def epoch_end(self, epoch: int, logs: Mapping[str, float]) -> None:
        """Epoch ``epoch`` (0-based: the MLflow step) ended with these averaged metrics."""
        if not is_rank0():
            return
        self.pending[epoch] = {k: float(v) for k, v in logs.items()}
        if not self.durable:
            self.flush()

    def carried(self) -> dict[str, dict[str, float]]:
        """The metrics of the epochs not logged yet, for the checkpoint about to be saved."""
        return {str(e): dict(m) for e, m in sorted(self.pending.items())}

    def saved(self) -> None:
        """The checkpoint holding the pending epochs is on disk: log them."""
        self.flush()

    def restore(self, carried: Mapping[str, Mapping[str, float]] | None) -> None:
        """At a resume: log what the checkpoint carries and the run does not hold yet."""
        for epoch, metrics in (carried or {}).items():
            self.pending[int(epoch)] = {k: float(v) for k, v in metrics.items()}
        self.flush()

    def flush(self) -> None:
        """Log every pending step the run does not hold yet (rank 0, with a run)."""
        pending, self.pending = self.pending, {}
        if not pending or not is_rank0() or tracking.run_id() is None:
            return
        if self._logged is None:
            self._logged = tracking.logged_steps()
        kept = []
        for epoch in sorted(pending):
            fresh = {k: v for k, v in pending[epoch].items() if (k, epoch) not in self._logged}
            if len(fresh) < len(pending[epoch]):
                kept.append(epoch)
            if fresh:
                tracking.log_metrics(fresh, step=epoch)
                self._logged.update((k, epoch) for k in fresh)
        if kept:
            _log.warning(
                f"the MLflow run already holds metrics of epoch(s) {[e + 1 for e in kept]} from "
                f"an earlier attempt (trained before a failure, not covered by a checkpoint); "
                f"those values are kept, not logged twice"
            )
