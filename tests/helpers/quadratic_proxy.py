"""A stand-in external trainer: scores a mixture by a known quadratic bowl.

    python quadratic_proxy.py WEIGHTS_JSON OUT_JSON SIGN [SEED_NOISE]
writes {"metrics": {"loss": d, "score": -d}} with d = ||w - w*||^2 (+ tiny noise),
where w* puts most weight on the last cluster. SIGN is unused by the bowl; the
search test reads "loss" with goal=minimize or "score" with goal=maximize.
SEED_NOISE (optional): also add noise of that sd drawn from the mixture and the
proxy's seed, so that replicates on other seeds measure it.
"""
import json
import sys

import numpy as np

w = np.asarray(json.load(open(sys.argv[1]))["weights"], dtype=float)
target = np.full(len(w), 0.1 / (len(w) - 1))
target[-1] = 0.9
d = float(((w - target) ** 2).sum())
rng = np.random.default_rng(abs(hash(tuple(np.round(w, 6)))) % 2**32)
d += float(rng.normal(0, 1e-4))
if len(sys.argv) > 4:
    seed = int(json.load(open(sys.argv[1])).get("seed", 0))
    d += float(np.random.default_rng([abs(hash(tuple(np.round(w, 6)))) % 2**32, seed]).normal(0, float(sys.argv[4])))
json.dump({"metrics": {"loss": d, "score": -d}, "tokens": 0}, open(sys.argv[2], "w"))
