"""Launch machinery behind :class:`hvdrunner.HorovodRunner` (private).

- ``protocol``: framed, authenticated messages between the driver and the rank supervisors.
- ``driver``: the driver-side service that assigns ranks, streams logs and collects results.
- ``supervisor``: runs one rank's child process and relays what it says to the driver.
- ``worker``: the child process entry point that calls the user's function.
- ``spark_backend`` / ``local_backend``: start the supervisors on Spark barrier tasks or on
  the driver.
"""
