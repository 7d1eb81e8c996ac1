"""Horovod's elastic API (``hvd.elastic``) on the engine: ``run``, ``State``, ``ObjectState``,
``TorchState`` and ``ElasticSampler``, with Horovod's behaviour for what they keep.

A state keeps what ``commit()`` saved (``_saved_*`` attributes, as Horovod names them) and
``sync()`` hands rank 0's to every rank. Ranks never join or leave a running job here: a job
that loses a rank is restarted whole (``HorovodRunner(max_restarts=N)``, or ``torchrun
--max-restarts``), and HorovodRunner resumes ``@hvd.elastic.run`` code from its last
``state.commit()`` (hvdrunner._launch.commits records every commit on the driver). So on
``HorovodInternalError`` the function restores the last commit and raises: the job's restart
takes over, where Horovod would re-form the job in place.

Example:
    >>> import hvdrunner.engine as hvd
    >>> hvd.init()
    >>> state = hvd.elastic.ObjectState(epoch=0)
    >>> @hvd.elastic.run
    ... def train(state):
    ...     state.epoch += 1
    ...     state.commit()
    ...     return state.epoch
    >>> train(state)
    1
    >>> hvd.shutdown()
"""

from __future__ import annotations

import copy
import functools
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch

from hvdrunner.engine import functions, state
from hvdrunner.errors import HorovodInternalError, HostsUpdatedInterrupt


class State:
    """What a training function commits and restores (Horovod's ``State``)."""

    def __init__(self, bcast_object: Callable[[Any], Any], get_rank: Callable[[], int]) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: float, update_res: Any) -> None:
        """Horovod's notification hook; hosts never change inside a job here."""

    def commit(self) -> None:
        """Save the state (what a restart resumes from), then check for host changes."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Hosts never change inside a running job here (a lost rank restarts the job)."""

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain attributes (numbers, lists, picklable objects) kept as a state."""

    def __init__(self, bcast_object: Callable[[Any], Any] | None = None,
                 get_rank: Callable[[], int] | None = None, **kwargs: Any) -> None:  # fmt: skip
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object or functions.broadcast_object, get_rank or state.rank)

    def save(self) -> None:
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr)) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


class _Handler:
    """One stateful object of a ``TorchState`` (model, optimizer or sampler): its
    ``state_dict()`` saved at each commit (a ``_saved_*`` attribute, as Horovod names what a
    commit keeps), loaded back on restore, and ``sync`` to hand rank 0's to every rank."""

    def __init__(self, value: Any, sync: Callable[[Any], None]) -> None:
        self.value, self._sync = value, sync
        self.save()

    def save(self) -> None:
        self._saved_value = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved_value)

    def sync(self) -> None:
        self._sync(self.value)


def _sync_model(model: torch.nn.Module) -> None:
    functions.broadcast_parameters(model.state_dict(), root_rank=0)


def _sync_optimizer(optimizer: torch.optim.Optimizer) -> None:
    functions.broadcast_optimizer_state(optimizer, root_rank=0)


def _sync_sampler(sampler: ElasticSampler) -> None:
    sampler.load_state_dict(functions.broadcast_object(sampler.state_dict()))


class TorchState(ObjectState):
    """A model, an optimizer, samplers and plain attributes kept as one state (Horovod's
    ``TorchState``)."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:  # fmt: skip
        kwargs.update(model=model, optimizer=optimizer)
        self._handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                self._handlers[name] = handler
        super().__init__(functions.broadcast_object, state.rank, **plain)

    def __getattr__(self, name: str) -> Any:
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            return handlers[name].value
        raise AttributeError(name)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()


def _handler_for(value: Any) -> _Handler | None:
    if isinstance(value, torch.nn.Module):
        return _Handler(value, _sync_model)
    if isinstance(value, torch.optim.Optimizer):
        return _Handler(value, _sync_optimizer)
    if isinstance(value, ElasticSampler):
        return _Handler(value, _sync_sampler)
    return None


class ElasticSampler(torch.utils.data.Sampler[int]):
    """A sampler that shards a dataset over the ranks and remembers how much of the epoch
    was processed (``record_batch``), so a resumed epoch does not repeat it."""

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Call at the end of an epoch: the next one starts from its first sample."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        self.num_replicas = state.size() if state.is_initialized() else 1
        self.rank = state.rank() if state.is_initialized() else 0
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        self.remaining_indices = indices[self.processed_num :]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[int]:
        indices = list(self.remaining_indices)
        indices += indices[: self.total_size - len(indices)]  # equal shards: wrap around
        return iter(indices[self.rank : self.total_size : self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


def run_fn(func: Callable[..., Any], reset: Callable[[], None]) -> Callable[..., Any]:
    """Horovod's elastic wrapper: sync the state from rank 0, then run ``func(state, ...)``.
    On a failed collective the last commit is restored and the error raised (the job's
    restart resumes from it; see the module docstring)."""

    @functools.wraps(func)
    def wrapper(elastic_state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    elastic_state.sync()
                return func(elastic_state, *args, **kwargs)
            except HorovodInternalError:
                elastic_state.restore()
                raise
            except HostsUpdatedInterrupt as exc:  # raised by user code only: run again
                skip_sync = exc.skip_sync
            reset()
            elastic_state.on_reset()

    return wrapper


def _reset() -> None:
    state.shutdown()
    state.init()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for ``train(state, ...)``: Horovod's ``@hvd.elastic.run``."""
    return run_fn(func, _reset)


__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "run", "run_fn"]
