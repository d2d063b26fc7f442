"""A stand-in external trainer with seed noise of a known size.

    python noisy_proxy.py WEIGHTS_JSON OUT_JSON
writes {"metrics": {"loss": d}} with d = ||w - w*||^2 + s(seed) + e(seed, w):
s ~ N(0, 0.05) is shared by every mixture trained with that seed (it cancels when
mixtures are paired by seed), e ~ N(0, 0.002) is not.
"""
import json
import sys
import zlib

import numpy as np

task = json.load(open(sys.argv[1]))
w = np.asarray(task["weights"], dtype=float)
target = np.full(len(w), 0.1 / (len(w) - 1))
target[-1] = 0.9
d = float(((w - target) ** 2).sum())
d += float(np.random.default_rng([task["seed"], 7]).normal(0, 0.05))
d += float(np.random.default_rng([task["seed"], zlib.crc32(np.round(w, 6).tobytes())]).normal(0, 0.002))
json.dump({"metrics": {"loss": d}, "tokens": 0}, open(sys.argv[2], "w"))
