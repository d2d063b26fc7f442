"""Mixture weights: the one check every place that takes them from outside runs.

A mixture is one weight per cluster (or domain): finite, >= 0. Where it must
already be shares (`tol` a number: an exported mixture, say) its sum must be 1
within `tol` and it comes back as given; where any positive sum will do (`tol=None`:
counts, percentages, a rounded CSV row) it comes back rescaled to sum to 1.
With `rows=True` every row of a matrix is one mixture, and errors name the rows
by `labels` (e.g. a CSV file's keys). Errors are `InputError`s that start with
`where` (a file, a flag, a stage) and say what to fix.

    from climb.io.mixture import check_weights
    w = check_weights([0.2, 0.8], k=2, where="runs/x/search/mixture.json")
    W = check_weights(counts, where="weights file w.csv", tol=None, rows=True, labels=keys)
"""
from __future__ import annotations

import numpy as np

from climb.io.files import InputError


def _at(bad: np.ndarray, rows: bool, labels) -> str:
    """Where the offending entries are: clusters of one mixture, or rows of many (by label)."""
    more = " ..." if len(bad) > 5 else ""
    if not rows:
        return f"at clusters {bad[:5].tolist()}{more}"
    names = ", ".join(str(labels[i] if labels is not None else i) for i in bad[:5])
    return f"in {len(bad)} row{'s' if len(bad) != 1 else ''}: {'keys' if labels is not None else 'rows'} {names}{more}"


def check_weights(weights, k: int | None = None, where: str = "weights", *, tol: float | None = 1e-6,
                  rows: bool = False, labels=None) -> np.ndarray:
    """`weights` as float64, checked (see the module doc); raises InputError naming `where`.

    k: the number of clusters each mixture must have (None: any).
    tol: how far from 1 a sum may be (then returned unchanged), or None: any positive sum, rescaled to 1.
    rows: a 2-d array, one mixture per row; `labels` name its rows in errors.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != (2 if rows else 1):
        raise InputError(f"{where}: weights of shape {w.shape}; give {'one row per mixture, ' if rows else ''}"
                         f"one weight per cluster")
    if k is not None and w.shape[-1] != k:
        raise InputError(f"{where}: {w.shape[-1]} weights for {k} clusters; give one weight per cluster")
    for what, mask in (("NaN or infinite", ~np.isfinite(w)), ("negative", w < 0)):
        bad = np.flatnonzero(mask.any(1) if rows else mask)
        if len(bad):
            raise InputError(f"{where}: weights must be finite and non-negative ({what} {_at(bad, rows, labels)})")
    s = w.sum(1) if rows else w.sum()
    zero = np.flatnonzero(np.atleast_1d(s) <= 0)
    if len(zero):
        raise InputError(f"{where}: all-zero weights{f' ({_at(zero, rows, labels)})' if rows else ''}; "
                         f"{'every' if rows else 'a'} mixture needs a positive weight")
    if tol is not None:
        bad = np.flatnonzero(np.abs(np.atleast_1d(s) - 1.0) > tol)
        if len(bad):
            at = f" ({_at(bad, rows, labels)})" if rows else ""
            raise InputError(f"{where}: weights sum to {np.atleast_1d(s)[bad[0]]:.6f}{at}, not 1; "
                             f"normalise them (w / w.sum())")
        return w
    return w / s[:, None] if rows else w / s
