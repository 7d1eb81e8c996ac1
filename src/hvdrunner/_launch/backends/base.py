"""The launch-backend seam: where a job's ranks run, behind one protocol.

The runner asks a :class:`Backend` how many ranks it can start, checks it before launching,
and hands it a :class:`~hvdrunner._launch.rank.task.TaskSpec`; the backend starts one
:func:`~hvdrunner._launch.rank.task.run_slot` per rank and returns a :class:`Launch`. Everything
else - registration, rendezvous, heartbeats, the verdict - is the driver service's and the
same for every backend.

**Adding a backend** is one module in this folder implementing :class:`Backend` (every
member below, ``active()`` included) and one line in :data:`hvdrunner._launch.backends.
SESSION_BACKENDS`, in the order the chooser asks them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the protocol names it; importing it would load psutil with hvdrunner
    from hvdrunner._launch.rank.task import TaskSpec


class Launch(Protocol):
    """One attempt's ranks, started in the background."""

    def start(self) -> None:
        """Start the ranks; returns at once."""

    def error(self) -> BaseException | None:
        """Why the launch itself failed (a Spark job error), or None while it has not."""

    def stop(self, cancel: bool) -> None:
        """Wait for the launch to end, cancelling it first when the job failed."""


class Backend(Protocol):
    """Where ranks run: driver processes, Spark barrier tasks, a Spark Connect session."""

    @classmethod
    def active(cls) -> Backend | None:
        """This backend on the session this process holds now, or None without one (the
        chooser asks each session backend in turn; driver processes have no session)."""

    def describe_slots(self) -> str:
        """One line for ``doctor``: how many task slots there are and what limits them."""

    #: For logs and errors: "Spark barrier tasks (local[2])".
    where: str
    #: The address the driver service listens on ("0.0.0.0" when ranks are elsewhere).
    bind: str
    #: Spread one host's GPUs over its ranks (single-host masters, driver processes).
    spread_host_gpus: bool

    def slots(self) -> int:
        """Every task slot of the cluster: ``np=0``'s rank count.

        Raises:
            ValueError: the count cannot be known from here (naming what to pass instead).
        """

    def preflight(self, np: int, min_np: int | None, wait_s: float) -> None:
        """Fail before launching when ``np`` ranks cannot start at once (or ``min_np``
        cannot be honoured), after waiting up to ``wait_s`` for the cluster to come up.

        Raises:
            ValueError: too few slots, or an argument this backend cannot serve.
            RuntimeError: the cluster cannot run gang-scheduled tasks at all.
        """

    def slots_for_restart(self, np: int, min_np: int | None, wait_s: float) -> int:
        """How many ranks a restart runs with, once they are free (at most ``wait_s``).

        Raises:
            ValueError: fewer free slots than ``min_np`` (or ``np``) after ``wait_s``.
        """

    def driver_address(self) -> str:
        """The driver service's address as the ranks' hosts reach it (an IP)."""

    def launch(self, np: int, spec: TaskSpec) -> Launch:
        """A :class:`Launch` of ``np`` slots running ``spec``; not started yet."""
