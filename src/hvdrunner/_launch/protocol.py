"""Framed messages over sockets and pipes, with a per-job HMAC challenge on connect.

Every frame is ``8-byte big-endian length + pickle(message)``, a message being one of the
frozen dataclasses below: its type is its kind. Pickle is only read after the peer proved
it holds the job's secret key (HMAC-SHA256, :mod:`hvdrunner._launch.assignments`), so a stray or hostile
connection never reaches ``pickle.loads``.

Three channels, each with its own vocabulary, checked on receipt (:func:`expect`):
- the driver tells a task :data:`TO_TASK` (``Assign``, ``Abort``, ``Beat``);
- a task tells the driver :data:`TO_DRIVER` (``Register``, ``Output``, ``RankState``,
  ``Result``, ``Committed``, ``ExitReport``, ``Beat``);
- a rank process tells its supervisor, over a pipe, :data:`TO_SUPERVISOR` (``Log``,
  ``Stuck``, ``Moving``, ``Value``, ``Commit``, ``Returned``, ``RankError``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import socket
import struct
import threading
import traceback
import types
from dataclasses import dataclass
from typing import Any, BinaryIO, Literal

from hvdrunner._launch import assignments

_LEN = struct.Struct(">Q")
_NONCE_BYTES = 32
#: Upper bound for one frame; rank 0's return value is the only large one.
MAX_FRAME_BYTES = 4 * 1024**3


#: Set by the driver in each rank's environment: how many hosts the job spans.
NUM_HOSTS_ENV = "HVDRUNNER_NUM_HOSTS"
#: Both ends of every driver<->task connection send a "beat" this often: a host whose
#: network was cut sends no FIN, so silence is the only sign it is gone.
HEARTBEAT_S = 1.0


class ProtocolError(RuntimeError):
    """The peer closed the connection, sent garbage, or failed authentication."""


# -- both ways ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Beat:
    """I am alive (every :data:`HEARTBEAT_S`, both ways on a driver<->task connection)."""


# -- what the driver tells a task ---------------------------------------------------------------
@dataclass(frozen=True)
class Assign:
    """The rank's Horovod environment (rank, sizes, rendezvous, the job's extra variables);
    for rank 0 of an attempt that resumes, the last Horovod elastic commit
    (:mod:`hvdrunner._launch.commits`)."""

    env: dict[str, str]
    commit: bytes | None = None


@dataclass(frozen=True)
class Abort:
    """Stop the rank now (the job is failing, or rank 0 returned and others linger)."""


# -- what a rank process tells its supervisor ---------------------------------------------------
@dataclass(frozen=True)
class ErrorReport:
    """A rank's exception as it travels: class, module, message, formatted traceback;
    ``place``: where it was raised (:func:`place_of`); ``stage``: ``"function"`` (the
    training function raised) or ``"result"`` (rank 0's return value could not be pickled)."""

    type: str
    module: str
    message: str
    traceback: str
    place: str | None = None
    stage: Literal["function", "result"] = "function"


@dataclass(frozen=True)
class RankError:
    """The rank's function raised (sent before the process exits non-zero)."""

    error: ErrorReport


@dataclass(frozen=True)
class Log:
    """A ``log_to_driver`` message of rank ``rank``."""

    rank: int
    text: str


@dataclass(frozen=True)
class Stuck:
    """The watchdog: the main thread has not moved for ``stuck_for`` seconds, at ``where``;
    ``in_library``: inside a framework's or Horovod's code (a collective, one long step)."""

    stuck_for: float
    in_library: bool
    where: str


@dataclass(frozen=True)
class Moving:
    """The watchdog: the main thread moves again."""


@dataclass(frozen=True)
class Value:
    """Rank 0's return value, cloudpickled in the rank."""

    blob: bytes


@dataclass(frozen=True)
class Commit:
    """Rank 0's last Horovod elastic ``state.commit()``, in a file of the supervisor's
    folder (:mod:`.commits`): the supervisor reads it, sends it on and removes it."""

    path: str


@dataclass(frozen=True)
class Returned:
    """The rank's function returned (every rank; rank 0 sends its :class:`Value` first)."""


# -- what tasks tell the driver ----------------------------------------------------------------
@dataclass(frozen=True)
class Register:
    """A task is up: its partition, host id and where it runs (for rank assignment, errors)."""

    partition: int | None
    host: str
    address: str | None = None
    hostname: str | None = None
    ip: str | None = None
    horovod: str | None = None  # multihost.horovod_build(): every host must have the same
    # A port that was free on this host when the task registered: rank 0's becomes
    # MASTER_PORT, where torch.distributed's store listens (hvdrunner.engine, libraries).
    port: int | None = None


@dataclass(frozen=True)
class ExitReport:
    """A rank's end: exit code, how it ended, its exception (if any) and its last output."""

    rank: int
    code: int
    how: str
    error: ErrorReport | None = None
    tail: tuple[str, ...] = ()
    aborted: bool = False  # stopped by the driver's abort, not failed on its own
    returned: bool = False  # its function returned (exit 0 without it: os._exit(0) mid-way)

    @property
    def failed(self) -> bool:
        return self.code != 0 and not self.aborted


@dataclass(frozen=True)
class Output:
    """A line of a rank's stdout/stderr (``stream`` set) or a ``log_to_driver`` message."""

    rank: int
    text: str
    stream: str | None = None

    def line(self) -> str:
        return (
            f"[{self.rank}]<{self.stream}>: {self.text}"
            if self.stream
            else f"[{self.rank}] {self.text}"
        )


@dataclass(frozen=True)
class Result:
    """Rank 0's return value, cloudpickled."""

    rank: int
    value: bytes


@dataclass(frozen=True)
class Committed:
    """Rank ``rank``'s last Horovod elastic commit, for the next attempt of the job."""

    rank: int
    blob: bytes


@dataclass(frozen=True)
class RankState:
    """The watchdog of rank ``rank``: where it has been stuck (``None``: it moves again)."""

    rank: int
    stuck: Stuck | None


@dataclass(frozen=True)
class Disconnected:
    """The connection to a task dropped (made by the driver, never sent)."""


Message = Register | ExitReport | Output | Result | Committed | RankState | Disconnected
#: Each channel's vocabulary (see the module docstring).
TO_TASK = (Assign, Abort, Beat)
TO_DRIVER = (Register, ExitReport, Output, Result, Committed, RankState, Beat)
TO_SUPERVISOR = (Log, Stuck, Moving, Value, Commit, Returned, RankError)


def expect(message: object, vocabulary: tuple[type, ...], sender: str) -> Any:
    """``message`` if it is of ``vocabulary``; :class:`ProtocolError` naming it otherwise.
    (``Any``: the caller dispatches on the message's type.)

    Example:
        >>> expect(Beat(), TO_TASK, "the driver")
        Beat()
    """
    if not isinstance(message, vocabulary):
        raise ProtocolError(f"unexpected frame {type(message).__name__} from {sender}")
    return message


def error_report(exc: BaseException, message: str | None = None) -> ErrorReport:
    """How a rank's exception travels to the driver (call inside the ``except`` block)."""
    if message is None:
        try:
            message = str(exc)
        except Exception as failed:  # noqa: BLE001 - a broken __str__ must not hide the error
            message = f"<{type(exc).__name__} whose str() raised {type(failed).__name__}: {failed}>"
    return ErrorReport(type(exc).__qualname__, type(exc).__module__, message,
                       traceback.format_exc(), place_of(exc))  # fmt: skip


def place_of(exc: BaseException) -> str:
    """Where ``exc`` was raised: its type, the innermost ``file:line in function``, and a
    digest of every frame's code and line on the way there.

    The file name alone does not tell two bugs apart: cloudpickle sends a notebook's
    functions by value, and every notebook cell is ``<command-…>`` or ``<dynamic-code>``
    with lines counted from its own top, so two cells raising at their line 3 would look
    alike. Their code differs, and so does the digest; the same bug raised again has the
    same digest.

    Example:
        >>> try:
        ...     int("x")
        ... except ValueError as e:
        ...     place_of(e).startswith("ValueError at ")
        True
    """
    digest = hashlib.sha256()
    innermost = "an unknown line"
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        digest.update(f"{code.co_filename}:{tb.tb_lineno}:{code.co_name}:".encode())
        _digest_code(digest, code)
        innermost = f"{code.co_filename}:{tb.tb_lineno} in {code.co_name}"
        tb = tb.tb_next
    return f"{type(exc).__qualname__} at {innermost} (code {digest.hexdigest()[:10]})"


def _digest_code(digest: Any, code: types.CodeType) -> None:
    """Feed what a function's code is - bytecode, names, constants - into ``digest``, the
    same in every process (no addresses; sets in a fixed order)."""
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _digest_code(digest, const)
        elif isinstance(const, frozenset):
            digest.update(repr(sorted(map(repr, const))).encode())
        else:
            digest.update(repr(const).encode())


def encode(message: object) -> tuple[bytes, bytes]:
    """The frame's length header and body, written one after the other: never joined, a
    large frame (rank 0's value, an elastic commit) is not copied once more."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(body)), body


def _read_exact(read: Any, n: int) -> bytes:
    chunks = []
    while n:
        chunk = read(min(n, 1 << 20))
        if not chunk:
            raise ProtocolError("connection closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(read: Any) -> object:
    """Read one message with ``read(n)`` (a socket's ``recv`` or a file's ``read``)."""
    (size,) = _LEN.unpack(_read_exact(read, _LEN.size))
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {size} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return pickle.loads(_read_exact(read, size))


class Channel:
    """A thread-safe framed connection over a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()

    def send(self, message: object) -> None:
        header, body = encode(message)
        with self._send_lock:
            self._sock.sendall(header)
            self._sock.sendall(body)

    def recv(self) -> object:
        return read_frame(self._sock.recv)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def server_handshake(sock: socket.socket, key: bytes) -> None:
    """Challenge a newly accepted peer; raises :class:`ProtocolError` if it lacks ``key``."""
    nonce = os.urandom(_NONCE_BYTES)
    sock.sendall(nonce)
    digest = _read_exact(sock.recv, assignments.DIGEST_BYTES)
    if not assignments.digest_ok(key, nonce, digest):
        raise ProtocolError("peer failed authentication (wrong job key)")
    sock.sendall(b"\x01")


def connect(host: str, port: int, key: bytes, timeout: float = 30.0) -> Channel:
    """Connect to the driver service and answer its challenge."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        nonce = _read_exact(sock.recv, _NONCE_BYTES)
        sock.sendall(assignments.digest(key, nonce))
        if _read_exact(sock.recv, 1) != b"\x01":
            raise ProtocolError("driver rejected the handshake")
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return Channel(sock)


def beat_forever(send: Any, stopped: threading.Event) -> None:
    """Send a :class:`Beat` every :data:`HEARTBEAT_S` until ``stopped`` or the peer is gone."""
    while not stopped.wait(HEARTBEAT_S):
        try:
            send(Beat())
        except OSError:
            return


class PipeWriter:
    """Frames written by the child process to its supervisor over an inherited pipe."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, message: object) -> None:
        header, body = encode(message)
        with self._lock:
            self._stream.write(header)
            self._stream.write(body)
            self._stream.flush()
