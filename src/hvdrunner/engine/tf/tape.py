"""Horovod's ``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` returns
the gradients averaged over the ranks.

Gradients are reduced as Horovod does by default: one request per gradient (``groups=None``),
all in flight together; ``groups`` or ``num_groups`` make grouped requests. ``None``
gradients stay ``None``; ``tf.IndexedSlices`` are gathered, or made dense with
``sparse_as_dense=True``; a source registered with ``register_local_source`` keeps this rank's
own gradient (divided by the number of ranks when ``scale_local_gradients``).

Example:
    >>> with tf.GradientTape() as tape:  # doctest: +SKIP
    ...     loss = model(x)
    >>> tape = DistributedGradientTape(tape)
    >>> grads = tape.gradient(loss, model.trainable_variables)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from hvdrunner.engine import state
from hvdrunner.engine.process_sets import ProcessSet, global_process_set
from hvdrunner.engine.tf import collectives, ops
from hvdrunner.engine.tf.compression import Compression


def _groups(n: int, num_groups: int, groups: Any, sources: Sequence[Any]) -> list[list[int]] | None:
    """Indices of the gradients reduced together: ``None`` for one request each."""
    if groups is not None:
        if isinstance(groups, int):
            num_groups = groups
        else:
            ids = {id(v): i for i, v in enumerate(sources)}
            picked = [[ids[id(v)] for v in g if id(v) in ids] for g in groups]
            rest = sorted(set(range(n)) - {i for g in picked for i in g})
            return [g for g in picked if g] + [[i] for i in rest]
    if num_groups <= 0:
        return None
    size = -(-n // num_groups)
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape``: everything is the tape's, but ``gradient()`` averages."""

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "",
                 device_sparse: str = "", compression: Any = Compression.none,
                 sparse_as_dense: bool = False, op: int = ops.Average,
                 gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                 groups: Any = None, process_set: ProcessSet = global_process_set,
                 scale_local_gradients: bool = True) -> None:  # fmt: skip
        if op == ops.Adasum:
            raise NotImplementedError(ops.engine_ops.ADASUM_REFUSED)
        if gradient_predivide_factor != 1.0 and op != ops.Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        self._tape = gradtape
        self._options = (compression, sparse_as_dense, op, gradient_predivide_factor,
                         num_groups, groups, process_set, scale_local_gradients)  # fmt: skip
        self._local: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._tape.__exit__(*exc)

    def register_local_source(self, source: Any) -> None:
        """``source``'s gradient stays this rank's own (not averaged over ranks)."""
        self._local.add(id(source))

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 **kwargs: Any) -> Any:  # fmt: skip
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(grads, expand_composites=False)
        reduced = self._reduce(list(flat), flat_sources)
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None,
                                       use_generic_names: bool = False) -> tuple[list, list]:  # fmt: skip
        """Horovod's split of :meth:`gradient`: ``([(local source, its gradient)...],
        [(other source, averaged gradient)...])``, each in the order of ``sources``."""
        sources = list(sources)
        grads = self.gradient(target, sources, output_gradients)
        pairs = list(zip(sources, grads, strict=True))
        return ([p for p in pairs if id(p[0]) in self._local],
                [p for p in pairs if id(p[0]) not in self._local])  # fmt: skip

    def _reduce(self, grads: list[Any], sources: list[Any]) -> list[Any]:
        (compression, sparse_as_dense, op, predivide, num_groups, groups, process_set,
         scale_local) = self._options  # fmt: skip
        n = len(state.resolve(process_set)[1])
        if n == 1:  # nothing to exchange: Horovod's tape skips its allreduces too (size_op() > 1)
            return list(grads)
        out = list(grads)
        shared = []
        for i, (g, v) in enumerate(zip(grads, sources, strict=True)):
            if g is None:
                continue
            if id(v) in self._local:
                out[i] = g * tf.cast(1.0 / n, g.dtype) if scale_local else g
                continue
            if sparse_as_dense and isinstance(g, tf.IndexedSlices):
                out[i] = g = tf.convert_to_tensor(g)
            shared.append(i)
        # Horovod's predivide: Sum of grads/f, then times f/n - an average, split in two
        true_op, pre, post = (ops.Sum, 1.0 / predivide, predivide / n) if predivide != 1.0 \
            else (op, 1.0, 1.0)  # fmt: skip
        sparse = [i for i in shared if isinstance(out[i], tf.IndexedSlices)]
        dense = [i for i in shared if not isinstance(out[i], tf.IndexedSlices)]
        for i in sparse:
            out[i] = collectives.allreduce(out[i], op=op, process_set=process_set)
        plan = _groups(len(dense), num_groups, groups, [sources[i] for i in dense])
        sent = [compression.compress(out[i]) for i in dense]
        tensors = [s for s, _ in sent]
        if plan is None:
            reduced = ops.allreduce_each(tensors, true_op, pre, post, process_set)
        else:
            reduced = [None] * len(tensors)
            for g in plan:
                got = ops._grouped_allreduce([tensors[j] for j in g], op=true_op,
                                             prescale_factor=pre, postscale_factor=post,
                                             process_set=process_set)  # fmt: skip
                for j, r in zip(g, got, strict=True):
                    reduced[j] = r
        for k, i in enumerate(dense):
            out[i] = compression.decompress(reduced[k], sent[k][1])
        return out


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",  # noqa: N802
                                   device_sparse: str = "", compression: Any = Compression.none,
                                   sparse_as_dense: bool = False, op: int = ops.Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: Any = None,
                                   process_set: ProcessSet = global_process_set,
                                   local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> DistributedGradientTape:  # fmt: skip
    """A :class:`DistributedGradientTape` whose ``local_layers``' variables keep this rank's
    own gradients."""
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)  # fmt: skip
    layers = (
        []
        if local_layers is None
        else (local_layers if isinstance(local_layers, list | tuple) else [local_layers])
    )
    for layer in layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
