"""Expert features: a mixture's loss read from one small model per cluster.

With one expert per cluster (a proxy trained on that cluster alone) and each
expert's log-probability of every target token kept, a mixture w is scored
without training by the bits per byte of the experts' ensemble, its token
probabilities mixed by w:

    ensemble_bpb(w) = -sum_t log2(sum_i w_i p_i(t)) / bytes

(Mixture of Data Experts, arXiv 2502.15950); the same for a task's gold
continuations, whose loss per byte is a mean over items of each one's tokens
(`ensemble_loss` with a weight per token). It is not the loss of a model
trained on w, but it ranks mixtures by how much of what the target needs each
one holds, which is what a predictor fitted on a few proxies lacks. `ExpertPrior`
makes it a predictor: a line in the ensemble bpb (a slope >= 0) fitted on the
proxies measured, and the base predictor (the default GP blend) on what the
line leaves.

    from climb.optimize.experts import ExpertFeature, ExpertPrior
    feature = ExpertFeature(logp, coef)          # logp: tokens x experts, natural log
    model = ExpertPrior(make_predictor("default"), feature).fit(X, y)
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)

CHUNK = 4096  # mixtures scored at once: a tokens x CHUNK block of probabilities


def ensemble_loss(logp: np.ndarray, coef: np.ndarray, W: np.ndarray) -> np.ndarray:
    """-sum_t coef[t] * log(sum_i w_i p_i(t)) for each mixture (row) w of W: the loss of the
    experts' ensemble, the experts' token probabilities mixed by w.

    logp: (tokens, experts) natural-log probabilities of the target's tokens; coef: each
    token's weight in the loss (1 / (ln 2 * bytes) for bits per byte). Computed stably:
    per token, the experts' log-probabilities less their maximum are exponentiated, mixed,
    and the maximum added back.
    """
    logp, W = np.asarray(logp, np.float64), np.atleast_2d(np.asarray(W, np.float64))
    coef = np.asarray(coef, np.float64)
    if logp.ndim != 2 or W.shape[1] != logp.shape[1]:
        raise ValueError(f"{W.shape[1]} weights per mixture for {logp.shape[-1]} experts")
    if coef.shape != (len(logp),):
        raise ValueError(f"{coef.shape} token weights for {len(logp)} tokens")
    top = logp.max(1)
    P = np.exp(logp - top[:, None])  # (tokens, experts), each row's largest entry 1
    out = np.empty(len(W))
    for a in range(0, len(W), CHUNK):
        mixed = P @ W[a:a + CHUNK].T  # (tokens, chunk)
        with np.errstate(divide="ignore"):
            out[a:a + CHUNK] = -(coef @ np.log(mixed) + coef @ top)
    return out


def ensemble_bpb(logp: np.ndarray, n_bytes: float, W: np.ndarray) -> np.ndarray:
    """Bits per byte of the experts' ensemble on text of `n_bytes` UTF-8 bytes (`ensemble_loss`)."""
    return ensemble_loss(logp, np.full(len(logp), 1.0 / (np.log(2) * n_bytes)), W)


class ExpertFeature:
    """`ensemble_loss` of the experts, as a function of mixtures. With `max_tokens`, on a fixed
    random sample of that many target tokens (the same for every mixture, their weights scaled
    up to stand for all), so that scoring a pool of 100k candidates stays cheap."""

    def __init__(self, logp: np.ndarray, coef: np.ndarray, max_tokens: int = 0, seed: int = 0):
        logp, coef = np.asarray(logp, np.float32), np.asarray(coef, np.float64)
        if max_tokens and len(logp) > max_tokens:
            pick = np.sort(np.random.default_rng(seed).choice(len(logp), max_tokens, replace=False))
            logp, coef = logp[pick], coef[pick] * len(logp) / max_tokens
        self.logp, self.coef = logp, coef

    def __call__(self, W: np.ndarray) -> np.ndarray:
        return ensemble_loss(self.logp, self.coef, W)


class ExpertPrior:
    """y ~ a + b * feature(w) + base(w): the line by least squares with b >= 0 (b < 0 would say
    that mixtures the experts rate worse measure better; the line is then flat), the base
    predictor on the residuals. `gp` exposes the base's GP, if it has one, for the
    acquisitions' uncertainty (climb.optimize.acquisition.spread_model)."""

    def __init__(self, base, feature, name: str | None = None):
        self.base, self.feature = base, feature
        self.name = name or f"experts+{getattr(base, 'name', 'base')}"

    def fit(self, X, y):
        X, y = np.asarray(X, float), np.asarray(y, float)
        f = self.feature(X)
        self.slope = 0.0
        if len(y) >= 2 and np.ptp(f) > 0:
            self.slope = max(0.0, float(np.polyfit(f, y, 1)[0]))
        self.intercept = float(np.mean(y - self.slope * f))
        self.residual = y - self.intercept - self.slope * f
        self.base.fit(X, self.residual)
        log.info("feature prior: measured = %.4f + %.4f x feature (+ %s on the residual)", self.intercept,
                 self.slope, getattr(self.base, "name", "base"))
        return self

    def line(self, X) -> np.ndarray:
        return self.intercept + self.slope * self.feature(np.asarray(X, float))

    def predict(self, X):
        return self.line(X) + np.asarray(self.base.predict(X), float)
