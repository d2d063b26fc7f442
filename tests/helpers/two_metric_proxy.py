"""A stand-in external trainer whose two metrics pull apart.

    python two_metric_proxy.py WEIGHTS_JSON OUT_JSON
writes {"metrics": {"bpb": ..., "task/acc": ..., "train_loss": ...}}: `bpb` is lowest at a mixture
leaning on the last cluster, `task/acc` highest at one leaning on the first, so no mixture is best
for both; `train_loss` is their mean distance. Deterministic in the weights.
"""
import json
import sys

import numpy as np

w = np.asarray(json.load(open(sys.argv[1]))["weights"], dtype=float)
k = len(w)
last, first = np.full(k, 0.1 / (k - 1)), np.full(k, 0.1 / (k - 1))
last[-1], first[0] = 0.9, 0.9
d_last, d_first = float(((w - last) ** 2).sum()), float(((w - first) ** 2).sum())
json.dump({"metrics": {"bpb": 1.0 + d_last, "task/acc": 0.9 - d_first, "train_loss": 2.0 + (d_last + d_first) / 2},
           "tokens": 0}, open(sys.argv[2], "w"))
