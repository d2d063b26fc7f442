"""Swarm results as CSV: one weights file and one metrics file, joined on a key column.

This is the layout other mixture tools use (RegMix: ``train_mixture_1m.csv`` +
``train_pile_loss_1m.csv`` on ``index``). The weights file holds the key plus one
column per domain, every other column being a domain; the metrics file holds the
key plus any number of metric columns. `climb search` writes its swarm this way
(``search/swarm_weights.csv`` and ``search/swarm_metrics.csv``) and every command
that takes swarm results reads it with `read_swarm`.

Choices, so that errors are loud rather than silently shrinking a swarm:
- keys are compared as strings (``1`` and ``1.0`` differ: fix the file);
- every key must be in both files; a key in one file only is an error (with counts),
  never an inner join;
- rows come back in the weights file's order;
- weights must be numeric, finite, >= 0 and not all zero (`climb.io.mixture.check_weights`).
  Every row is rescaled to sum to 1; `Swarm.renormalised` counts rows that were off by more than 1e-6
  (RegMix rounds to 3 decimals: 303 of its 512 training rows), and rows off by more
  than `tol` are also logged as a warning (they look like counts or percentages);
- metrics stay a pandas DataFrame aligned with the rows; NaN in a metric is only an
  error for the column asked for (`target_values`, or `read_swarm(..., target=)`).

    from climb.io.swarm_csv import read_swarm, target_values
    s = read_swarm("W.csv", "M.csv", key="index")
    y = target_values(s, "metric/the_pile_pile_cc_val_loss")
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from climb.io.files import atomic_path
from climb.io.mixture import check_weights

log = logging.getLogger(__name__)


@dataclass
class Swarm:
    keys: list[str]
    domains: list[str]  # weight column names, in file order
    weights: np.ndarray  # (n, d) float64, rows sum to 1
    metrics: pd.DataFrame  # one row per key (same order), metric columns only, index = keys
    renormalised: int  # rows whose weights did not sum to 1 (within 1e-6) and were rescaled
    weights_path: str = ""
    metrics_path: str = ""

    def __len__(self) -> int:
        return len(self.keys)


def _read(path, key: str, role: str) -> pd.DataFrame:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"{role} file {p}: not found; give the path of an existing CSV file")
    try:
        df = pd.read_csv(p, dtype={key: str})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        raise ValueError(f"{role} file {p}: cannot be read as CSV ({e}); fix the file") from None
    if key not in df.columns:
        raise ValueError(f"{role} file {p}: no key column {key!r} (columns: {', '.join(map(str, df.columns[:8]))}"
                         f"{', ...' if df.shape[1] > 8 else ''}); add it or pass the right --key")
    if df[key].isna().any():
        raise ValueError(f"{role} file {p}: {int(df[key].isna().sum())} rows have an empty {key!r}; "
                         f"give every row a key")
    dup = df[key][df[key].duplicated()].unique()
    if len(dup):
        raise ValueError(f"{role} file {p}: duplicated keys in {key!r}: {', '.join(dup[:5])}"
                         f"{' ...' if len(dup) > 5 else ''} ({len(dup)} in all); keep one row per key")
    if len(df) == 0:
        raise ValueError(f"{role} file {p}: no rows; a swarm needs at least one result")
    return df


def _weights(df: pd.DataFrame, key: str, path, tol: float) -> tuple[list[str], np.ndarray, int]:
    domains = [c for c in df.columns if c != key]
    if not domains:
        raise ValueError(f"weights file {path}: no weight columns besides {key!r}; add one column per domain")
    keys = df[key].to_numpy()
    bad = [c for c in domains if not pd.api.types.is_numeric_dtype(df[c])]
    if bad:
        cells = [(keys[i], c, df[c].iloc[i]) for c in bad
                 for i in np.flatnonzero(pd.to_numeric(df[c], errors="coerce").isna() & df[c].notna())]
        shown = "; ".join(f"{key} {k}, column {c}: {v!r}" for k, c, v in cells[:3])
        raise ValueError(f"weights file {path}: non-numeric weight columns {bad[:5]} ({len(cells)} cells are not "
                         f"numbers: {shown}); every column except {key!r} must be a domain's weight")
    W = df[domains].to_numpy(np.float64)
    shares = check_weights(W, where=f"weights file {path}", tol=None, rows=True, labels=keys)
    s = W.sum(1)
    off = np.abs(s - 1) > 1e-6
    far = np.abs(s - 1) > tol
    if far.any():
        log.warning("%s: %d rows sum far from 1 (%.4g .. %.4g); rescaled as if they were shares",
                    path, int(far.sum()), s.min(), s.max())
    if off.any():
        log.info("%s: renormalised %d of %d rows to sum to 1", path, int(off.sum()), len(s))
    return domains, shares, int(off.sum())


def read_swarm(weights_csv, metrics_csv, key: str = "index", tol: float = 1e-2, target: str | None = None) -> Swarm:
    """Read and join a swarm; raises ValueError naming the file and the fix (see module doc)."""
    wdf = _read(weights_csv, key, "weights")
    mdf = _read(metrics_csv, key, "metrics")
    wkeys, mkeys = set(wdf[key]), set(mdf[key])
    only_w, only_m = sorted(wkeys - mkeys), sorted(mkeys - wkeys)
    if only_w or only_m:
        raise ValueError(f"{weights_csv} and {metrics_csv} disagree on {key!r}: {len(only_w)} keys only in the "
                         f"weights file ({', '.join(only_w[:3])}), {len(only_m)} only in the metrics file "
                         f"({', '.join(only_m[:3])}); give both files the same rows")
    domains, W, renorm = _weights(wdf, key, weights_csv, tol)
    keys = list(wdf[key])
    metrics = mdf.set_index(key).loc[keys]
    swarm = Swarm(keys, domains, W, metrics, renorm, str(weights_csv), str(metrics_csv))
    if target is not None:
        target_values(swarm, target)
    return swarm


def read_weights(weights_csv, key: str = "index", tol: float = 1e-2) -> tuple[list[str], list[str], np.ndarray]:
    """Mixtures alone (a weights file without metrics, e.g. candidates): keys, domains, rows summing to 1."""
    df = _read(weights_csv, key, "weights")
    domains, W, _ = _weights(df, key, weights_csv, tol)
    return list(df[key]), domains, W


def cluster_order(domains: list[str], W: np.ndarray) -> np.ndarray:
    """Columns named cluster_0 .. cluster_<k-1> (as `climb search` writes them) put in cluster
    order, in whatever order the file has them; other names keep the file's order."""
    named = [f"cluster_{c}" for c in range(len(domains))]
    return W[:, [domains.index(c) for c in named]] if set(domains) == set(named) else W


