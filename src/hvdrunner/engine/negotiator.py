"""The background thread that agrees with the other ranks on what to run, then runs it.

Horovod's design over ``torch.distributed``, one negotiator per process set (as Horovod has
one controller per set): a caller enqueues a named request and gets a handle at once; the
negotiator thread of every rank of the set meets the others in *rounds* (one small allgather
on the set's control group), announcing its new requests. Every rank keeps the same table of
what each rank announced, so every rank derives the same answer with no coordinator: a
request is *ready* when every rank of the set that has not joined announced it; ready requests
run in the order they were first announced, allreduces of one type and reduction fused into
one buffer (engine.execute). Ranks that disagree on a request (shape, dtype, op, root) get an
error on every rank, never a hang; a rank that called ``join()`` contributes zeros to the
others' allreduces.

What ranks agreed on once is remembered (Horovod's response cache): a request seen before is
announced by a small number, so a training step's rounds stay one small message.

A rank enters a round when it has something to announce, or when a pending request waits on
another rank (so that rank finds it there); a round with no progress waits one cycle
(``HOROVOD_CYCLE_TIME``, ms) unless this rank asks for something new.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from hvdrunner._logging import get_logger
from hvdrunner.engine.exchange import exchange
from hvdrunner.engine.requests import (
    ALLREDUCE,
    BARRIER,
    Announcement,
    CachedAnnouncement,
    Entry,
    Flags,
    Handle,
    Message,
    Ready,
    Request,
    Signature,
    first_difference,
)  # fmt: skip
from hvdrunner.engine.settings import Settings
from hvdrunner.errors import HorovodInternalError

_log = get_logger()

#: The longest wait between rounds that made no progress.
IDLE_MAX_S = 0.01
#: How long shutdown() waits for the last round with the other ranks.
SHUTDOWN_WAIT_S = 30.0


#: Runs a batch of ready requests on the data groups (engine.execute.Executor).
Executor = Callable[[list[Ready], frozenset[int]], None]


class Negotiator:
    """One per process set and ``init()``: the request queue, the shared table, the thread.

    ``ranks`` are the set's global ranks in the order of its ``control`` group."""

    def __init__(self, control: dist.ProcessGroup, ranks: tuple[int, ...], rank: int,
                 execute: Executor, settings: Settings) -> None:  # fmt: skip
        self.rank, self.ranks = rank, ranks
        self.control: dist.ProcessGroup | None = control  # None once released
        self._execute = execute
        self._lock = threading.Condition()
        self._new: list[Request] = []  # enqueued, not yet announced
        self._mine: dict[tuple[int, str], Request] = {}  # announced, not finished
        self._table: dict[tuple[int, str], Entry] = {}
        self._cache: dict[tuple[Any, ...], int] = {}  # response cache: request -> number
        self._cached: list[tuple[str, str, int, Signature]] = []
        self._joined: dict[int, int] = {}  # rank -> round it joined in
        self._join_handle: Handle | None = None
        self._shutdown = False
        self._saw_shutdown = False
        self.broken: BaseException | None = None
        self._round = 0
        self._waiting = 0  # callers blocked on this set's requests
        self._stalled = 0  # callers blocked on the gradient lane (engine.lane) a while
        self.deadlocks = 0  # deadlocks declared so far, and the last one's message
        self.deadlock_error = ""
        self._declare = False
        self._stuck_since: float | None = None
        self._cycle_s = settings.cycle_s
        self._deadlock_s = settings.deadlock_s
        self._idle_s = self._cycle_s
        self._elsewhere = False  # the table waits on another rank (set by each round)
        self._turn = threading.Lock()  # held by whichever thread runs a round
        self._thread = threading.Thread(target=self._loop, name="hvdrunner-engine", daemon=True)
        self._thread.start()

    # -- the caller's side ----------------------------------------------------------------
    def submit(self, request: Request) -> Request:
        """Queue ``request``; ``ValueError`` when one of that name is still in flight here."""
        key = (request.ps_id, request.name)
        with self._lock:
            self._raise_if_broken()
            if key in self._mine or any((r.ps_id, r.name) == key for r in self._new):
                raise ValueError(
                    f"Requested to {request.kind} a tensor with the same name as another tensor "
                    f"that is currently being processed: {request.name!r}. Give concurrent "
                    f"operations distinct names (name=...)."
                )
            self._new.append(request)
            self._lock.notify_all()
        return request

    def join(self, handle: Handle) -> None:
        """This rank has no more data: serve the others' allreduces with zeros until every
        rank joined; ``handle`` then gets the rank that joined last."""
        with self._lock:
            self._raise_if_broken()
            self._join_handle = handle
            self._lock.notify_all()

    def close(self) -> None:
        """Meet the others one last time (so a peer waiting on this rank hears it left),
        then stop the thread; pending requests fail."""
        with self._lock:
            self._shutdown = True
            self._lock.notify_all()
        self._thread.join(SHUTDOWN_WAIT_S)
        if self._thread.is_alive():
            _log.warning(
                "hvd.shutdown(): the other ranks did not meet this one within %.0f s; leaving "
                "without them (their next collective fails)", SHUTDOWN_WAIT_S,
            )  # fmt: skip

    def alive(self) -> bool:
        return self._thread.is_alive()

    def release(self) -> None:
        """After ``close()``: drop the process groups (a thread still running keeps them)."""
        if not self.alive():
            self.control = None
            self._execute = _closed

    def _raise_if_broken(self) -> None:
        if self.broken is not None:
            raise HorovodInternalError(str(self.broken)) from self.broken
        if self._shutdown:
            raise ValueError("Horovod has been shut down on this rank; call hvd.init() first.")

    # -- rounds: on the caller's thread (drive) or the negotiator's -------------------------
    def drive(self, handle: Handle) -> None:
        """Until ``handle`` is done, run rounds on the calling thread whenever no other thread
        runs one (``_turn``): a synchronous collective then costs its round and nothing else,
        where handing it to the negotiator's thread and back cost two thread switches."""
        idle = self._cycle_s
        with self.waiting():
            while not handle.done():
                if not self._turn.acquire(blocking=False):
                    handle.wait_done(idle)  # the thread runs a round: it may finish this
                    continue
                try:
                    if handle.done() or self._finished():
                        break
                    progressed = self._round_or_fail()
                finally:
                    self._turn.release()
                if self._elsewhere or self._finished():  # the thread's wait may have changed
                    with self._lock:
                        self._lock.notify_all()
                idle = self._cycle_s if progressed else min(2 * idle, IDLE_MAX_S)
                if not progressed:
                    handle.wait_done(idle)

    def _loop(self) -> None:
        progressed = True
        while not self._finished():
            self._wait_for_work(progressed)
            with self._turn:
                if self._finished():
                    return
                with self._lock:
                    wanted = bool(self._new or self._shutdown or self._needed_elsewhere())
                progressed = self._round_or_fail() if wanted else True

    def _finished(self) -> bool:
        return self.broken is not None or (self._shutdown and self._saw_shutdown)

    def _round_or_fail(self) -> bool:
        """One round (the caller holds ``_turn``); a transport error fails every pending
        request and the engine."""
        try:
            return self._one_round()
        except BaseException as exc:  # noqa: BLE001 - every pending caller must hear it
            self._fail_all(HorovodInternalError(
                f"a collective failed on rank {self.rank}: {type(exc).__name__}: {exc} (a peer "
                f"rank probably died, left or shut down)"
            ))  # fmt: skip
            with self._lock:
                self._lock.notify_all()
            return True

    def _needed_elsewhere(self) -> bool:
        """Whether a pending request waits on another rank (which must find this one in a
        round), as opposed to waiting on this rank's own caller (``_elsewhere``: as the last
        round left the table)."""
        return self._join_handle is not None or bool(self._stalled) or self._elsewhere

    def _table_waits_elsewhere(self) -> bool:
        active = [r for r in self.ranks if r not in self._joined]
        for entry in self._table.values():
            if self.rank not in entry.signatures and self.rank in active:
                continue  # waits on this rank's caller: a round cannot help
            return True
        return False

    def _wait_for_work(self, progressed: bool) -> None:
        # Rounds without progress (ranks waiting on each other's callers) back off from one
        # cycle to IDLE_MAX_S, so waiting costs no core; a new local request ends the wait.
        self._idle_s = self._cycle_s if progressed else min(2 * self._idle_s, IDLE_MAX_S)
        with self._lock:
            if not progressed and not self._new and not self._shutdown:
                self._lock.wait(self._idle_s)
            while not (self._new or self._shutdown or self._needed_elsewhere()
                       or self._finished()):  # fmt: skip
                self._lock.wait()

    def _encode(self, request: Request) -> Announcement | CachedAnnouncement:
        """A request's announcement: its number when every rank knows it already."""
        full = request.announcement()
        number = self._cache.get(full.agreed())
        return CachedAnnouncement(number, full.local) if number is not None else full

    def _decode(self, item: Announcement | CachedAnnouncement) -> Announcement:
        if isinstance(item, CachedAnnouncement):
            return Announcement(*self._cached[item.number], item.local)
        return item

    def _one_round(self) -> bool:
        with self._lock:
            new, self._new = self._new, []
            for request in new:
                self._mine[(request.ps_id, request.name)] = request
            waiting = self._waiting > 0 or self._join_handle is not None
            flags = Flags(self._join_handle is not None, self._shutdown, waiting, self._declare)
        mine = Message(flags, [self._encode(r) for r in new])
        gathered: list[Message] = exchange(mine, len(self.ranks), self.control)
        self._round += 1
        for rank, message in zip(self.ranks, gathered, strict=False):
            if message.flags.joined and rank not in self._joined:
                self._joined[rank] = self._round
            for item in message.announced:
                a = self._decode(item)
                entry = self._table.setdefault((a.ps_id, a.name), Entry(a.kind, a.ps_id))
                entry.signatures[rank] = a.signature
                entry.locals[rank] = a.local
        leaving = [rank for rank, message in zip(self.ranks, gathered, strict=False)
                   if message.flags.leaving]  # fmt: skip
        progressed = any(message.announced for message in gathered)
        progressed |= self._run_ready()
        progressed |= self._complete_join()
        self._watch_for_deadlock(gathered, progressed)
        self._elsewhere = self._table_waits_elsewhere()
        if leaving:
            self._saw_shutdown = True
            if not self._shutdown:
                self.broken = RuntimeError(f"rank {leaving[0]} shut down (hvd.shutdown())")
            self._fail_all(HorovodInternalError(f"Horovod has been shut down (rank {leaving[0]})"))
        return progressed

    def _watch_for_deadlock(self, gathered: list[Message], progressed: bool) -> None:
        """Every rank of the set blocked on a request that another rank never made: nothing
        can change, so say so on every rank instead of hanging (Horovod stalls there). The
        set's first rank declares it after ``HVDRUNNER_DEADLOCK_S``; all act in the round it
        does."""
        stuck = (not progressed and bool(self._table)
                 and all(message.flags.waiting for message in gathered))  # fmt: skip
        if any(message.flags.declaring for message in gathered):
            self._break_deadlock()
            return
        if not stuck:
            self._stuck_since = None
        elif self._stuck_since is None:
            self._stuck_since = time.monotonic()
        elif self.rank == self.ranks[0] and time.monotonic() - self._stuck_since > self._deadlock_s:
            self._declare = True

    def _break_deadlock(self) -> None:
        self._declare, self._stuck_since = False, None
        lines = []
        for (_, name), entry in self._table.items():
            asked = sorted(entry.signatures)
            missing = [r for r in self.ranks if r not in entry.signatures and r not in self._joined]
            lines.append(f"{entry.kind} {name!r} asked by rank(s) {asked}, never by {missing}")
        error = RuntimeError(
            "Ranks wait on requests the others never made, so none can proceed: "
            + "; ".join(lines) + ". Every rank must make the same collectives (names differ "
            "when ranks made different numbers of unnamed ones: give them names)."
        )  # fmt: skip
        self._table.clear()
        with self._lock:
            mine, self._mine = list(self._mine.values()), {}
            self.deadlock_error = str(error)
            self.deadlocks += 1
        for request in mine:
            request.handle.fail(error)

    @contextlib.contextmanager
    def waiting(self, on_lane: bool = False) -> Iterator[None]:
        """Around a caller blocked on one of this set's requests (the deadlock watch).
        ``on_lane``: blocked a while on the gradient lane (engine.lane), which has no request
        here, so this rank also takes part in rounds: the watch sees it when a peer waits on
        a collective this rank never makes."""
        lane = int(on_lane)
        with self._lock:
            self._waiting += 1
            self._stalled += lane
            if lane:  # only the lane's wait changes what the thread waits for
                self._lock.notify_all()
        try:
            yield
        finally:
            with self._lock:
                self._waiting -= 1
                self._stalled -= lane

    def _run_ready(self) -> bool:
        joined = frozenset(self._joined)
        active = [r for r in self.ranks if r not in joined]
        batch: list[Ready] = []
        for key, entry in list(self._table.items()):
            if not active or any(r not in entry.signatures for r in active):
                continue
            del self._table[key]
            mine = self._mine.pop(key, None)
            error = _verdict(entry, active, joined, self.ranks)
            batch.append(Ready(key, entry, mine, self.ranks, error))
            if error is None:
                self._remember(key, entry, active[0])
        if batch:
            try:
                self._execute(batch, joined)
            except BaseException as exc:
                for ready in batch:  # out of the table already: fail them here
                    if ready.mine is not None:
                        ready.mine.handle.fail(HorovodInternalError(f"{ready.key[1]}: {exc}"))
                raise
        return bool(batch)

    def _remember(self, key: tuple[int, str], entry: Entry, some_rank: int) -> None:
        """Number a request every rank agreed on, the same way on every rank."""
        full = Announcement(key[1], entry.kind, key[0], entry.signatures[some_rank], ()).agreed()
        if full not in self._cache:
            self._cache[full] = len(self._cached)
            self._cached.append(full)

    def _complete_join(self) -> bool:
        if len(self._joined) < len(self.ranks):
            return False
        last = max(self._joined, key=lambda r: (self._joined[r], r))
        self._joined.clear()
        with self._lock:
            handle, self._join_handle = self._join_handle, None
        if handle is not None:
            handle.finish(last)
        return True

    def _fail_all(self, error: BaseException) -> None:
        if self.broken is None:
            self.broken = error
        with self._lock:
            pending = list(self._mine.values()) + self._new
            self._mine.clear()
            self._new = []
            join, self._join_handle = self._join_handle, None
        for request in pending:
            request.handle.fail(error)
        if join is not None:
            join.fail(error)


def _closed(batch: list[Ready], joined: frozenset[int]) -> None:
    raise HorovodInternalError("Horovod has been shut down on this rank")


def _verdict(entry: Entry, active: list[int], joined: frozenset[int],
             members: tuple[int, ...]) -> str | None:  # fmt: skip
    """The error every rank gives for this request, or ``None`` when it can run."""
    sigs = {r: entry.signatures[r] for r in active}
    if len(set(sigs.values())) > 1:
        return first_difference(entry.kind, sigs)
    gone = sorted(r for r in members if r in joined)
    if gone and entry.kind not in (ALLREDUCE, BARRIER):
        return (
            f"{entry.kind} cannot run while rank(s) {gone} have joined (hvd.join()): only "
            f"allreduce serves ranks that ran out of data. Call {entry.kind} before join()."
        )
    return None
