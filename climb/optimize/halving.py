"""Successive halving on learning curves: which proxies of an iteration to train to the end.

Every proxy of an iteration trains to a rung (a fraction of its steps) and is
scored on the target there. The curve model says where a proxy scored v at the
rung ends: v + d, with d the mean of (final - rung value) over the proxies that
already ran to the end, and sd the spread of d among them. The best `keep`
fraction by rung value continue; so does any other whose final could still beat
the best one's by the curve model (its rung value within z * sqrt(2) * sd of the
best's), up to as many again. The rest stop, and enter the predictor at their
predicted final value.

    from climb.optimize.halving import continue_set, curve_shift
    shift = curve_shift([(2.9, 2.5), (3.1, 2.6)])       # (mean d, sd d, n)
    keep = continue_set({"a": 2.8, "b": 3.4}, "minimize", 0.5, shift)
"""
from __future__ import annotations

import math

import numpy as np

from climb.optimize.predictor import goal_sign

Z95 = 1.96


def curve_shift(pairs) -> tuple[float, float | None, int]:
    """(mean, sd, n) of final - rung value over (rung value, final value) pairs; sd is None
    below two pairs, the mean 0.0 with none."""
    d = np.array([f - v for v, f in pairs], float)
    if not len(d):
        return 0.0, None, 0
    return float(d.mean()), (float(d.std(ddof=1)) if len(d) > 1 else None), len(d)


def continue_set(values: dict, goal: str, keep: float, shift: tuple | None = None, z: float = Z95) -> list:
    """The ids (of `values`: id -> rung value) to train to the end, best first.

    The best ceil(keep * n), at least one; then, where the curve model has a spread, any
    other whose rung value is within z * sqrt(2) * sd of the best one's (its final could
    still be the better of the two), at most as many again.
    """
    if not 0 < keep <= 1:
        raise ValueError(f"keep must be in (0, 1], not {keep}")
    s = goal_sign(goal)
    order = sorted(values, key=lambda k: (s * values[k], str(k)))
    k = max(1, math.ceil(keep * len(order)))
    out = order[:k]
    sd = shift[1] if shift is not None else None
    if sd is not None and out:
        band = z * math.sqrt(2.0) * sd
        best = s * values[out[0]]
        out += [j for j in order[k:] if s * values[j] - best < band][:k]
    return out


def predicted_final(value: float, shift: tuple) -> tuple[float, float | None]:
    """The curve model's final value for a proxy that scored `value` at the rung, and its sd."""
    return value + shift[0], shift[1]