def target_values(swarm: Swarm, column: str) -> np.ndarray:
    """The metric column as float64; ValueError if missing, non-numeric or with NaN."""
    if column not in swarm.metrics.columns:
        raise ValueError(f"metrics file {swarm.metrics_path}: no column {column!r}; available: "
                         f"{', '.join(map(str, swarm.metrics.columns))}")
    y = pd.to_numeric(swarm.metrics[column], errors="coerce").to_numpy(np.float64)
    inf = np.flatnonzero(np.isinf(y))
    if len(inf):
        raise ValueError(f"metrics file {swarm.metrics_path}: column {column!r} has {len(inf)} infinite values "
                         f"(keys {', '.join(swarm.keys[i] for i in inf[:5])}; a diverged run?); drop those rows "
                         f"from both files or replace the values")
    bad = np.flatnonzero(~np.isfinite(y))
    if len(bad):
        raise ValueError(f"metrics file {swarm.metrics_path}: column {column!r} has {len(bad)} NaN, empty or "
                         f"non-numeric values (keys {', '.join(swarm.keys[i] for i in bad[:5])}); drop those "
                         f"rows from both files or fill them in")
    return y


def read_prior(path, domains: list[str], key: str = "index") -> np.ndarray:
    """A single weights row (same domain columns as the swarm, key column optional), summing to 1."""
    p = Path(path)
    try:
        df = pd.read_csv(p)
    except (FileNotFoundError, pd.errors.ParserError, pd.errors.EmptyDataError, OSError) as e:
        raise ValueError(f"prior file {p}: cannot be read ({e}); give a CSV with one weights row") from None
    df = df.drop(columns=[key], errors="ignore")
    missing = [d for d in domains if d not in df.columns]
    if len(df) != 1 or missing:
        raise ValueError(f"prior file {p}: needs exactly one row with the swarm's domain columns "
                         f"(has {len(df)} rows; missing {missing[:5]})")
    w = pd.to_numeric(df[domains].iloc[0], errors="coerce").to_numpy(np.float64)
    return check_weights(w, where=f"prior file {p}", tol=None)


def _atomic_csv(df: pd.DataFrame, path) -> None:
    with atomic_path(path) as tmp:  # readers never see half a file
        with open(tmp, "w", newline="") as fh:
            df.to_csv(fh, index=False)


def write_swarm(weights_csv, metrics_csv, keys, domains, weights, metrics: dict, key: str = "index") -> None:
    """Write a swarm as the two CSV files, each atomically (temp file, then rename)."""
    keys = [str(k) for k in keys]
    W = np.asarray(weights, np.float64)
    if W.shape != (len(keys), len(domains)):
        raise ValueError(f"weights shape {W.shape} does not match {len(keys)} keys x {len(domains)} domains")
    if len(set(keys)) != len(keys):
        raise ValueError("write_swarm: keys must be unique")
    if key in domains or key in metrics:
        raise ValueError(f"write_swarm: {key!r} is the key column; rename the domain or metric")
    wdf = pd.DataFrame(W, columns=list(domains))
    wdf.insert(0, key, keys)
    mdf = pd.DataFrame({key: keys})
    for name, vals in metrics.items():
        vals = np.asarray(vals)
        if vals.shape != (len(keys),):
            raise ValueError(f"metric {name!r} has shape {vals.shape}, expected ({len(keys)},)")
        mdf[name] = vals
    _atomic_csv(wdf, weights_csv)
    _atomic_csv(mdf, metrics_csv)
