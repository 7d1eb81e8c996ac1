"""``MdsData``: MDS shards as every rank reads them through Mosaic Streaming, with equal steps.

Streaming gives every rank ``ceil(rows / ranks)`` samples an epoch (it repeats a few to fill
the last ranks) in ``ceil(samples / batch_size)`` batches, the last one short, reshuffled each
epoch from one seed; hvdrunner checks each epoch against that count, so a rank that would run
another number of steps stops with an error instead of leaving the others in an allreduce.

Example:
    >>> data = MdsData("/tmp/mds", 101, (("x", "ndarray:float32"), ("y", "int64")), ("x",), "y")
    >>> data.steps_per_epoch(8, num_ranks=2)  # 51 samples a rank: 6 batches of 8 and one of 3
    7
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import math
import os
import queue
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hvdrunner import _leftovers as leftovers
from hvdrunner._checks import is_int
from hvdrunner.data.transform import TransformSpec, as_fed, fed_columns
from hvdrunner.data.transform import apply as apply_transform
from hvdrunner.distributed import rank, size
from hvdrunner.streaming import world

#: DataLoader worker processes a rank decodes with (Streaming's own default is none).
WORKERS = 2


def collate(
    samples: list[dict[str, Any]], columns: tuple[tuple[str, str], ...],
    spec: TransformSpec | None,
) -> dict[str, Any]:  # fmt: skip
    """Streaming's samples as one ``{column: numpy array}`` batch, transformed by ``spec``
    (in the DataLoader's worker processes: decoding runs beside the model, not before it)."""
    import numpy as np

    batch = {}
    for name, encoding in columns:
        values = [s[name] for s in samples]
        if encoding in ("str", "bytes"):
            batch[name] = np.array(values, dtype=object)
        elif encoding.startswith("ndarray:"):
            batch[name] = np.stack(values)
        else:
            batch[name] = np.asarray(values)
    return batch if spec is None else apply_transform(spec, batch)


class _Portable:
    """``fn``, sent to a DataLoader worker by value (cloudpickle): a worker the forkserver
    starts unpickles it, and a transform defined in a notebook has no module to be found in."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)

    def __getstate__(self) -> bytes:
        import cloudpickle

        return cloudpickle.dumps(self.fn)

    def __setstate__(self, blob: bytes) -> None:
        import cloudpickle

        self.fn = cloudpickle.loads(blob)


#: What the forkserver imports once, so that each worker it forks starts at once.
FORKSERVER_PRELOAD = ["torch", "streaming", "hvdrunner.streaming.handle"]


def _worker_context() -> Any:
    """How this process starts DataLoader workers: ``None`` (fork, the fastest) unless
    TensorFlow is loaded here, then the forkserver.

    Why: a process forked while TensorFlow's threads run can stop inside ``os.fork()`` for
    good, before any Python runs in it. Seen in Keras fit on TensorFlow from MDS shards (15.4
    replica, about 1 job in 25 under load): one rank's worker never started, and the three
    others waited for it in Streaming's barrier until the job's stall bound. The forkserver
    is a process of its own with no TensorFlow in it (started once per rank, torch and
    Streaming imported there), and it forks the workers.
    """
    if "tensorflow" not in sys.modules:
        return None
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(FORKSERVER_PRELOAD)
    _remove_temp_dir_at_rank_end()
    return context


@functools.cache
def _remove_temp_dir_at_rank_end() -> None:
    """multiprocessing's temporary folder (``pymp-*``, where the forkserver listens), removed
    when the rank ends: Python removes it at exit, which a rank leaving with ``os._exit``
    never reaches (every rank left one in the temporary folder)."""
    from multiprocessing import util

    folder = util.get_temp_dir()
    leftovers.record(folder, [folder])


def _put(q: queue.Queue[Any], item: Any, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


#: How long a consumer that leaves waits for the producer to let go of its iterator (a
#: DataLoader between two batches: well under a second).
PRODUCER_EXIT_S = 30.0


def in_python_thread(make: Callable[[], Iterator[Any]], depth: int = 2) -> Iterator[Any]:
    """``make()``'s items, produced in a thread Python started. When the consumer leaves
    (closed, or dropped), the producer has closed ``make()``'s iterator before it goes on.

    Why the thread: the DataLoader forks its workers in the thread that starts an epoch.
    tf.data runs a generator in a thread TensorFlow started, and a process forked from such a
    thread fails Python 3.12's ``threading._shutdown`` when it exits: every worker ends with
    code 1, which the DataLoader reports as a crashed worker in the middle of training.
    Why the wait: a StreamingDataset made next over the same shards must not find this one
    still alive (Streaming before 0.11 then registers the new one under another name on that
    rank only: world.check_registration). Without it, fit's first-batch probe (tf_feed) left
    its dataset to a producer still between two batches on one rank of two (CI, 15.4).
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop, end = threading.Event(), object()

    def produce() -> None:
        items: Iterator[Any] | None = None
        try:
            items = make()
            for item in items:
                if not _put(q, (True, item), stop):
                    return  # the consumer left
            _put(q, (True, end), stop)
        except BaseException as exc:  # noqa: BLE001 - raised again in the consumer
            _put(q, (False, exc), stop)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # ends the loader: its workers, its dataset's registration

    producer = threading.Thread(target=produce, name="hvdrunner-streaming-feed", daemon=True)
    producer.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is end:
                return
            yield item
    finally:
        stop.set()
        producer.join(PRODUCER_EXIT_S)


def _stop_workers(loader: Any) -> None:
    """Stop ``loader``'s worker processes now, while its queues are alive.

    Why: left to the garbage collector (a rank's DataLoader sits in a reference cycle), the
    queues' finalizers run first and stop the thread that would send each worker its stop
    message; the DataLoader then waits out its 5 s timeout per worker before killing it: 10 s
    at the end of every 2-worker feed, measured on torch 2.9.
    """
    stop = getattr(getattr(loader, "_iterator", None), "_shutdown_workers", None)
    if stop is not None:
        stop()


def _release_at_rank_end(ds: Any) -> None:
    """The dataset's shared memory and file locks on this host (Streaming names them by the
    prefix it registered), removed when the rank ends: a rank leaves with ``os._exit`` or is
    killed, so Streaming's own cleanup at exit never runs (hvdrunner._leftovers)."""
    prefix = f"{int(ds._shm_prefix_int):06}"
    shm = "/dev/shm"
    leftovers.record(os.path.join(shm, f"{prefix}_locals"),
                     [os.path.join(shm, f"{prefix}_*"),
                      os.path.join(tempfile.gettempdir(), f"{prefix}_*")])  # fmt: skip


@dataclass(frozen=True)
class MdsData:
    """A picklable handle on MDS shards (:func:`hvdrunner.streaming.write_mds`): what
    ``hvdrunner.torch.fit`` and ``hvdrunner.keras.fit`` (on PyTorch) take as ``data``, and a
    ``StreamingDataset`` for a loop of your own (:meth:`dataset`)."""

    path: str
    num_rows: int
    columns: tuple[tuple[str, str], ...]  # (name, MDS encoding), as written
    features: tuple[str, ...]
    label: str | None
    single_feature: bool = True
    transform: TransformSpec | None = field(default=None)
    workers: int = WORKERS

    def transformed(
        self, spec: TransformSpec, features: str | list[str], label: str | None = None,
        workers: int | None = None,
    ) -> MdsData:  # fmt: skip
        """This data decoded on the ranks by ``spec`` (petastorm's ``TransformSpec``), fed as
        ``features`` (and ``label``), columns of the transform's output; ``workers``: the
        DataLoader processes per rank that decode.

        Example:
            >>> images = data.transformed(spec, "features", "label_index")  # doctest: +SKIP
        """
        feats = fed_columns(spec, features, label, [name for name, _ in self.columns])
        if workers is not None and not is_int(workers, at_least=0):
            raise ValueError(f"workers={workers!r} must be an int >= 0 (decoding processes)")
        return dataclasses.replace(
            self, transform=spec, features=feats, label=label,
            single_feature=isinstance(features, str),
            workers=self.workers if workers is None else workers,
        )  # fmt: skip

    # -- sizes -----------------------------------------------------------------------------
    def rows_per_rank(self, num_ranks: int | None = None) -> int:
        """Samples each rank reads per epoch (Streaming repeats a few to make them equal)."""
        return math.ceil(self.num_rows / (num_ranks or size()))

    def steps_per_epoch(self, batch_size: int, num_ranks: int | None = None) -> int:
        """Batches per epoch, the same on every rank (the last one short when the samples do
        not divide).

        Raises:
            ValueError: ``batch_size`` is not a positive int, or exceeds a rank's samples.
        """
        per = self.rows_per_rank(num_ranks)
        if not is_int(batch_size, at_least=1):
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if batch_size > per:
            raise ValueError(
                f"batch_size={batch_size} is larger than one rank's samples ({per} of "
                f"{self.num_rows} over {num_ranks or size()} ranks). Use batch_size<={per} or "
                f"fewer ranks."
            )
        return math.ceil(per / batch_size)

    # -- reading ---------------------------------------------------------------------------
    def dataset(
        self, batch_size: int, *, shuffle: bool = True, seed: int = 0, **options: Any
    ) -> Any:
        """This rank's ``streaming.StreamingDataset`` over the shards, the world checked first
        (:func:`hvdrunner.streaming.world.check`). ``options`` go to Streaming as they are.

        Example:
            >>> ds = data.dataset(64)                       # doctest: +SKIP
            >>> loader = streaming.StreamingDataLoader(ds, batch_size=64)
        """
        world.check()
        from streaming import StreamingDataset

        options.setdefault("num_canonical_nodes", world.nodes())
        # An earlier dataset that is garbage in a reference cycle still holds its shared
        # memory registration until collected (world.check_registration says why it matters).
        gc.collect()
        ds = StreamingDataset(local=self.path, batch_size=batch_size, shuffle=shuffle,
                              shuffle_seed=seed, **options)  # fmt: skip
        _release_at_rank_end(ds)
        world.check_registration(int(ds._shm_prefix_int))
        return ds

    def loader(
        self, batch_size: int, *, shuffle: bool = True, seed: int = 0, first_epoch: int = 0,
        first_step: int = 0,
    ) -> Any:  # fmt: skip
        """A ``DataLoader`` of ``{column: numpy array}`` batches (transformed), starting at
        step ``first_step`` of epoch ``first_epoch`` of the seeded order; each pass over it is
        the next epoch."""
        from torch.utils.data import DataLoader

        ds = self.dataset(batch_size, shuffle=shuffle, seed=seed)
        if first_epoch or first_step:
            # Streaming counts the samples every rank has consumed, not this rank's.
            ds.load_state_dict({
                "epoch": first_epoch, "sample_in_epoch": first_step * batch_size * size(),
                "shuffle_seed": seed, "num_canonical_nodes": world.nodes(),
                "initial_physical_nodes": world.nodes(),
            })  # fmt: skip
        fn = functools.partial(collate, columns=self.columns, spec=self.transform)
        if not self.workers:
            return DataLoader(ds, batch_size=batch_size, collate_fn=fn)
        # Persistent workers: an epoch starts without forking and importing them again.
        return DataLoader(ds, batch_size=batch_size, num_workers=self.workers,
                          collate_fn=_Portable(fn), persistent_workers=True,
                          multiprocessing_context=_worker_context())  # fmt: skip

    def batches(
        self, batch_size: int, *, shuffle: bool = True, seed: int = 0, first_epoch: int = 0,
        first_step: int = 0, in_memory: bool | None = None,
    ) -> Iterator[dict[str, Any]]:  # fmt: skip
        """Endless ``{column: numpy array}`` batches, :meth:`steps_per_epoch` an epoch on every
        rank (checked: another count raises instead of leaving a rank behind). ``first_epoch``
        and ``first_step`` resume mid-epoch where a run stopped (Streaming skips what the ranks
        had read), e.g. from a Horovod elastic state's committed epoch and batch. ``in_memory``
        is accepted for ``fit`` and ignored: Streaming reads from its shards.

        Example:
            >>> feed = data.batches(64, first_epoch=state.epoch, first_step=state.batch)  # doctest: +SKIP
        """
        del in_memory
        steps = self.steps_per_epoch(batch_size)
        if not is_int(first_step, at_least=0) or first_step >= steps:
            raise ValueError(f"first_step={first_step!r} must be an int in [0, {steps}): the "
                             f"steps of an epoch at batch_size={batch_size}")  # fmt: skip
        loader = self.loader(batch_size, shuffle=shuffle, seed=seed, first_epoch=first_epoch,
                             first_step=first_step)  # fmt: skip
        epoch, want = first_epoch, steps - first_step
        try:
            while True:
                it, got = iter(loader), 0
                for batch in it:
                    got += 1
                    if got > want:
                        break
                    yield batch
                if got != want:
                    raise RuntimeError(
                        f"rank {rank()}: Mosaic Streaming gave "
                        f"{'more than ' if got > want else ''}{min(got, want)} batches in epoch "
                        f"{epoch}, where every rank must run {want} ({self.num_rows} rows, "
                        f"{size()} ranks, batch_size={batch_size}): the ranks would fall out "
                        f"of step. Were the shards at {self.path} changed?"
                    )
                del it
                epoch, want = epoch + 1, steps
        finally:  # the feed closed, dropped or failed
            _stop_workers(loader)

    @contextlib.contextmanager
    def tf_dataset(
        self, batch_size: int, *, shuffle: bool = True, seed: int = 0, first_epoch: int = 0,
        in_memory: bool | None = None, prefetch: int = 2,
    ) -> Iterator[Any]:  # fmt: skip
        """The batches of :meth:`batches` as an endless ``tf.data.Dataset`` of ``(x, y)``
        (what ``hvdrunner.keras.fit`` on TensorFlow reads).

        Example:
            >>> with data.tf_dataset(64) as ds:  # doctest: +SKIP
            ...     model.fit(ds, steps_per_epoch=data.steps_per_epoch(64), epochs=5)
        """
        from hvdrunner.data import tf_feed

        def feed() -> Iterator[dict[str, Any]]:
            return in_python_thread(lambda: self.batches(batch_size, shuffle=shuffle, seed=seed,
                                                         first_epoch=first_epoch))  # fmt: skip

        variable = self.transform.variable_axes() if self.transform is not None else {}
        ds = tf_feed.generator_dataset(feed, self.structure, partial=True, variable=variable)
        yield ds.prefetch(prefetch)

    def structure(self, batch: dict[str, Any]) -> Any:
        """A batch as the model is fed (:func:`~hvdrunner.data.transform.as_fed`)."""
        return as_fed(batch, self.features, self.label, self.single_feature)


__all__ = ["MdsData", "collate"]
