"""Horovod's ``DistributedOptimizer``: gradients averaged over the ranks as backward makes them.

The returned optimizer is an instance of the wrapped optimizer's own class (``isinstance``
and ``state_dict`` unchanged), with a hook on every trainable parameter: once its gradient is
accumulated ``backward_passes_per_step`` times, its allreduce is requested (or its group's,
once the whole group is ready); ``step()`` waits for them first. ``groups=None`` means what
it means in Horovod: one request per gradient, which the engine fuses with the others ready
in the same round into one buffer. Once every rank's optimizer agreed on its buckets (at the
end of the first step), the buckets take the gradient lane (engine.lane): no negotiation
round per step, the same results bit for bit. The buckets are the groups given, or for
``groups=None`` the one bucket rule (engine.grouping.buckets, DDP's).

Example:
    >>> from hvdrunner.engine import state
    >>> import torch
    >>> state.init()
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
    ...                            named_parameters=model.named_parameters())
    >>> isinstance(opt, torch.optim.SGD)
    True
    >>> state.shutdown()
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from hvdrunner.engine import ops, state
from hvdrunner.engine.compression import Compression, Compressor
from hvdrunner.engine.grouping import buckets, check_groups, parameter_names
from hvdrunner.engine.lane import Reducer
from hvdrunner.engine.ops import ADASUM, ADASUM_REFUSED, AVERAGE, SUM, synchronize
from hvdrunner.engine.process_sets import ProcessSet, global_process_set

#: The negotiated allreduce by which the ranks' optimizers agree to take the gradient lane.
LANE_OFFER = "hvdrunner.gradient_lane"
EXTRA_PASS = (
    "Gradients were computed more than backward_passes_per_step times before call to step() "
    "(parameter {name!r}, backward_passes_per_step={passes}). Increase "
    "backward_passes_per_step to accumulate gradients locally."
)


class _Distributed(torch.optim.Optimizer):
    """The methods the wrapper adds; mixed into a subclass of the user's optimizer class."""

    _hvd_base: type  # the subclass of the user's optimizer class this body is copied into

    def _hvd_setup(self, named: list[tuple[str, torch.Tensor]] | None, compression: Any,
                   passes: int, op: int, predivide: float, groups: Any, sparse_as_dense: bool,
                   process_set: ProcessSet) -> None:  # fmt: skip
        self._compression = compression
        self._parameter_names = parameter_names(self.param_groups, named)
        self.backward_passes_per_step = passes
        self.op, self.gradient_predivide_factor = op, predivide
        self.sparse_as_dense, self.process_set = sparse_as_dense, process_set
        self._delay = {p: passes for p in self._parameter_names}
        self._handles: dict[Any, tuple[Any, Any]] = {}
        self._hooks: list[Any] = []
        self._requires_update: set[torch.Tensor] = set()
        self._synchronized = False
        self._should_synchronize = True
        # No groups given: one request per gradient on the negotiated path (Horovod's
        # meaning), and DDP-like buckets (engine.grouping) for the lane only, where a request
        # per gradient would be an allreduce per gradient. Results are the same either way
        # (sums are elementwise).
        self._groups = check_groups(groups)
        self._per_tensor = groups is None
        self._p_to_group: dict[torch.Tensor, tuple[torch.Tensor, ...]] = {}
        self._group_counts: dict[tuple[torch.Tensor, ...], int] = {}  # in bucket order
        # The gradient lane (engine.lane), once the ranks agreed on this optimizer's buckets.
        self._reducer = Reducer((), self._parameter_names, compression, offering=False)
        if process_set.included() and (state.size() > 1 or state.current().settings.elastic):
            self._register_hooks()

    def _trainable(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"] if p.requires_grad]

    def _register_hooks(self) -> None:
        self._form_groups()
        for p in self._trainable():
            self._requires_update.add(p)
            self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(p)))

    def _form_groups(self) -> None:
        from hvdrunner.engine.functions import broadcast_object

        params = self._trainable()
        # Rank 0's order, so that every rank forms the same groups.
        order = broadcast_object([self._parameter_names[p] for p in params], root_rank=0,
                                 name="optimizer.parameter_order", process_set=self.process_set)  # fmt: skip
        params.sort(key=lambda p: order.index(self._parameter_names[p]))
        if self._groups is None:
            formed = buckets(params)
        elif isinstance(self._groups, list):
            ids = {id(p) for p in params}
            formed = [tuple(p for p in g if id(p) in ids) for g in self._groups]
            grouped = {id(p) for g in formed for p in g}
            formed += [(p,) for p in params if id(p) not in grouped]
        else:
            n = self._groups
            size, extra = divmod(len(params), n)
            formed, start = [], 0
            for i in range(n):
                stop = start + size + (1 if i < extra else 0)
                formed.append(tuple(params[start:stop]))
                start = stop
        for group in (g for g in formed if g):
            for p in group:
                self._p_to_group[p] = group
            self._group_counts[group] = 0
        offering = self.process_set.process_set_id == 0  # only the global set's ask
        self._reducer = Reducer(list(self._group_counts), self._parameter_names,
                                self._compression, offering)  # fmt: skip

    def _make_hook(self, p: torch.Tensor) -> Any:
        def hook(*_: Any) -> None:
            # Every parameter, bucketed or alone: a pass beyond backward_passes_per_step
            # would change a gradient after its allreduce was sent (the ranks' weights then
            # drift apart in silence). Horovod raises here; so do we.
            if self._delay[p] <= 0:
                raise AssertionError(EXTRA_PASS.format(passes=self.backward_passes_per_step,
                                                       name=self._parameter_names[p]))  # fmt: skip
            self._delay[p] -= 1
            handle, ctx = None, None
            if self._delay[p] == 0:
                if self._grouped():
                    if p.grad is not None and p.grad.is_sparse:  # goes alone, sparse
                        self._handles[p] = self._allreduce_async(p)
                    group = self._p_to_group[p]
                    self._group_counts[group] += 1
                    if self._group_counts[group] == len(group):
                        self._submit_group(group)
                    return
                handle, ctx = self._allreduce_async(p)
            self._handles[p] = (handle, ctx)

        return hook

    def _grouped(self) -> bool:
        """Whether gradients go by groups now: given groups, or the lane's buckets once the
        ranks took the lane; else one request each (``groups=None``, negotiated)."""
        return not self._per_tensor or self._on_lane()

    def _scales(self) -> tuple[float, float]:
        if self.op == AVERAGE:
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _allreduce_async(self, p: torch.Tensor) -> tuple[Any, Any]:
        if p.grad is None:  # another rank may have a gradient for it (dynamic graphs)
            p.grad = torch.zeros_like(p)
        name, grad = self._parameter_names[p], p.grad
        if grad.is_sparse:
            if not self.sparse_as_dense:
                return ops.sparse_allreduce_async(grad, name, self.op, self.process_set), None
            grad = grad.to_dense()
        sent, ctx = self._compression.compress(grad)
        pre, post = self._scales()
        handle = ops.allreduce_async_(sent, name=name, op=self.op, prescale_factor=pre,
                                      postscale_factor=post, process_set=self.process_set)  # fmt: skip
        return handle, ctx

    def _submit_group(self, group: tuple[torch.Tensor, ...]) -> None:
        """A group's one grouped request (its sparse gradients went alone at their hooks);
        missing gradients count as zeros, so every rank sends every group, by one name."""
        for p in group:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self._on_lane():
            self._lane_post(group)
            self._group_counts[group] = -1
            return
        dense = tuple(p for p in group if p.grad is None or not p.grad.is_sparse)
        if dense:
            self._handles[dense] = self._grouped_async(dense)
        self._group_counts[group] = -1  # sent this step

    def _grouped_async(self, group: tuple[torch.Tensor, ...]) -> tuple[Any, Any]:
        sent, ctxs = zip(*[self._compression.compress(p.grad) for p in group], strict=False)
        pre, post = self._scales()
        handle = ops.grouped_allreduce_async_(list(sent), name=self._parameter_names[group[0]], op=self.op,
                                              prescale_factor=pre, postscale_factor=post,
                                              process_set=self.process_set)  # fmt: skip
        return handle, ctxs

    # -- the gradient lane (engine.lane) ---------------------------------------------------
    def _on_lane(self) -> bool:
        return self._reducer.active(state.current().lane)

    def _lane_post(self, group: tuple[torch.Tensor, ...]) -> None:
        self._reducer.post(group)

    def _lane_synchronize(self) -> None:
        try:
            for group, count in list(self._group_counts.items()):
                if count != -1:  # backward did not complete it here: it goes now
                    self._submit_group(group)
            self._reducer.finish()
        finally:
            self._handles.clear()  # the passes' placeholders (backward_passes_per_step > 1)
            for group in self._group_counts:
                self._group_counts[group] = 0
        for p in self._p_to_group:
            self._delay[p] = self.backward_passes_per_step

    def _offer_lane(self) -> None:
        def agree(offer: torch.Tensor) -> torch.Tensor:
            return synchronize(ops.allreduce_async(offer, op=SUM, name=LANE_OFFER,
                                                   process_set=self.process_set))  # fmt: skip

        self._reducer.offer(state.current().lane, self.op, *self._scales(), agree)

    def synchronize(self) -> None:
        """Wait for every gradient's allreduce (requesting those backward did not reach)."""
        if not self.process_set.included():
            self._synchronized = True
            return
        if self._on_lane():
            self._lane_synchronize()
            self._synchronized = True
            return
        grouped = set(self._p_to_group) if self._grouped() else set()
        for key, (handle, _ctx) in list(self._handles.items()):
            if handle is None and key in grouped:  # its group goes as one, below
                del self._handles[key]
        for group, count in list(self._group_counts.items()):
            if grouped and count != -1:  # backward did not complete it here (it may elsewhere)
                for p in group:
                    if p.grad is not None and p.grad.is_sparse and p not in self._handles:
                        self._handles[p] = self._allreduce_async(p)
                self._submit_group(group)
        done: set[torch.Tensor] = set()
        for key in self._handles:
            done.update(key) if isinstance(key, tuple) else done.add(key)
        for p in self._requires_update - done - grouped:
            self._handles[p] = self._allreduce_async(p)
        for key, (handle, _ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[key] = self._allreduce_async(key)
        for key, (handle, ctx) in self._handles.items():
            if isinstance(key, tuple):
                for p, out, c in zip(key, synchronize(handle), ctx, strict=False):
                    self._delay[p] = self.backward_passes_per_step
                    p.grad.set_(self._compression.decompress(out, c))
                continue
            out = synchronize(handle)
            self._delay[key] = self.backward_passes_per_step
            if key.grad.is_sparse:
                merged = self._compression.decompress(out, ctx)
                key.grad.zero_().add_(merged if merged.is_sparse else merged.to_sparse())
            else:
                key.grad.set_(self._compression.decompress(out, ctx))
        for group in self._group_counts:
            self._group_counts[group] = 0
        self._handles.clear()
        self._synchronized = True
        if self._reducer.offering and self._group_counts:
            self._offer_lane()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """``step()`` inside does not synchronize (call ``synchronize()`` yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _base(self) -> Any:
        # The user's optimizer class: this class is copied into a subclass of it at wrap time.
        return super(self._hvd_base, self)

    def step(self, closure: Any = None) -> Any:
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to "
                    "consider using optimizer.skip_synchronize() context if you use "
                    "optimizer.synchronize() in your code.", stacklevel=2,
                )  # fmt: skip
            self.synchronize()
        self._synchronized = False
        return self._base().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._handles or self._reducer.step is not None:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it can "
                "cause a race condition."
            )
        return self._base().zero_grad(set_to_none)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._reducer.step is not None:  # posted buckets: the peers wait for the rest
            self._lane_synchronize()
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        self._base().load_state_dict(state_dict)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = AVERAGE,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: ProcessSet = global_process_set,
) -> torch.optim.Optimizer:
    """``optimizer`` whose ``step()`` first averages the gradients over the ranks (Horovod's
    arguments and behaviour; ``op=hvd.Adasum`` is refused, naming why)."""
    if gradient_predivide_factor != 1.0 and op != AVERAGE:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed "
                      "in v0.23.0.", DeprecationWarning, stacklevel=2)  # fmt: skip
        groups = num_groups if groups is None else groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == ADASUM and state.size() > 1:
        raise NotImplementedError(ADASUM_REFUSED)
    base = optimizer.__class__
    cls: Any = type(base.__name__, (base,), {k: v for k, v in vars(_Distributed).items()
                                        if k not in ("__dict__", "__weakref__")})  # fmt: skip
    cls._hvd_base = cls
    wrapped: Any = object.__new__(cls)
    torch.optim.Optimizer.__init__(wrapped, optimizer.param_groups, optimizer.defaults)
    # What the user's optimizer made in its own __init__ (Adagrad's per-parameter "sum",
    # which its step() reads: torch 2.3.1 and 2.9 alike) or loaded since, and its attributes.
    wrapped.state.update(optimizer.state)
    for key, value in vars(optimizer).items():
        wrapped.__dict__.setdefault(key, value)
    named = list(named_parameters) if named_parameters is not None else None
    wrapped._hvd_setup(named, compression, backward_passes_per_step, op,
                       gradient_predivide_factor, groups, sparse_as_dense, process_set)  # fmt: skip
    return wrapped
