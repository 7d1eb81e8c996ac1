"""hvdrunner: data-parallel deep learning with Horovod over Spark barrier tasks.

Example:
    >>> from hvdrunner import HorovodRunner
    >>> HorovodRunner(np=2).run(train, learning_rate=0.01)  # doctest: +SKIP
"""

from hvdrunner._logging import log_to_driver
from hvdrunner._version import __version__
from hvdrunner.distributed import is_rank0, on_rank0, rank0_first
from hvdrunner.errors import (
    CheckpointError,
    CorruptDataError,
    HorovodRunnerError,
    MultiHostSetupError,
    NotebookError,
    RanksOutOfSyncError,
    TrackingError,
)
from hvdrunner.runner import HorovodRunner

__all__ = [
    "CheckpointError",
    "CorruptDataError",
    "HorovodRunner",
    "HorovodRunnerError",
    "MultiHostSetupError",
    "NotebookError",
    "RanksOutOfSyncError",
    "TrackingError",
    "is_rank0",
    "log_to_driver",
    "on_rank0",
    "rank0_first",
    "__version__",
]
