"""The weight-sync check, without a framework: fingerprints and the verdict.

After the first synchronized epoch every rank must hold rank 0's weights; if not, gradients
were not averaged and each rank trained its own model (a wrong result that looks right).
An adapter gathers one fingerprint per rank (one small allgather) and calls
:func:`check_fingerprints`.

Example:
    >>> import numpy as np
    >>> fp = weight_fingerprint([np.ones((2, 2))])
    >>> check_fingerprints([fp, fp], fix="wrap the optimizer")   # in sync: no error
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hvdrunner.errors import RanksOutOfSyncError


def weight_fingerprint(weights: Sequence[np.ndarray]) -> np.ndarray:
    """Per-variable (sum, sum of squares, max |w|) in float64: cheap and order-sensitive."""
    rows = []
    for w in weights:
        a = np.asarray(w, dtype=np.float64)
        rows.append((a.sum(), np.square(a).sum(), np.abs(a).max() if a.size else 0.0))
    return np.asarray(rows, dtype=np.float64).reshape(-1)


def out_of_sync(fingerprints: Sequence[np.ndarray], rtol: float = 1e-6) -> list[int]:
    """The ranks whose fingerprint differs from rank 0's."""
    reference = fingerprints[0]
    return [
        r
        for r, fp in enumerate(fingerprints)
        if fp.shape != reference.shape or not np.allclose(fp, reference, rtol=rtol, atol=1e-9)
    ]


def check_fingerprints(fingerprints: Sequence[np.ndarray], fix: str, rtol: float = 1e-6) -> None:
    """Raise :class:`RanksOutOfSyncError` naming the ranks that differ and ``fix``."""
    bad = out_of_sync(fingerprints, rtol)
    if bad:
        raise RanksOutOfSyncError(
            f"ranks {bad} hold different weights than rank 0 after a synchronized epoch: "
            f"gradients were not averaged over ranks, so each rank trained its own model. {fix}"
        )
