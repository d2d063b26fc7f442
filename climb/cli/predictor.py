"""`climb predictor evaluate | propose`: the mixture predictor on swarm CSV files.

evaluate: fit a predictor on one swarm, rank another, print one JSON object
(spearman, pearson, top1_regret, top1_rank, n_train, n_test, model, ...):

    climb predictor evaluate \\
        --train-weights ../shared/data/swarms/regmix/train_mixture_1m.csv \\
        --train-metrics ../shared/data/swarms/regmix/train_pile_loss_1m.csv \\
        --test-weights ../shared/data/swarms/regmix/test_mixture_1m.csv \\
        --test-metrics ../shared/data/swarms/regmix/test_pile_loss_1m.csv \\
        --key index --target metric/the_pile_pile_cc_val_loss --goal minimize

A constant prediction (nothing learnt: a constant target, too few rows) is said
on stderr and reported as `"constant_prediction": true` with no Spearman and no
top-1 regret or rank.

propose: fit on a swarm, score a Dirichlet pool around a prior (a CSV with one
weights row, e.g. the natural token shares, or "uniform") or the unmeasured rows
of `--candidates CSV`, choose the next N mixtures as `climb search` does
(`--acquisition`, climb/optimize/strategy.py), and write them as a weights CSV with columns
key, the domains, and `predicted` in a metrics CSV beside it (OUT with
`_predicted` before the suffix; with --candidates the keys are the candidates'):

    climb predictor propose --weights W.csv --metrics M.csv \\
        --key index --target loss --goal minimize --n 16 --out next.csv [--candidates C.csv]

The arguments are declared in `climb/cli/predictor_args.py`, which the CLI reads
without this module's imports (`python -m climb.cli predictor ...` is the same command).
"""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import numpy as np

from climb.io.swarm_csv import read_prior, read_swarm, read_weights, target_values, write_swarm
from climb.optimize.candidates import sample_candidates
from climb.optimize.predictor import is_constant, make_predictor, rank_metrics
from climb.optimize.strategy import Strategy, propose_next, row_index

log = logging.getLogger(__name__)
MIN_ROWS = 2  # one row leaves nothing to compare


