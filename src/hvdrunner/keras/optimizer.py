"""Gradient averaging over ranks for any Keras optimizer, Keras 2 and Keras 3 alike.

Built on Horovod's core op ``grouped_allreduce`` only (``horovod.tensorflow``'s, or
``horovod.torch``'s on Keras 3's PyTorch backend: :mod:`hvdrunner.keras.backend`). The
optimizer keeps its class, config and state: its class is swapped for a subclass of itself
whose gradient entry point (``apply`` on Keras 3, ``apply_gradients`` on Keras 2) averages
the gradients over ranks first. Keras 3 routes ``apply_gradients`` through ``apply``, so
each step reduces once.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hvdrunner.core.settings import check_passes
from hvdrunner.keras import backend, compat

_MARK = "_hvdrunner_distributed"


def variable_key(var: Any) -> int:
    """Identity of a variable across Keras generations (Keras 3 wraps a framework tensor)."""
    return id(backend.tensor_of(var))


def allreduce_gradients(
    grads: list[Any], compression: Any, local: list[bool] | None = None,
    scale_local: bool = False,
) -> list[Any]:  # fmt: skip
    """Average ``grads`` over all ranks in one grouped allreduce (graph- and eager-safe).

    ``None`` gradients (variables the loss does not touch) stay ``None``; sparse gradients
    (``IndexedSlices`` from embeddings) are made dense first; ``local[i]`` keeps gradient
    ``i`` this rank's own (a variable registered with ``register_local_var``), divided by
    the number of ranks when ``scale_local`` (Horovod's ``scale_local_gradients=True``).
    """
    hvd = backend.horovod()
    if hvd.size() == 1:
        return list(grads)
    keep = local or [False] * len(grads)
    present = [i for i, g in enumerate(grads) if g is not None and not keep[i]]
    out = list(grads)
    if scale_local:  # as Horovod does (its pull/3695): a local gradient is scaled like the rest
        for i, g in enumerate(grads):
            if keep[i] and g is not None:
                out[i] = _scaled(g, 1.0 / hvd.size())
    if not present:
        return out
    dense = [_dense(grads[i]) for i in present]
    reduced = hvd.grouped_allreduce(dense, op=hvd.Average, compression=compression)
    for i, r in zip(present, reduced, strict=True):
        out[i] = r
    return out


def _dense(grad: Any) -> Any:
    """A grouped allreduce needs dense tensors (Horovod itself would allgather the slices of
    an embedding's ``IndexedSlices``, which costs more for all but the sparsest updates)."""
    if backend.is_torch():
        return grad  # Keras' torch trainer hands dense .grad tensors
    import tensorflow as tf

    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def _scaled(grad: Any, factor: float) -> Any:
    if backend.is_torch():
        return grad * factor
    import tensorflow as tf

    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * factor, grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


def _accumulators(opt: Any, grads: list[Any]) -> tuple[Any, list[Any]]:
    """``(counter, one zeroed variable per gradient)``, created once, outside any graph.

    Kept in ``__dict__`` (not as tracked attributes) so they are not optimizer state: they
    are not saved with the model or in checkpoints, and a reloaded optimizer is plain.
    """
    import tensorflow as tf

    state = opt.__dict__.get("_hvdrunner_acc")
    if state is None:
        with tf.init_scope():
            counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvdrunner_passes")
            accs = [
                None if g is None else tf.Variable(tf.zeros(g.shape, g.dtype), trainable=False)
                for g in grads
            ]
        state = opt.__dict__["_hvdrunner_acc"] = (counter, accs)
    return state


def _local_mask(opt: Any, variables: list[Any] | None) -> list[bool] | None:
    registered = opt.__dict__.get("_hvdrunner_local")
    if not registered or variables is None:
        return None
    return [variable_key(v) in registered for v in variables]


def _reduce_and_apply(
    opt: Any, grads: list[Any], apply: Any, variables: list[Any] | None = None
) -> Any:
    """``apply(averaged grads)`` now, or, with ``backward_passes_per_step=N > 1``, add the
    gradients to local accumulators and exchange + apply only on every N-th pass.

    Every rank passes the same steps, so every rank takes the same branch and the
    allreduce inside ``tf.cond`` is always joined. Skipped passes still advance the
    optimizer's ``iterations`` (as Horovod and Keras' own ``gradient_accumulation_steps``
    do): schedules and warmup keep counting batches.
    """

    passes = opt._hvdrunner_passes
    local = _local_mask(opt, variables)
    scale = opt.__dict__.get("_hvdrunner_scale_local", True)
    if passes == 1:
        return apply(allreduce_gradients(grads, opt._hvdrunner_compression, local, scale))
    if backend.is_torch():
        return _accumulate_eagerly(opt, grads, apply, local, scale)
    import tensorflow as tf

    counter, accs = _accumulators(opt, grads)
    updates = [
        acc.assign_add(tf.convert_to_tensor(g))
        for acc, g in zip(accs, grads, strict=True)
        if acc is not None and g is not None
    ]
    with tf.control_dependencies(updates):
        count = counter.assign_add(1)

    def exchange_and_apply() -> Any:
        factor = 1.0 / passes if opt._hvdrunner_average_passes else 1.0
        summed = [
            None if acc is None or g is None else acc.read_value() * tf.cast(factor, acc.dtype)
            for acc, g in zip(accs, grads, strict=True)
        ]
        with tf.control_dependencies(
            [apply(allreduce_gradients(summed, opt._hvdrunner_compression, local, scale))]
        ):
            resets = [acc.assign(tf.zeros_like(acc)) for acc in accs if acc is not None]
            resets.append(counter.assign(0))  # passes since the last exchange, as Horovod's
        with tf.control_dependencies(resets):
            return tf.constant(True)

    def accumulate_only() -> Any:
        # No control dependency on the assign's result: Keras 3 before 3.3 (15.4 LTS ML ships
        # 3.2.1) returns None from a Keras variable's assign_add. The branch runs the
        # stateful op anyway (tf.cond's branches keep automatic control dependencies).
        opt.iterations.assign_add(1)
        return tf.constant(False)

    return tf.cond(tf.equal(count % passes, 0), exchange_and_apply, accumulate_only)


def _accumulate_eagerly(
    opt: Any, grads: list[Any], apply: Any, local: list[bool] | None, scale: bool
) -> Any:
    """:func:`_reduce_and_apply`'s accumulation on Keras' PyTorch backend (eager: a Python
    branch, the same on every rank). The sums live in ``__dict__``, not optimizer state."""
    state = opt.__dict__.setdefault("_hvdrunner_eager_acc", {"count": 0, "sums": None})
    if state["sums"] is None:
        state["sums"] = [None if g is None else g.detach().clone() for g in grads]
    else:
        for acc, g in zip(state["sums"], grads, strict=True):
            if acc is not None and g is not None:
                acc.add_(g.detach())
    state["count"] += 1
    passes = opt._hvdrunner_passes
    if state["count"] % passes:
        opt.iterations.assign_add(1)
        return opt.iterations
    factor = 1.0 / passes if opt._hvdrunner_average_passes else 1.0
    summed = [None if acc is None else acc * factor for acc in state["sums"]]
    state["sums"] = None
    return apply(allreduce_gradients(summed, opt._hvdrunner_compression, local, scale))


def _subclass(base: type, keras3: bool) -> type:
    if keras3:

        def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
            def update(reduced: list[Any]) -> Any:
                base.apply(self, reduced, trainable_variables)  # type: ignore[attr-defined]
                return self.iterations

            variables = trainable_variables or getattr(self, "_trainable_variables", None)
            return _reduce_and_apply(self, list(grads), update, list(variables or []) or None)

        methods: dict[str, Any] = {"apply": apply}
    else:

        def apply_gradients(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
            pairs = list(grads_and_vars)
            variables = [v for _, v in pairs]
            if _reduced_already(self, [g for g, _ in pairs]):
                return base.apply_gradients(self, pairs, *args, **kwargs)  # type: ignore[attr-defined]

            def update(reduced: list[Any]) -> Any:
                return base.apply_gradients(  # type: ignore[attr-defined]
                    self, list(zip(reduced, variables, strict=True)), *args, **kwargs
                )

            return _reduce_and_apply(self, [g for g, _ in pairs], update, variables)

        def _compute_gradients(self: Any, loss: Any, var_list: Any, grad_loss: Any = None,
                               tape: Any = None) -> list[Any]:  # fmt: skip
            """Horovod's ``_compute_gradients``: the gradients averaged over ranks (local
            variables' kept), which ``apply_gradients`` then applies as they are. With
            ``backward_passes_per_step > 1`` this rank's own: ``apply_gradients``
            accumulates and exchanges them."""
            parent: Any = base
            if hasattr(parent, "_compute_gradients"):  # Keras 2's legacy optimizers
                pairs = parent._compute_gradients(self, loss, var_list, grad_loss, tape)
            else:
                pairs = parent.compute_gradients(self, loss, var_list, tape=tape)
            pairs = list(pairs)
            if self._hvdrunner_passes > 1:
                return pairs
            variables = [v for _, v in pairs]
            reduced = allreduce_gradients(
                [g for g, _ in pairs], self._hvdrunner_compression, _local_mask(self, variables),
                self.__dict__.get("_hvdrunner_scale_local", True),
            )  # fmt: skip
            self.__dict__["_hvdrunner_reduced"] = {id(g) for g in reduced if g is not None}
            return list(zip(reduced, variables, strict=True))

        methods = {"apply_gradients": apply_gradients, "_compute_gradients": _compute_gradients}
    # Same name and module as the base: a saved model (with its optimizer) deserializes as
    # the plain optimizer wherever hvdrunner/horovod are absent.
    methods.update({"__module__": base.__module__, "__qualname__": base.__qualname__, _MARK: True,
                    "register_local_var": _register_local_var,
                    "_agg_helper": property(_aggregation)})  # fmt: skip
    return type(base.__name__, (base,), methods)


def distribute(
    optimizer: Any,
    *,
    compression: str | Any = "none",
    sparse_as_dense: bool = True,
    backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = True,
    scale_local_gradients: bool = True,
) -> Any:
    """Make ``optimizer`` average its gradients over all ranks before applying them.

    Works on Keras 3 and Keras 2 optimizers (``tf.keras``, ``tf_keras``, legacy ones). The
    same object is returned, now a subclass of its own class; calling it twice is harmless.

    Args:
        optimizer: a Keras optimizer instance.
        compression: ``"none"`` or ``"fp16"`` (gradients travel as float16: half the bytes).
        sparse_as_dense: accepted for Horovod compatibility; sparse gradients are always
            averaged as dense tensors here.
        backward_passes_per_step: ``N > 1`` accumulates the gradients of N batches locally
            and exchanges (and applies) them once: N times fewer allreduces, an effective
            batch of ``N * batch_size * ranks`` per update.
        average_aggregated_gradients: with ``N > 1``, average the N local gradients (the
            update of one N-times larger batch) rather than sum them (Horovod's default in
            its own ``DistributedOptimizer``, which ``hvd_keras`` keeps).
        scale_local_gradients: divide the gradients of variables registered local
            (``register_local_var``) by the number of ranks, as Horovod does by default.

    Example:
        >>> opt = distribute(keras.optimizers.Adam(1e-3))  # doctest: +SKIP
    """
    if getattr(type(optimizer), _MARK, False):
        return optimizer
    compat.check_backend()
    keras3 = compat.is_keras3()
    if not hasattr(optimizer, "apply" if keras3 else "apply_gradients"):
        raise TypeError(
            f"DistributedOptimizer needs a Keras optimizer instance (keras.optimizers.*), "
            f"got {type(optimizer).__module__}.{type(optimizer).__qualname__}"
        )
    check_passes(backward_passes_per_step)
    if backward_passes_per_step > 1 and getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError(
            "the optimizer already has Keras' gradient_accumulation_steps: that accumulates "
            "after the allreduce, so every batch would still be exchanged. Drop it and pass "
            "backward_passes_per_step instead."
        )
    optimizer._hvdrunner_compression = backend.compression(compression)
    optimizer._hvdrunner_passes = backward_passes_per_step
    optimizer._hvdrunner_average_passes = bool(average_aggregated_gradients)
    optimizer._hvdrunner_scale_local = bool(scale_local_gradients)
    optimizer.__class__ = _subclass(type(optimizer), keras3)
    return optimizer


def _reduced_already(opt: Any, grads: list[Any]) -> bool:
    """Whether ``grads`` are what ``_compute_gradients`` returned averaged (then applied as
    they are, not averaged twice)."""
    done = opt.__dict__.pop("_hvdrunner_reduced", None)
    present = [g for g in grads if g is not None]
    return bool(done) and bool(present) and all(id(g) in done for g in present)


def _aggregation(self: Any) -> Any:
    """Horovod's ``_agg_helper``: its ``counter`` is the backward passes accumulated since
    the last exchange (``None`` before the first pass, or with one pass per step)."""
    state = self.__dict__.get("_hvdrunner_acc")
    return None if state is None else SimpleNamespace(counter=state[0])


def _register_local_var(self: Any, var: Any) -> None:
    """Horovod's ``register_local_var``: this variable's gradient is not averaged over ranks
    (each rank applies its own), e.g. a per-rank embedding or a local head."""
    self.__dict__.setdefault("_hvdrunner_local", set()).add(variable_key(var))
