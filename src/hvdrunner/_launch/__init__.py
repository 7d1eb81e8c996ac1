"""Launch machinery behind :class:`hvdrunner.HorovodRunner` (private), in three sides and what
they share:

- ``backends/``: where the ranks run. ``base`` (the protocol, and how to add a backend), the
  chooser (``backends.choose``), ``barrier`` (what the two Spark session backends share),
  ``classic`` (a SparkContext's barrier RDD stage), ``connect`` (a Spark Connect session's
  barrier DataFrame stage), ``local`` (driver processes, ``np < 0``).
- ``driver/``: the process that called ``run()``. ``service`` (registers ranks, relays logs,
  watches heartbeats, decides the verdict), ``job`` (one attempt's state), ``verdict`` (the
  error that names the cause), ``restarts`` (which causes a restart can fix),
  ``rendezvous`` (Horovod's gloo rendezvous server).
- ``rank/``: each rank's host. ``task`` (one slot: connect back, start the supervisor),
  ``supervisor`` (runs the rank's child process and relays it), ``worker`` (the child's entry
  point), ``watchdog`` (the child's view of its supervisor).
- shared by both sides: ``protocol`` (framed, authenticated messages), ``assignments`` (who is
  which rank), ``commits`` (elastic commits carried across restarts), ``pickling`` (the
  payload), ``limits`` (the job's limits, one frozen value).

The driver side and the rank side never import each other; the rest of hvdrunner reaches a
backend only through ``backends`` and ``backends.base`` (tests/test_layers.py).
"""
