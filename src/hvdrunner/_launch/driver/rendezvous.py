"""Horovod's gloo rendezvous server for one job, with its scope bookkeeping fixed.

Each rank's gloo context meets the others through an HTTP key-value store on the driver
(``horovod.runner.http.http_server``; started only where horovod is installed, since
hvdrunner's engine meets through torch's store instead): every rank writes its address under a scope
(``global``, ``local_<host>``, ``cross_<local rank>``), reads its peers', connects, and then
sends a DELETE; when every rank of a scope has, the scope's keys are cleared so that the
next ``hvd.init()`` (after ``hvd.shutdown()``: an elastic reset, Horovod's own test suite,
code that re-initialises) meets on fresh addresses.

horovod 0.28.1's handler then clears the finished lists of *every* scope, not just that
one. A ``cross_<n>`` scope of one rank completes with that rank's own DELETE, so it can wipe
another rank's pending DELETE of ``global`` or ``local_<host>``; that scope is then never
cleared, keeps the addresses of the init before, and the next ``hvd.init()`` connects to a
closed port: gloo throws in Horovod's background thread and the rank dies with SIGABRT in
``hvd.init()`` (measured: 1 of 4 runs of 40 init/shutdown cycles on 2 busy cores;
tests/test_reinit.py). Here a scope's completion clears that scope only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import threading
from typing import Any


def available() -> bool:
    """Whether horovod (whose gloo meets here) is installed; hvdrunner's engine needs none."""
    try:
        return importlib.util.find_spec("horovod.runner.http.http_server") is not None
    except (ImportError, ValueError):
        return False


def _handler_class() -> type:
    """horovod's ``RendezvousHandler`` whose DELETE clears only the scope that completed
    (made on first use: horovod is imported only where it is installed)."""
    from horovod.runner.http.http_server import BAD_REQUEST, RendezvousHandler

    class Handler(RendezvousHandler):
        def do_DELETE(self) -> None:  # noqa: N802 - the http.server handler name
            paths = self.path.split("/")
            if len(paths) < 3:
                logging.error(f"Rendezvous ERROR: Invalid request path: {self.path}.")
                self.send_status_code(BAD_REQUEST)
                return
            _, scope, key = paths
            _finish(self.server, scope, key)
            self.send_status_code(200)

    return Handler


def _finish(server: Any, scope: str, key: str) -> None:
    """``key`` of ``scope`` is done: a plan scope is cleared once every rank of it is; a
    client scope (process sets) loses that key."""
    if scope in server.scope_size:
        with server.finished_list_lock:
            finished = server.finished_list[scope]
            if key not in finished:
                finished.append(key)
            if len(finished) == server.scope_size[scope]:
                with server.cache_lock:
                    server.cache.get(scope, {}).clear()
                del server.finished_list[scope]
        return
    with server.cache_lock:
        scope_dict = server.cache.get(scope)
        if scope_dict is not None:
            scope_dict.pop(key, None)
            if not scope_dict:
                del server.cache[scope]


def start(plan: list) -> tuple[Any, int]:
    """A started rendezvous server for ``plan`` (the host assignments) and its port."""
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer()
    port = server.start(_handler_class())
    server.init(plan)
    return server, port


def stop(server: Any) -> None:
    """Stop the server and close its listening socket, in the background.

    ``RendezvousServer.stop()`` waits out socketserver's 0.5 s poll interval (run() need
    not); ``server_close()`` then releases the port, which ``stop()`` alone leaves
    listening until the object is collected."""
    httpd = getattr(server, "_httpd", None)

    def run() -> None:
        with contextlib.suppress(Exception):
            server.stop()
        if httpd is not None:
            with contextlib.suppress(Exception):
                httpd.server_close()

    threading.Thread(target=run, name="hvdrunner-rendezvous-stop", daemon=True).start()
