"""A proxy that looks a mixture up in a table of measured results instead of training.

The table is a swarm in the CSV layout (`climb.io.swarm_csv`): a weights file and a
metrics file joined on a key. A mixture is found by its weights (the nearest row
in L1, which must be within `TOL`; columns named cluster_<i> are read in cluster
order, others in file order); its metrics are every numeric, finite column of
that row. A mixture the table does not hold is an error, so a search over a
released swarm (`search.candidates` = its weights file) never invents a result.

In a run config:

    [proxy]
    lookup = "../shared/data/swarms/regmix/train_pile_loss_1m.csv"
    lookup_weights = "../shared/data/swarms/regmix/train_mixture_1m.csv"

or as an external trainer (`proxy.command`), the same look-up in a subprocess:

    python -m climb.runtime.lookup --weights W.csv --metrics M.csv [--key index] WEIGHTS_JSON OUT_JSON
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.spatial import cKDTree

from climb.io.files import file_stamp
from climb.io.mixture import check_weights
from climb.io.swarm_csv import cluster_order, read_swarm

TOL = 1e-6  # L1; rows read by climb.io.swarm_csv are renormalised the same way, so a candidate matches exactly
_TABLES: dict = {}


class LookupTable:
    def __init__(self, weights_csv, metrics_csv, key: str = "index"):
        self.swarm = read_swarm(weights_csv, metrics_csv, key=key)
        self.tree = cKDTree(cluster_order(self.swarm.domains, self.swarm.weights))
        num = self.swarm.metrics.apply(pd.to_numeric, errors="coerce")
        self.columns = [c for c in num.columns if num[c].notna().any()]
        self.values = num[self.columns].to_numpy(np.float64)

    def metrics(self, weights) -> dict:
        """The metrics of the table's row with these weights (shares: rescaled to sum to 1); LookupError
        when it has none, InputError when they are not one finite, >= 0 weight per domain of the table."""
        w = check_weights(weights, len(self.swarm.domains), f"a mixture looked up in {self.swarm.weights_path}",
                          tol=None)
        d, i = self.tree.query(w, k=1, p=1)
        if d > TOL:
            raise LookupError(f"mixture not in {self.swarm.weights_path} (nearest row "
                              f"{self.swarm.keys[int(i)]} is {d:.3g} away in L1)")
        row = self.values[int(i)]
        return {c: float(v) for c, v in zip(self.columns, row) if np.isfinite(v)}


def table(weights_csv, metrics_csv, key: str = "index") -> LookupTable:
    """One table per files and key per process (a Dask worker reuses it)."""
    stamp = tuple((str(p), *file_stamp(p)) for p in (weights_csv, metrics_csv))
    if (stamp, key) not in _TABLES:
        _TABLES[(stamp, key)] = LookupTable(weights_csv, metrics_csv, key)
    return _TABLES[(stamp, key)]


def lookup_proxy(task) -> tuple[dict, int]:
    """`climb.runtime.proxy_runs` entry point for `proxy.lookup`: (metrics, tokens trained = 0)."""
    from climb.io.files import InputError
    proxy_cfg = task.proxy
    try:
        t = table(proxy_cfg.lookup_weights, proxy_cfg.lookup, proxy_cfg.lookup_key)
    except (ValueError, OSError) as e:  # the table itself is unusable: stop, as for any bad input
        raise InputError(f"proxy.lookup: {e}") from None
    return t.metrics(task.weights), 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m climb.runtime.lookup", description=__doc__.split("\n")[0])
    ap.add_argument("--weights", required=True, help="the table's weights CSV")
    ap.add_argument("--metrics", required=True, help="the table's metrics CSV")
    ap.add_argument("--key", default="index")
    ap.add_argument("mixture", help="JSON file with {\"weights\": [...]} (climb's {weights})")
    ap.add_argument("out", help="where to write {\"metrics\": {...}} (climb's {out})")
    args = ap.parse_args(argv)
    try:
        w = json.loads(Path(args.mixture).read_text())["weights"]
        metrics = LookupTable(args.weights, args.metrics, args.key).metrics(w)
    except (ValueError, LookupError, KeyError) as e:
        print(f"climb.runtime.lookup: error: {e}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps({"metrics": metrics, "tokens": 0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
