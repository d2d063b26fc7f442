"""The Gaussian-process predictor: exact GP regression on mixture weights.

An ARD kernel (Matern-5/2, or RBF) on standardised log(w + eps), with a log-normal
prior on each lengthscale, hyperparameters by maximising the evidence (L-BFGS-B
on the analytic gradient). It is the ``gp`` predictor and the smooth half of
``default`` (`climb.optimize.predictor`); its posterior gives `climb.optimize.acquisition` its spread.

    from climb.optimize.gp import GPPredictor
    gp = GPPredictor(seed=0).fit(X_train, y_train)
    y_hat = gp.predict(X_test)
"""
from __future__ import annotations

import numpy as np
from scipy.linalg import cho_solve, lapack
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

LOG_EPS = 1e-3  # log(w + eps); 1e-4 and 1e-2 did worse in `predictor_regmix.py --select`


def blas_one_thread():
    # n <= a few thousand: multithreaded BLAS on shared cores is slower than one thread.
    return threadpool_limits(limits=1, user_api="blas")


class GPPredictor:
    """Exact GP regression, ARD kernel on standardised log(w + eps), evidence-maximised.

    Written here, not with scikit-learn's GaussianProcessRegressor (which has analytic
    gradients of the evidence too), for two measured reasons (`benchmarks/gp_sklearn.py`
    on RegMix's 1M swarm, fit on n runs, rank the 256 test runs, five draws each;
    BENCHMARKS.md, "Why the GP is our own"):

    - the lengthscale prior: scikit-learn maximises the evidence alone and has no prior
      on a kernel's hyperparameters. Without the prior (ls_prior = 0) this GP ranks the
      test runs exactly as scikit-learn's does (the same Spearman to four digits at every
      size); with it, 0.913 against 0.870 at 16 runs and 0.960 against 0.931 at 32 (means
      over five draws, +0.043 [-0.052, +0.138] and +0.029 [-0.001, +0.059]: not resolved
      by themselves), level from 64 runs on. The predictor's selection measured the
      prior's worth with more draws: 0.9498 against 0.9422 on subsets of 16-112 runs, and
      0.72 against 0.49 on a swarm whose best domain is an argmax (BENCHMARKS.md,
      "Selection: cross-validation on the 512 training runs only");
    - speed: 0.04 s against 0.8 s a fit at 16 runs, 0.4 s against 13.6 s at 256; a search
      refits at every iteration, in every out-of-fold split, in the default's inner CV.

    The gradient itself is tested against finite differences (tests/test_predictor.py).
    """

    def __init__(self, kernel: str = "matern52", eps: float = LOG_EPS, ls_prior: float = 1.0, linear: bool = False,
                 restarts: int = 1, seed: int = 0, name: str = "gp", noise_floor: float = 0.0):
        self.kernel, self.eps, self.restarts, self.seed, self.name = kernel, eps, restarts, seed, name
        # noise_floor: the least noise sd (in y's units) a measurement is taken to carry, e.g. a
        # search's measured seed noise; 0 leaves the noise to the evidence alone, which with a few
        # dozen results in many dimensions can settle on none and interpolate every measurement.
        self.noise_floor = float(noise_floor)
        # ls_prior: precision of a log-normal prior on each lengthscale around sqrt(d); with 16-112
        # results and 17+ lengthscales, pure evidence maximisation overfits (see --select).
        self.ls_prior, self.linear = ls_prior, linear

    def _features(self, X):
        return np.log(np.asarray(X, float) + self.eps)

    def _k(self, A, B, ls, s2):
        A, B = A / ls, B / ls
        d2 = np.maximum((A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2 * A @ B.T, 0.0)
        if self.kernel == "rbf":
            K = s2 * np.exp(-0.5 * d2)
            return K, K
        r = np.sqrt(5 * d2)
        e = np.exp(-r)
        # G is dK/dlog(l_j) divided by (x_j - x'_j)^2 / l_j^2, which is the same for every j
        return s2 * (1 + r + r * r / 3) * e, s2 * (5 / 3) * (1 + r) * e

    def _gram(self, A, B, ls, s2, s_lin):
        K, G = self._k(A, B, ls, s2)
        KL = s_lin * (A @ B.T) / A.shape[1] if self.linear else 0.0  # optional linear trend in log weights
        return K, G, KL

    def _nll(self, th, F, y):
        n, d = F.shape
        ls, s2, sn, s_lin = np.exp(th[:d]), np.exp(th[d]), np.exp(th[d + 1]), np.exp(th[-1])
        K, G, KL = self._gram(F, F, ls, s2, s_lin)
        L, info = lapack.dpotrf(K + KL + (sn + 1e-8) * np.eye(n), lower=1)
        if info:
            return 1e10, np.zeros_like(th)
        a = cho_solve((L, True), y)
        Ki, _ = lapack.dpotri(L, lower=1)
        Ki = np.tril(Ki) + np.tril(Ki, -1).T
        nll = 0.5 * y @ a + np.log(np.diag(L)).sum() + 0.5 * n * np.log(2 * np.pi)
        M = 0.5 * (np.outer(a, a) - Ki)  # dNLL/dK = -M
        Fs, MG = F / ls, M * G
        # sum_ab MG_ab (x_aj - x_bj)^2 / l_j^2 for every dimension j at once
        gj = 2 * ((Fs * Fs).T @ MG.sum(1)) - 2 * ((MG @ Fs) * Fs).sum(0)
        grad = np.r_[-gj, -(M * K).sum(), -np.trace(M) * sn, -(M * KL).sum() if self.linear else []]
        z = th[:d] - np.log(np.sqrt(d))
        return nll + 0.5 * self.ls_prior * (z @ z), grad + np.r_[self.ls_prior * z, np.zeros(grad.size - d)]

    def fit(self, X, y):
        F = self._features(X)
        self.mu, sd = F.mean(0), F.std(0)
        self.sd = np.where(sd < 1e-12, 1.0, sd)  # a domain constant in the swarm carries no signal
        F = (F - self.mu) / self.sd
        y = np.asarray(y, float)
        self.ym, self.ys = y.mean(), (y.std() or 1.0)
        yz = (y - self.ym) / self.ys
        n, d = F.shape
        low = np.log(1e-6)
        if self.noise_floor > 0:  # the noise variance in standardised units, at least the floor's
            low = min(max(low, 2 * np.log(self.noise_floor / self.ys)), 0.0)
        bounds = [(np.log(1e-2), np.log(1e3))] * d + [(np.log(1e-3), np.log(1e2)), (low, 0.0)]
        bounds += [(np.log(1e-6), np.log(1e2))] if self.linear else []
        lo, hi = np.array(bounds).T
        rng = np.random.default_rng(self.seed)
        best = None
        with blas_one_thread():
            for r in range(self.restarts):
                th0 = np.r_[np.full(d, np.log(np.sqrt(d))), 0.0, max(np.log(1e-2), low),
                            [np.log(0.1)] if self.linear else []]
                if r:
                    th0 = np.clip(th0 + rng.normal(0, 1, th0.size), lo, hi)
                res = minimize(self._nll, th0, args=(F, yz), jac=True, method="L-BFGS-B", bounds=bounds,
                               options={"maxiter": 200})
                if best is None or res.fun < best.fun:
                    best = res
            th = best.x
            self.ls, self.s2, self.sn = np.exp(th[:d]), np.exp(th[d]), np.exp(th[d + 1])
            self.s_lin = np.exp(th[-1]) if self.linear else 0.0
            K, _, KL = self._gram(F, F, self.ls, self.s2, self.s_lin)
            for jitter in (1e-8, 1e-6, 1e-4, 1e-2):
                L, info = lapack.dpotrf(K + KL + (self.sn + jitter) * np.eye(n), lower=1)
                if not info:
                    break
            # L is kept for the posterior variance (climb.optimize.acquisition)
            self._F, self._alpha, self._L = F, cho_solve((L, True), yz), L
        return self

    def predict(self, X):
        Q = (self._features(X) - self.mu) / self.sd
        means = []
        with blas_one_thread():
            for i in range(0, len(Q), 20_000):  # bounded memory for 100k-candidate pools
                K, _, KL = self._gram(Q[i:i + 20_000], self._F, self.ls, self.s2, self.s_lin)
                means.append((K + KL) @ self._alpha)
        return np.concatenate(means) * self.ys + self.ym
