"""Which :class:`~hvdrunner._launch.backends.base.Backend` a job runs on.

``np < 0``: driver processes. Otherwise the first backend whose session is active, in the
order of :data:`SESSION_BACKENDS`: a Spark Connect session before a SparkContext (a process
may hold both - a local Connect server's host - and the session the user holds is the one
they mean). How to add one: :mod:`hvdrunner._launch.backends.base`.
"""

from __future__ import annotations

from hvdrunner import workspace
from hvdrunner._launch.backends.base import Backend
from hvdrunner._launch.backends.classic import ClassicBackend
from hvdrunner._launch.backends.connect import ConnectBackend
from hvdrunner._launch.backends.local import LocalBackend

#: The session backends, in the order the chooser asks them.
SESSION_BACKENDS: tuple[type[Backend], ...] = (ConnectBackend, ClassicBackend)


def choose(np: int) -> Backend:
    """The backend for ``np`` (see the module's docstring).

    Raises:
        RuntimeError: ``np >= 0`` without an active SparkSession (classic or Connect).
    """
    if np < 0:
        return LocalBackend()
    for kind in SESSION_BACKENDS:
        backend = kind.active()
        if backend is not None:
            return backend
    raise RuntimeError(
        "np>=0 runs on Spark executors but there is no active SparkSession. Create one "
        "first (e.g. hvdrunner.spark.local_session() locally; on Databricks it exists; "
        "SparkSession.builder.remote(...) for Spark Connect), or pass np<0 to run on the "
        f"driver only. This compute: {workspace.describe_access_mode()}"
    )
