"""Bounds a team sets on a mixture, and mixtures kept inside them by construction.

A `Bounds` holds every rule a mixture w (one weight per cluster, summing to 1) must obey:

- linear rows `lo <= A @ w <= hi`, one per entry of `search.bounds`: a cluster's row is its
  indicator, a source's row that source's share of each cluster's tokens (a column of the
  per-cluster source-share matrix), so the row gives the source's share of the mixture;
- the per-cluster caps `max_weight` (`search.epoch_cap` at the export's budget; 0 for a
  cluster too small for a proxy);
- `min_weight`: a weight is 0 or at least that (`search.min_weight`);
- `kl_max` > 0: KL(w || natural) at most that many nats (`search.kl_max`).

`infeasible` says whether any mixture obeys them all, and if none does, names the bounds that
clash in one line (a linear or mixed-integer programme, scipy.optimize.milp; the least KL
under the linear rules). `project` moves each row of a matrix of mixtures to the nearest point
(Euclidean) that obeys them: semismooth Newton on the multipliers of the sum and the linear rows
(a few of them, so a small system per row, all rows at once), the KL multiplier by bisection;
rows Newton does not settle go to Dykstra's alternating projections onto the capped simplex, the
linear rows' slabs and the KL ball; then `min_weight` by zeroing the small weights and
projecting again on the remaining support. Rows it cannot bring inside come back outside;
`satisfied` tells them apart, and callers drop them.

    from climb.optimize.bounds import from_config, infeasible, project, satisfied
    b = from_config({"cluster:0": [0.1, 0.3]}, {"natural": q, "max_weight": caps}, min_weight=0.02)
    assert infeasible(b) is None
    W = project(W, b)
    W = W[satisfied(W, b)]
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import Bounds as Box
from scipy.optimize import LinearConstraint, milp, minimize
from scipy.special import wrightomega

from climb.config.checks import parse_bound
from climb.io.errors import InputError

TOL = 1e-6  # how far outside a bound a mixture may lie and still hold it (`satisfied`)
_CONVERGED = 1e-10  # Dykstra stops once every rule holds this closely and a cycle moves no weight more


@dataclass(frozen=True, eq=False)
class Bounds:
    """The rules a mixture obeys (see the module's docstring); `names[j]` is row j's bound, e.g.
    "source:code", and `caps_note` says where the caps come from, for messages."""
    A: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    names: tuple[str, ...]
    max_weight: np.ndarray
    min_weight: float = 0.0
    kl_max: float = 0.0
    natural: np.ndarray | None = None
    caps_note: str = "the per-cluster caps"

    @property
    def k(self) -> int:
        return len(self.max_weight)

    def describe(self, j: int) -> str:
        """Row j as a person reads it: "source:code pinned at 0.1", "cluster:3 in [0.05, 0.3]"."""
        lo, hi, name = float(self.lo[j]), float(self.hi[j]), self.names[j]
        if lo == hi:
            return f"{name} pinned at {lo:g}"
        if lo <= 0:
            return f"{name} at most {hi:g}"
        if hi >= 1:
            return f"{name} at least {lo:g}"
        return f"{name} in [{lo:g}, {hi:g}]"


def from_config(bounds: dict, space: dict, min_weight: float = 0.0, kl_max: float = 0.0,
                caps_note: str = "the per-cluster caps") -> Bounds:
    """The `Bounds` of `search.bounds` (already checked for form: climb.config.checks.parse_bound)
    over a search's mixture space: `space["max_weight"]` (caps), `space["natural"]` and, for source
    bounds, `space["sources"] = {"names": [...], "share": k x S}` (each cluster's tokens by source).
    A bound the space cannot hold (a cluster it does not have, a source it does not know, or
    sources where it has none) raises InputError."""
    caps = np.asarray(space["max_weight"], float)
    k = len(caps)
    rows, lo, hi, names = [], [], [], []
    sources = space.get("sources")
    for key, value in bounds.items():
        kind, name, a, b = parse_bound(key, value)
        if kind == "cluster":
            i = int(name)
            if i >= k:
                raise InputError(f"search.bounds: {key} names cluster {i}, but the run has {k} clusters "
                                 f"(cluster:0 .. cluster:{k - 1})")
            row = np.eye(k)[i]
        else:
            if not sources:
                raise InputError(f"search.bounds: {key} bounds a corpus source, but this run's corpus has no "
                                 "sources; name them in the corpus config or bound clusters instead")
            known = list(sources["names"])
            if name not in known:
                raise InputError(f"search.bounds: {key}: the corpus has no source {name!r}; its sources are "
                                 f"{', '.join(known)}")
            row = np.asarray(sources["share"], float)[:, known.index(name)]
        live = row[caps > 0]
        if len(live) and np.ptp(live) <= 1e-12 and a - TOL <= live[0] <= b + TOL:
            continue  # the same share in every cluster (one source alone): every mixture holds it
        rows.append(row)
        lo.append(a)
        hi.append(b)
        names.append(f"{kind}:{name}")
    return Bounds(A=np.array(rows, float).reshape(len(rows), k), lo=np.array(lo, float), hi=np.array(hi, float),
                  names=tuple(names), max_weight=caps, min_weight=float(min_weight), kl_max=float(kl_max),
                  natural=np.asarray(space["natural"], float), caps_note=caps_note)


# ----------------------------------------------------------------- holding
def kl_rows(W, natural) -> np.ndarray:
    """KL(w || natural) per row, in nats (0 log 0 = 0; weight where natural is 0: inf)."""
    W, q = np.clip(np.atleast_2d(np.asarray(W, float)), 0.0, None), np.asarray(natural, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(W > 0, W * (np.log(W) - np.log(q)), 0.0)
    return t.sum(1)


def satisfied(W, b: Bounds, tol: float = TOL, caps: bool = True) -> np.ndarray:
    """Per row of W: whether it is a mixture that holds every bound within `tol`. `caps=False`
    judges only the team's bounds (search.bounds, kl_max), not the caps and min_weight."""
    W = np.atleast_2d(np.asarray(W, float))
    ok = (np.abs(W.sum(1) - 1) <= tol) & (W >= -tol).all(1)
    if caps:
        ok &= (W <= b.max_weight + tol).all(1)
        if b.min_weight:
            ok &= ((W <= tol) | (W >= b.min_weight - tol)).all(1)
    if len(b.names):
        S = W @ b.A.T
        ok &= ((S >= b.lo - tol) & (S <= b.hi + tol)).all(1)
    if b.kl_max:
        ok &= kl_rows(W, b.natural) <= b.kl_max + tol
    return ok


def broken(w, b: Bounds, tol: float = TOL, caps: bool = True) -> list[str]:
    """The bounds mixture w breaks, each as a person reads it with w's value ([] when it holds them)."""
    w = np.asarray(w, float)
    out = []
    for j in range(len(b.names)):
        v = float(b.A[j] @ w)
        if v < b.lo[j] - tol or v > b.hi[j] + tol:
            out.append(f"{b.describe(j)} (this mixture gives it {v:.4g})")
    if b.kl_max and (d := float(kl_rows(w, b.natural)[0])) > b.kl_max + tol:
        out.append(f"search.kl_max = {b.kl_max:g} (this mixture is {d:.4g} nats from the natural one)")
    if caps:
        over = np.flatnonzero(w > b.max_weight + tol)
        if len(over):
            out.append(f"{b.caps_note} on clusters {over.tolist()}")
        low = np.flatnonzero((w > tol) & (w < b.min_weight - tol))
        if len(low):
            out.append(f"search.min_weight = {b.min_weight:g} on clusters {low.tolist()}")
    return out


# ----------------------------------------------------------------- projecting
def _capped_simplex(V: np.ndarray, L: np.ndarray, U: np.ndarray) -> np.ndarray:
    """Each row of V projected onto {sum(w) = 1, L <= w <= U}: w = clip(v - tau, L, U), the shift tau
    found exactly among the sorted breakpoints where a weight leaves U or reaches L."""
    n, k = V.shape
    bp = np.concatenate([V - U, V - L], 1)
    step = np.concatenate([-np.ones((n, k)), np.ones((n, k))], 1)
    order = np.argsort(bp, 1, kind="stable")
    bp, step = np.take_along_axis(bp, order, 1), np.take_along_axis(step, order, 1)
    slope = np.cumsum(step, 1)  # d sum / d tau just after each breakpoint
    total = U.sum(1, keepdims=True) + np.concatenate(
        [np.zeros((n, 1)), np.cumsum(slope[:, :-1] * np.diff(bp, axis=1), 1)], 1)  # the sum at each breakpoint
    j = np.clip((total >= 1).sum(1) - 1, 0, 2 * k - 1)  # the last breakpoint whose sum is still >= 1
    rows = np.arange(n)
    s, t0, g0 = slope[rows, j], bp[rows, j], total[rows, j]
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = np.where(s < 0, t0 + (g0 - 1) / np.where(s < 0, -s, 1), t0)
    return np.clip(V - tau[:, None], L, U)


def _slab(Y: np.ndarray, a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Rows of Y projected onto {sum(w) = 1, lo <= a @ w <= hi}: onto the plane, then along a's part
    across the plane (a - mean(a), on which the plane's normal has no part). Moving only across the
    plane keeps a row near the capped simplex: a source's row, nearly parallel to the plane's normal,
    takes alternating projections thousands of cycles otherwise."""
    Y = Y + ((1 - Y.sum(1)) / Y.shape[1])[:, None]
    c = a - a.mean()
    norm = float(c @ c)
    if norm == 0:
        return Y
    s = Y @ a
    shift = np.where(s > hi, s - hi, np.where(s < lo, s - lo, 0.0))
    return Y - shift[:, None] * c / norm


def _kl_ball(Y: np.ndarray, q: np.ndarray, r: float) -> np.ndarray:
    """Rows of Y projected onto {w >= 0, w = 0 where q = 0, sum w log(w / q) <= r}: w = lam * omega(y /
    lam - 1 + log(q / lam)) (omega: the Wright omega function), lam > 0 found by bisection."""
    out = Y.copy()
    pos = q > 0
    inside = (Y >= 0).all(1) & (Y[:, ~pos] == 0).all(1) & (kl_rows(Y, q) <= r)
    todo = np.flatnonzero(~inside)
    if not len(todo):
        return out
    y, lq = Y[todo][:, pos], np.log(q[pos])

    def at(log_lam: np.ndarray) -> np.ndarray:
        lam = np.exp(log_lam)[:, None]
        return lam * np.real(wrightomega(y / lam - 1 + lq - np.log(lam)))
    a, c = np.full(len(todo), np.log(1e-12)), np.full(len(todo), np.log(1e4))
    for _ in range(50):  # the KL falls as lam grows
        mid = 0.5 * (a + c)
        w = at(mid)
        over = (w * (np.log(np.maximum(w, 1e-300)) - lq)).sum(1) > r
        a, c = np.where(over, mid, a), np.where(over, c, mid)
    res = np.zeros((len(todo), Y.shape[1]))
    res[:, pos] = at(c)
    out[todo] = res
    return out


def _violation(X: np.ndarray, b: Bounds, L: np.ndarray, U: np.ndarray) -> np.ndarray:
    """Per row: how far X lies outside the convex rules (box, sum, rows, KL)."""
    v = np.maximum(np.abs(X.sum(1) - 1), np.maximum(L - X, X - U).max(1))
    if len(b.names):
        S = X @ b.A.T
        v = np.maximum(v, np.maximum(b.lo - S, S - b.hi).max(1))
    if b.kl_max:
        v = np.maximum(v, kl_rows(X, b.natural) - b.kl_max)
    return v


def _response(Z: np.ndarray, lam: np.ndarray, b: Bounds, L: np.ndarray, U: np.ndarray):
    """The weights the multipliers give, w = clip(r(z), L, U), and dw/dz on the free weights: r(z) = z,
    or with a KL multiplier lam > 0, the root of w - z + lam (log(w / q) + 1) = 0 (Wright omega)."""
    R, slope = Z.copy(), np.ones_like(Z)
    kl = lam > 0
    if kl.any():
        lq = np.log(np.where(b.natural > 0, b.natural, 1.0))
        lm = lam[kl][:, None]
        om = np.real(wrightomega(Z[kl] / lm - 1 + lq - np.log(lm)))
        R[kl] = np.where(b.natural > 0, lm * om, 0.0)
        slope[kl] = om / (1 + om)
    free = (R > L) & (R < U)
    return np.clip(R, L, U), np.where(free, slope, 0.0)


def _residual(V, Y, M, lam, b: Bounds, L, U):
    """The weights the multipliers Y give, their slopes, each linear row's value plus its multiplier,
    and the conditions' natural residuals (the sum's, then each row's)."""
    w, d = _response(V - Y @ M, lam, b, L, U)
    s = w @ b.A.T
    p = s + Y[:, 1:]
    return w, d, p, np.concatenate([(w.sum(1) - 1)[:, None], s - np.clip(p, b.lo, b.hi)], 1)


def _newton(V: np.ndarray, b: Bounds, L: np.ndarray, U: np.ndarray, lam: np.ndarray, Y: np.ndarray,
            iters: int = 40) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """argmin ||w - v||^2 / 2 + lam KL(w || natural) over the capped simplex and the linear rows, per
    row, by semismooth Newton on the multipliers Y (the sum's, then each row's), the rows' conditions
    as natural residuals (a @ w = clip(a @ w + nu, lo, hi)), each step halved until the residual
    shrinks. Returns the weights, the multipliers and which rows converged (the caller projects the
    others another way)."""
    n, k = V.shape
    M = np.vstack([np.ones(k), b.A])
    eye = np.eye(len(M))
    X, Y, done = np.clip(V, L, U), Y.copy(), np.zeros(n, bool)
    rows = np.arange(n)
    w, d, p, res = _residual(V, Y, M, lam, b, L, U)
    for _ in range(iters):
        ok = np.abs(res).max(1) <= 1e-12
        X[rows], done[rows[ok]] = w, True
        keep = ~ok
        rows, d, p, res = rows[keep], d[keep], p[keep], res[keep]
        if not len(rows):
            break
        # The slopes are floored a little, so a step stays finite where no weight is free to move.
        J = -np.einsum("ni,ri,ci->nrc", d + 1e-9, M, M)
        off = np.concatenate([np.zeros((len(rows), 1), bool), (p > b.lo) & (p < b.hi)], 1)  # a row not at an end
        J = np.where(off[:, :, None], -eye[None], J)
        step = np.linalg.solve(J - 1e-10 * eye, -res[:, :, None])[:, :, 0]  # rows may repeat: a source all of every cluster
        v_, lam_, L_, U_, y0 = V[rows], lam[rows], L[rows], U[rows], Y[rows]
        norm0, t = np.abs(res).max(1), np.ones(len(rows))
        for _ in range(12):
            y = y0 + t[:, None] * step
            w, d, p, res = _residual(v_, y, M, lam_, b, L_, U_)
            worse = np.abs(res).max(1) >= norm0
            if not worse.any():
                break
            t = np.where(worse, t / 2, t)
        Y[rows] = y
        go_on = ~worse  # a row no step helps is left to the caller
        rows, w, d, p, res = rows[go_on], w[go_on], d[go_on], p[go_on], res[go_on]
    else:  # the last step's rows, unchecked by the loop
        ok = np.abs(res).max(1) <= 1e-12
        X[rows], done[rows[ok]] = w, True
    return X, Y, done


def _convex(V: np.ndarray, b: Bounds, L: np.ndarray, U: np.ndarray) -> np.ndarray:
    """Each row of V projected onto the convex rules with per-row boxes L <= w <= U. Semismooth Newton
    (`_newton`) on the sum's and the rows' multipliers; with kl_max, where that projection lies too far
    from the natural mixture, the KL multiplier found by bisection (the KL falls as it grows). Rows
    Newton does not settle go to Dykstra's alternating projections, slower but sure."""
    n = len(V)
    Y0 = np.zeros((n, 1 + len(b.names)))
    X, Y, done = _newton(V, b, L, U, np.zeros(n), Y0)
    if b.kl_max:
        far = np.flatnonzero(done & (kl_rows(X, b.natural) > b.kl_max))
        if len(far):
            X[far], done[far] = _kl_multiplier(V[far], b, L[far], U[far], Y[far])
    if not done.all():
        X[~done] = _dykstra(V[~done], b, L[~done], U[~done])
    return X


def _kl_multiplier(V, b: Bounds, L, U, Y) -> tuple[np.ndarray, np.ndarray]:
    """The projection of rows whose nearest point under the linear rules lies beyond kl_max: the
    least KL multiplier that brings them within it, by bisection on its log. Each Newton solve starts
    from the linear rules' multipliers `Y` (those of a far larger KL multiplier can stall it)."""
    a, c = np.full(len(V), np.log(1e-10)), np.full(len(V), np.log(1e6))
    X, _, done = _newton(V, b, L, U, np.exp(c), Y)
    for _ in range(30):
        mid = 0.5 * (a + c)
        Xm, _, ok = _newton(V, b, L, U, np.exp(mid), Y)
        over = kl_rows(Xm, b.natural) > b.kl_max
        a = np.where(over & ok, mid, a)
        inside = ~over & ok
        c = np.where(inside, mid, c)
        X[inside] = Xm[inside]
    return X, done & (kl_rows(X, b.natural) <= b.kl_max + 1e-9)


def _dykstra(V: np.ndarray, b: Bounds, L: np.ndarray, U: np.ndarray, max_cycles: int = 1500) -> np.ndarray:
    """Each row of V projected onto the convex rules by Dykstra's algorithm over the capped simplex,
    each row's slab and the KL ball (the capped simplex last, so every row comes back a mixture
    within its box)."""
    sets = [lambda Y, i=j: _slab(Y, b.A[i], b.lo[i], b.hi[i]) for j in range(len(b.names))]
    if b.kl_max:
        sets.append(lambda Y: _kl_ball(Y, b.natural, b.kl_max))
    X = _capped_simplex(V, L, U)
    if not sets:
        return X
    active = np.flatnonzero(_violation(X, b, L, U) > _CONVERGED)
    incr = [np.zeros_like(V) for _ in range(len(sets))] + [V - X]  # the capped simplex came first
    for cycle in range(max_cycles):
        if not len(active):
            break
        x, lo_, up_ = X[active], L[active], U[active]
        before = x.copy()
        for i, proj in enumerate(sets):
            y = x + incr[i][active]
            x = proj(y)
            incr[i][active] = y - x
        y = x + incr[-1][active]
        x = _capped_simplex(y, lo_, up_)
        incr[-1][active] = y - x
        X[active] = x
        if cycle % 10 == 9:
            moved, off = np.abs(x - before).max(1), _violation(x, b, lo_, up_)
            hopeless = off > (1e-3 if cycle < 500 else 1e-5) if cycle >= 100 else np.zeros(len(x), bool)
            active = active[((off > _CONVERGED) | (moved > _CONVERGED)) & ~hopeless]  # no mixture near: give up
    return X


def project(W, b: Bounds) -> np.ndarray:
    """Each row of W (mixtures) moved to the nearest mixture that holds every bound; rows that
    hold them already are returned unchanged. With min_weight: the clusters the convex projection
    gives at least half of it keep a weight of at least min_weight, the others 0 (and where that
    support fails, every cluster it gives any weight). A row no mixture near it holds comes back
    outside: check with `satisfied`."""
    W = np.atleast_2d(np.asarray(W, float))
    out = W.copy()
    todo = np.flatnonzero(~satisfied(W, b, tol=1e-9))
    if not len(todo):
        return out
    V = W[todo]
    U = np.broadcast_to(b.max_weight, V.shape).copy()
    X = _convex(V, b, np.zeros_like(V), U)
    if b.min_weight > 0:
        allowed = b.max_weight >= b.min_weight
        first = _on_support(V, b, U, (X >= b.min_weight / 2) & allowed)
        bad = ~satisfied(first, b)
        if bad.any():
            first[bad] = _on_support(V[bad], b, U[bad], (X[bad] > 1e-12) & allowed)
        X = first
    stuck = ~satisfied(X, b)
    if stuck.any():  # what the solvers left outside (a tight KL ball against a cap): pulled inside
        X[stuck] = _toward_inside(X[stuck], b)
    out[todo] = X
    return out


def _toward_inside(Y: np.ndarray, b: Bounds, steps: int = 48) -> np.ndarray:
    """Rows of Y moved along the segment to a mixture c that holds every rule, as far from c as they
    still hold (bisection keeps the last point that holds, so each row comes inside even where the
    rules with min_weight are not convex): where the alternating projections stall (a tight KL ball
    against a cap), rows still come inside near where they stopped. Rows stay as they are where no
    such c is found."""
    groups = list(range(len(b.lo))) + [_CAPS]
    least = least_kl(b, groups) if b.kl_max > 0 else None
    found = [c for c in (least[1] if least else None, _solve(b, groups + [_MIN]), _solve(b, groups))
             if c is not None and satisfied(np.asarray(c, float)[None], b)[0]]
    if not found:
        return Y
    c = np.asarray(found[0], float)
    lo, hi = np.zeros(len(Y)), np.ones(len(Y))
    for _ in range(steps):  # bisection on t: c + t (y - c) holds the rules at t = lo, not at t = hi
        mid = (lo + hi) / 2
        ok = satisfied(c + mid[:, None] * (Y - c), b)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return c + lo[:, None] * (Y - c)


def _on_support(V: np.ndarray, b: Bounds, U: np.ndarray, support: np.ndarray) -> np.ndarray:
    """Rows of V projected onto the convex rules with weights of at least min_weight on `support` and 0 off it."""
    return _convex(V, b, np.where(support, b.min_weight, 0.0), np.where(support, U, 0.0))


# ----------------------------------------------------------------- feasibility
_CAPS, _MIN, _KL = "caps", "min_weight", "kl_max"


def _solve(b: Bounds, groups: list, objective=None) -> np.ndarray | None:
    """A mixture meeting the rules in `groups` (row indices, _CAPS, _MIN) and minimising
    objective @ w (None: any), or None where none does. Clusters of cap 0 always stay 0."""
    k = b.k
    up = np.where(b.max_weight > 0, b.max_weight if _CAPS in groups else 1.0, 0.0)
    rows = [j for j in groups if isinstance(j, int)]
    mixed = _MIN in groups and b.min_weight > 0
    n = 2 * k if mixed else k
    cons = [LinearConstraint(np.concatenate([np.ones(k), np.zeros(n - k)])[None], 1, 1)]
    if rows:
        cons.append(LinearConstraint(np.hstack([b.A[rows], np.zeros((len(rows), n - k))]), b.lo[rows], b.hi[rows]))
    if mixed:  # z_i = 1: min_weight <= w_i <= cap_i; z_i = 0: w_i = 0
        eye = np.eye(k)
        cons += [LinearConstraint(np.hstack([eye, -b.min_weight * eye]), 0, np.inf),
                 LinearConstraint(np.hstack([eye, -np.diag(up)]), -np.inf, 0)]
    c = np.zeros(n)
    if objective is not None:
        c[:k] = objective
    res = milp(c, constraints=cons, integrality=np.r_[np.zeros(k), np.ones(n - k)],
               bounds=Box(np.zeros(n), np.r_[up, np.ones(n - k)]))
    return res.x[:k] if res.success else None


def least_kl(b: Bounds, groups: list) -> tuple[float, np.ndarray] | None:
    """The least KL(w || natural) over mixtures meeting the linear rules in `groups` and the caps
    (min_weight relaxed), and the mixture; None where no mixture meets them."""
    start = _solve(b, [g for g in groups if g != _MIN])
    if start is None:
        return None
    q, k = b.natural, b.k
    up = np.where((b.max_weight > 0) & (q > 0), b.max_weight if _CAPS in groups else 1.0, 0.0)
    rows = [j for j in groups if isinstance(j, int)]
    # The projection of the natural mixture with a large KL multiplier: its KL is within 1e-6 of the least.
    sub = replace(b, A=b.A[rows], lo=b.lo[rows], hi=b.hi[rows], names=tuple(b.names[j] for j in rows))
    x, _, ok = _newton(q[None], sub, np.zeros((1, k)), up[None], np.array([1e6]), np.zeros((1, 1 + len(rows))))
    if ok[0]:
        return float(kl_rows(x, q)[0]), x[0]
    cons = [{"type": "eq", "fun": lambda w: w.sum() - 1, "jac": lambda w: np.ones(k)}]
    if rows:
        A, lo, hi = b.A[rows], b.lo[rows], b.hi[rows]
        cons += [{"type": "ineq", "fun": lambda w: A @ w - lo, "jac": lambda w: A},
                 {"type": "ineq", "fun": lambda w: hi - A @ w, "jac": lambda w: -A}]
    lq = np.log(np.where(q > 0, q, 1.0))

    def f(w):
        w = np.maximum(w, 1e-300)
        return float(np.where(up > 0, w * (np.log(w) - lq), 0.0).sum())

    def grad(w):
        return np.where(up > 0, np.log(np.maximum(w, 1e-12)) - lq + 1, 0.0)
    x0 = np.clip(0.5 * start + 0.5 * np.clip(q, 0, up) / max(np.clip(q, 0, up).sum(), 1e-300), 0, up)
    res = minimize(f, x0, jac=grad, bounds=list(zip(np.zeros(k), up)), constraints=cons, method="SLSQP",
                   options={"maxiter": 500, "ftol": 1e-12})
    w = np.clip(res.x, 0, up)
    w = w / w.sum()
    best = (float(kl_rows(w, q)[0]), w)
    return best if float(kl_rows(start, q)[0]) >= best[0] else (float(kl_rows(start, q)[0]), start)


def _feasible(b: Bounds, groups: list) -> bool:
    if _solve(b, groups) is None:
        return False
    if _KL in groups:
        got = least_kl(b, groups)
        return got is not None and got[0] <= b.kl_max + 1e-9
    return True


def infeasible(b: Bounds) -> str | None:
    """None where some mixture holds every bound; else one line naming the bounds that clash: a
    smallest set of them no mixture meets together (each left out in turn, and kept only if the
    rest are then met), the first of the team's bounds said against what the others let it reach."""
    groups: list = [_CAPS] + ([_MIN] if b.min_weight > 0 else []) + list(range(len(b.names))) \
        + ([_KL] if b.kl_max else [])
    if _feasible(b, groups):
        if b.kl_max and b.min_weight:  # the least KL relaxes min_weight: a mixture that holds all must be found
            starts = np.vstack([least_kl(b, groups)[1], _solve(b, groups), b.natural])
            if not satisfied(project(starts, b), b).any():
                return (f"search.kl_max = {b.kl_max:g} with search.min_weight = {b.min_weight:g}: no mixture was "
                        f"found within {b.kl_max:g} nats of the natural one whose every weight is 0 or at least "
                        f"{b.min_weight:g}" + (f" and that holds {_list([b.describe(j) for j in range(len(b.names))])}"
                                              if len(b.names) else "") + "; raise search.kl_max or lower search.min_weight")
        return None
    core = list(groups)
    for g in groups:
        rest = [x for x in core if x != g]
        if not _feasible(b, rest):
            core = rest
    return _clash(b, core)


def _what(b: Bounds, g) -> str:
    if g == _CAPS:
        return b.caps_note
    if g == _MIN:
        return f"search.min_weight = {b.min_weight:g} (a weight is 0 or at least that)"
    if g == _KL:
        return f"search.kl_max = {b.kl_max:g}"
    return b.describe(g)


def _list(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _clash(b: Bounds, core: list) -> str:
    """One line for a set of rules no mixture meets together."""
    rows = [g for g in core if isinstance(g, int)]
    others = [g for g in core if g != (rows[0] if rows else None)]
    if _KL in core:
        got = least_kl(b, [g for g in core if g != _KL])
        with_ = f" under {_list([_what(b, g) for g in core if g != _KL])}" if len(core) > 1 else ""
        near = f"{got[0]:.3g} nats" if got else "farther"
        return (f"search.kl_max = {b.kl_max:g} cannot be met: the mixture nearest the natural one{with_} is "
                f"{near} from it; raise search.kl_max or loosen those bounds")
    if not rows:
        return f"{_list([_what(b, g) for g in core])} leave no mixture; loosen one of them"
    j = rows[0]
    lo_end, hi_end = _solve(b, others, b.A[j]), _solve(b, others, -b.A[j])
    reach_lo, reach_hi = float(b.A[j] @ lo_end), float(b.A[j] @ hi_end)
    if reach_hi < b.lo[j]:
        reach = f"at most {reach_hi:.3g}"
    elif reach_lo > b.hi[j]:
        reach = f"at least {reach_lo:.3g}"
    else:
        reach = f"only [{reach_lo:.3g}, {reach_hi:.3g}]"
    by = _list([_what(b, g) for g in others]) if others else "the weights summing to 1"
    return (f"search.bounds: {b.describe(j)}, but {by} {'let' if len(others) > 1 else 'lets'} it reach "
            f"{reach}; loosen one of them")