def _json_safe(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def _check_fit_rows(sw, y, target: str) -> None:
    if len(sw) < MIN_ROWS:
        raise ValueError(f"{sw.weights_path}: {len(sw)} row(s); a predictor needs at least {MIN_ROWS} results "
                         f"to fit, measure more mixtures first")
    if is_constant(y):
        log.warning("%s: %r is the same (%g) in all %d rows: there is nothing to learn, every mixture is "
                    "predicted alike", sw.metrics_path, target, y[0], len(y))


def _warn_unseen_domains(domains, W_fit, W_new, what: str) -> None:
    """A domain never used in the fitted rows has no measured effect; a prediction for it is a guess."""
    for j in np.flatnonzero((W_fit == 0).all(0) & (W_new > 0).any(0)):
        log.warning("domain %r is 0 in every training row but not in %d %s: the predictor has never seen "
                    "its effect", domains[j], int((W_new[:, j] > 0).sum()), what)


def evaluate(train_weights, train_metrics, test_weights, test_metrics, key: str, target: str, goal: str,
             model: str = "default", seed: int = 0) -> dict:
    """Fit on the train swarm, rank the test swarm; the dict `evaluate` prints."""
    tr = read_swarm(train_weights, train_metrics, key=key, target=target)
    te = read_swarm(test_weights, test_metrics, key=key, target=target)
    if te.domains != tr.domains:
        missing, extra = set(tr.domains) - set(te.domains), set(te.domains) - set(tr.domains)
        if missing or extra:
            raise ValueError(f"{test_weights}: domains differ from {train_weights} (missing {sorted(missing)[:5]}, "
                             f"extra {sorted(extra)[:5]}); both files need the same weight columns")
        te.weights = te.weights[:, [te.domains.index(d) for d in tr.domains]]  # same columns, other order
    y = target_values(tr, target)
    _check_fit_rows(tr, y, target)
    _warn_unseen_domains(tr.domains, tr.weights, te.weights, "test rows")
    t0 = time.time()
    m = make_predictor(model, seed=seed).fit(tr.weights, y)
    t_fit = time.time() - t0
    pred = m.predict(te.weights)
    out = rank_metrics(target_values(te, target), pred, goal)
    out.pop("n")
    if out["constant_prediction"]:
        log.warning("model %s predicts one value (%g) for every test row: it ranks nothing, so no Spearman "
                    "and no top-1 regret are reported", m.name, float(pred[0]))
    out.update(n_train=len(tr), n_test=len(te), model=m.name, target=target, goal=goal, seed=seed,
               renormalised_train=tr.renormalised, renormalised_test=te.renormalised,
               fit_seconds=round(t_fit, 3))
    if hasattr(m, "alpha"):
        out["blend_weight_smooth"] = m.alpha
    return _json_safe(out)


def _evaluate_cmd(args) -> int:
    res = evaluate(args.train_weights, args.train_metrics, args.test_weights, args.test_metrics, args.key,
                   args.target, args.goal, args.model, args.seed)
    print(json.dumps(res))
    return 0


def _candidate_pool(args, domains: list[str]) -> tuple[list[str], np.ndarray]:
    """--candidates: the rows of a weights CSV, columns matched to the swarm's domains by name."""
    keys, cdom, C = read_weights(args.candidates, key=args.key)
    missing, extra = sorted(set(domains) - set(cdom)), sorted(set(cdom) - set(domains))
    if missing or extra:
        raise ValueError(f"candidates file {args.candidates}: domains differ from the swarm's (missing "
                         f"{missing[:5]}, extra {extra[:5]}); give it the same weight columns")
    return keys, C[:, [cdom.index(d) for d in domains]]


def _propose_cmd(args) -> int:
    sw = read_swarm(args.weights, args.metrics, key=args.key, target=args.target)
    y = target_values(sw, args.target)
    _check_fit_rows(sw, y, args.target)
    d = len(sw.domains)
    if args.candidates:
        keys, pool = _candidate_pool(args, sw.domains)
        free = np.flatnonzero(row_index(pool, sw.weights) < 0)  # never propose a mixture already measured
        keys, pool = [keys[i] for i in free], pool[free]
        _warn_unseen_domains(sw.domains, sw.weights, pool, "candidates")
    else:
        prior = np.full(d, 1.0 / d) if args.prior == "uniform" else read_prior(args.prior, sw.domains, key=args.key)
        pool = sample_candidates(prior, args.pool, np.random.default_rng(args.seed), min_weight=args.min_weight)
        keys = [f"proposal-{i:03d}" for i in range(len(pool))]
    if len(pool) < args.n:
        raise ValueError(f"the candidate pool has {len(pool)} distinct unmeasured mixtures, fewer than --n "
                         f"{args.n}; {'add candidates' if args.candidates else 'raise --pool'}")
    strategy = Strategy(predictor=args.model, acquisition=args.acquisition, explore_frac=args.explore_frac,
                        min_l1=args.min_l1)
    idx, pred = propose_next(sw.weights, y, args.goal, pool, args.n, strategy, args.seed)
    W = pool[idx]
    out = Path(args.out)
    keys = [keys[i] for i in idx] if args.candidates else [f"proposal-{i:03d}" for i in range(len(W))]
    pred_path = out.with_name(out.stem + "_predicted" + (out.suffix or ".csv"))
    write_swarm(out, pred_path, keys, sw.domains, W, {f"predicted:{args.target}": pred}, key=args.key)
    best = "min" if args.goal == "minimize" else "max"
    print(json.dumps({"out": str(out), "predicted": str(pred_path), "n": len(W), "n_seen": len(sw),
                      "pool": len(pool), "model": args.model, "acquisition": args.acquisition,
                      f"predicted_{best}": float(getattr(np, best)(pred))}))
    return 0
