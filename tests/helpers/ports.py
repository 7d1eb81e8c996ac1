"""A free TCP port on loopback, for a server a test starts (the port is released before the
server binds it; a test that needs it held keeps its own socket)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
