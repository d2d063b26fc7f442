"""The arguments of `climb predictor evaluate | propose` (the work is in
`climb/cli/predictor.py`, imported only when a command runs, so that `climb --help`
and a bad option cost no numeric imports). Defaults are `climb search`'s.
"""
from __future__ import annotations

import argparse
import sys

from climb.config import SEARCH_ACQUISITIONS, SEARCH_PREDICTORS, SearchConfig


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--key", default="index", help="key column joining weights and metrics (default: index)")
    p.add_argument("--target", required=True, help="metric column to predict")
    p.add_argument("--goal", required=True, choices=("minimize", "maximize"))
    p.add_argument("--model", default="default", choices=SEARCH_PREDICTORS, help="predictor (default: default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-v", "--verbose", action="count", default=0, help="log progress to stderr")


def _run(name: str):
    def handler(args) -> int:
        from climb.cli import predictor  # the numeric stack, once a command runs
        try:
            return getattr(predictor, name)(args)
        except ValueError as e:  # bad input files or options: one clear line, exit 2
            print(f"climb predictor: error: {e}", file=sys.stderr)
            return 2
    return handler


def add_predictor_parser(subparsers) -> None:
    """Add `predictor evaluate|propose` to an argparse subparsers object."""
    p = subparsers.add_parser("predictor", help="mixture predictor on swarm CSVs: evaluate, propose")
    sub = p.add_subparsers(dest="predictor_command", required=True)
    ev = sub.add_parser("evaluate", help="fit on one swarm, rank another; prints one JSON object")
    for s in ("train", "test"):
        ev.add_argument(f"--{s}-weights", required=True, help=f"{s} weights CSV (key + one column per domain)")
        ev.add_argument(f"--{s}-metrics", required=True, help=f"{s} metrics CSV (key + metric columns)")
    _common(ev)
    ev.set_defaults(func=_run("_evaluate_cmd"))
    pr = sub.add_parser("propose", help="write the next N mixtures to train as a weights CSV")
    pr.add_argument("--weights", required=True, help="swarm weights CSV")
    pr.add_argument("--metrics", required=True, help="swarm metrics CSV")
    pr.add_argument("--n", type=int, required=True, help="how many mixtures to propose")
    pr.add_argument("--out", required=True, help="weights CSV to write")
    pr.add_argument("--prior", default="uniform",
                    help="'uniform' or a CSV with one weights row (e.g. natural token shares)")
    pr.add_argument("--pool", type=int, default=100_000, help="candidate pool size (default 100000)")
    pr.add_argument("--candidates", help="propose only from the rows of this weights CSV (same key and domain "
                    "columns as --weights), leaving out those already measured; replaces the Dirichlet pool")
    pr.add_argument("--acquisition", default=SearchConfig.acquisition, choices=SEARCH_ACQUISITIONS,
                    help=f"how the batch is chosen (default {SearchConfig.acquisition}; see climb/optimize/strategy.py)")
    pr.add_argument("--explore-frac", type=float, default=SearchConfig.explore_frac,
                    help=f"share of exploration slots with --acquisition explore (default {SearchConfig.explore_frac})")
    pr.add_argument("--min-l1", type=float, default=SearchConfig.dedup_l1,
                    help=f"L1 gap between proposals (default {SearchConfig.dedup_l1})")
    pr.add_argument("--min-weight", type=float, default=1e-3, help="zero candidate weights below this (default 0.001)")
    _common(pr)
    pr.set_defaults(func=_run("_propose_cmd"))
