"""The `climb` command line.

    climb run     --config pipelines/demo.toml [--run runs/demo] [--set cluster.k=32 ...]
    climb embed | cluster | tokenize | search | validate | export | report  (same options; earlier stages first)
    climb predictor evaluate | propose ...             (swarm CSVs in, metrics or mixtures out)
    climb repick  --run runs/demo --set 'target.objective={...}' [--compare]   (a finished search, another objective)
    climb run --config pipelines/demo.toml --executor dask --dask-workers 2

`climb <stage> --help` says what the stage reads and writes; `--config` defaults to
pipelines/demo.toml in the current folder.

Errors a user can cause (a bad config or --set, an unknown option, bad --weights, an
unreadable or empty file, a run folder in use, a read-only folder, a full disk, a trainer
that always fails) end with one line on stderr and exit code 2; `-v` adds the traceback.
The arguments are checked before anything is written: a refused command leaves the run
folder, its config.toml included, as it was.
Ctrl-C and SIGTERM stop the run and its children, leave the run folder
resumable and say how to resume (exit 130 / 143).
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import shlex
import signal
import sys
from pathlib import Path

from climb.cli.predictor_args import add_predictor_parser
from climb.config import STAGES, ConfigError
from climb.io.errors import InputError


def _setup_logging(verbose: int) -> None:
    # Stages log their steps by default (-v is 1); `climb predictor` prints JSON and logs only with -v.
    level = logging.DEBUG if verbose > 1 else logging.INFO if verbose == 1 else logging.WARNING
    logging.basicConfig(level=level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("faiss", "sentence_transformers", "httpx", "distributed", "urllib3", "filelock",
                  "huggingface_hub", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


DEFAULT_CONFIG = "pipelines/demo.toml"
# What each stage command reads and writes (its --help); <run> is the run folder.
_STAGE_HELP = {
    "run": ("every stage, end to end",
            "Run every stage in order (embed, cluster, tokenize, search, validate when "
            "validate.enabled, export, report); stages finished with the same config and inputs are "
            "skipped. Reads the corpus (corpus.paths) and the target (target.*). Writes everything "
            "under <run>: config.toml, embed/, cluster/, tokenize/, search/, validate/, export/, report/."),
    "embed": ("embed the corpus",
              "Reads the corpus files (corpus.paths). Writes <run>/embed/: one embedding shard "
              "(<shard>.npy) and its ids (<shard>.ids.parquet) per corpus file."),
    "cluster": ("k-means, prune, merge, summarise",
                "Reads <run>/embed/ (and the corpus, for the summary). Writes <run>/cluster/: "
                "centroids, assign/<shard>.parquet (each document's cluster) and clusters.json. "
                "Runs embed first if needed."),
    "tokenize": ("train the proxies' tokenizer and build the per-cluster token store",
                 "Reads the corpus and <run>/cluster/. Writes <run>/tokenize/: tokenizer.json and "
                 "tokens/, one token file per cluster. Runs the stages before it first if needed."),
    "search": ("the proxy-swarm search for the best mixture",
               "Reads <run>/tokenize/ and the target (target.texts, target.tasks, target.lm_eval). "
               "Writes <run>/search/: results.jsonl (every proxy), mixture.json (the found mixture), "
               "quality.json, comparison.json. Runs the stages before it first if needed."),
    "validate": ("train a larger model on the found mixture and baselines: does it transfer?",
                 "Reads <run>/tokenize/, <run>/search/mixture.json and the target. Writes "
                 "<run>/validate/: plan.json, results.jsonl, summary.json. Runs the search first if "
                 "needed."),
    "export": ("write the optimised dataset and blend files",
               "Reads the corpus, <run>/cluster/ and <run>/search/mixture.json (or --weights). Writes "
               "<run>/export/ (or export.destination): data/cluster_*/*.parquet and/or Megatron "
               "datasets, mixture.json, interleave.json, README.md. Runs the search first if needed; "
               "refused arguments leave the run folder as it was."),
    "report": ("plots and summary page",
               "Reads the outputs of cluster, search (and validate, when it ran). Writes "
               "<run>/report/: report.md with its figures, index.html, summary.json. Runs the search "
               "first if needed."),
}


class _Parser(argparse.ArgumentParser):
    """argparse with its errors in one line, like every other refusal of the CLI."""

    def error(self, message: str, prog: str | None = None):
        prog = prog or self.prog
        self.exit(2, f"{prog}: error: {message} (see `{prog} --help`)\n")

    def parse_args(self, args=None, namespace=None):
        ns, extra = self.parse_known_args(args, namespace)
        if extra:  # named by the subcommand they were given to
            cmd = [c for c in (getattr(ns, "command", None), getattr(ns, "predictor_command", None)) if c]
            self.error(f"unrecognized arguments: {' '.join(extra)}", " ".join([self.prog, *cmd]))
        return ns


def _stage_parser(sub, name: str) -> argparse.ArgumentParser:
    help_, description = _STAGE_HELP[name]
    p = sub.add_parser(name, help=help_, description=description)
    p.add_argument("--config", default=None,
                   help=f"run config (TOML); default: {DEFAULT_CONFIG}, the demo, relative to the current folder "
                        "(the repository's root)")
    p.add_argument("--run", default=None, help="run folder (default: runs/<config name>, relative to the current "
                   "folder)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set search.iterations=[64,32,16]")
    p.add_argument("--executor", choices=["local", "dask"], help="where stage tasks run")
    p.add_argument("--dask-workers", type=int, help="local Dask cluster size")
    p.add_argument("--dask-address", help="existing Dask scheduler, e.g. tcp://127.0.0.1:8786")
    p.add_argument("-v", "--verbose", action="count", default=1, help="debug logs, and a traceback with an error")
    if name == "export":
        p.add_argument("--weights", help="export these weights instead of the search's: a JSON list with one "
                       "weight per cluster, summing to 1 (or {\"weights\": [...]}), or a file holding one")
    return p


def config_from_args(args):
    from climb.config import load_config
    ov = list(args.overrides)
    if args.executor:
        ov.append(f"executor.kind={args.executor!r}".replace("'", '"'))
    if args.dask_workers is not None:
        ov.append(f"executor.dask_workers={args.dask_workers}")
    if args.dask_address:
        ov += [f'executor.dask_address="{args.dask_address}"', 'executor.kind="dask"']
    config = DEFAULT_CONFIG if args.config is None else args.config
    if not Path(config).is_file():
        if args.config is None:
            raise ConfigError(f"no --config given, and the default, {DEFAULT_CONFIG}, is not in the current folder "
                              f"({Path.cwd()}); pass your run config (--config path/to/run.toml), or run from the "
                              "repository's root for the demo")
        raise ConfigError(f"--config {config}: no such file (relative paths are read from the current folder, "
                          f"{Path.cwd()}); pass the path of your run config")
    cfg = load_config(config, ov)
    if args.run:
        from climb.config.checks import check_run_dir
        check_run_dir(args.run)
    run_dir = Path(args.run) if args.run else Path("runs") / cfg.name
    return cfg, run_dir


def read_weights(arg: str, n_clusters: int | None) -> list:
    """--weights as given: a JSON list (or {"weights": [...]}) or a file holding one, checked as
    the export checks a mixture (one weight per cluster where `n_clusters` is known, finite,
    non-negative, summing to 1); InputError naming --weights otherwise."""
    import json

    from climb.io.mixture import check_weights
    where = f"--weights {arg if len(arg) <= 60 else arg[:57] + '...'!r}"
    try:  # a file holding the weights, or the weights themselves (too long for a file name)
        is_file = bool(arg) and Path(arg).is_file()
        raw = Path(arg).read_text() if is_file else arg
    except OSError:
        is_file, raw = False, arg
    if is_file:
        where = f"--weights file {arg}"
    if not raw.strip():
        raise InputError(f"{where}: empty; give a JSON list of weights, one per cluster, or a file holding one")
    try:
        w = json.loads(raw)
    except ValueError:
        raise InputError(f"{where}: neither a JSON list nor a file holding one") from None
    if isinstance(w, dict):
        if "weights" not in w:
            raise InputError(f'{where}: a JSON object without "weights"; give a list, or {{"weights": [...]}}')
        w = w["weights"]
    if not isinstance(w, list):
        raise InputError(f"{where}: {type(w).__name__} where a list of weights, one per cluster, was expected")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in w):
        raise InputError(f"{where}: weights must be numbers, one per cluster")
    check_weights(w, n_clusters, where)
    return w


def _clusters_now(run_dir: Path) -> int | None:
    """How many clusters the run folder's cluster stage found (None: it has not run)."""
    from climb.io.files import read_json
    from climb.runtime.layout import RunPaths
    summary = RunPaths(run_dir).cluster.summary
    try:
        return int(read_json(summary)["n_clusters"]) if summary.is_file() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _run_stage(args) -> int:
    from climb.runtime.runlock import hold
    cfg, run_dir = config_from_args(args)
    # The arguments are checked before the lock, the config or any stage writes a file.
    weights = None
    if args.command == "export" and args.weights is not None:
        weights = read_weights(args.weights, _clusters_now(run_dir))
    # The lock first: a second process on the folder is refused before the heavy imports.
    with hold(run_dir):
        from climb import pipeline
        if args.command == "run":
            pipeline.run_all(cfg, run_dir)
        elif weights is not None:
            from climb.runtime.layout import RunPaths
            from climb.stages import export
            pipeline.run_stage("search", cfg, run_dir)
            export.run(cfg, RunPaths(run_dir.resolve()), weights=weights)
        else:
            pipeline.run_stage(args.command, cfg, run_dir)
    return 0


def _repick_parser(sub) -> None:
    p = sub.add_parser(
        "repick", help="pick a finished search's mixture again under another objective, training nothing",
        description="Recomputes each proxy's objective from its recorded metrics under the objective given "
                    "(target.objective, target.weights, target.goals, target.goal), makes the pick by the run's "
                    "rule and predicts every metric there, at the run's own pick and at each metric's best. Reads "
                    "<run>/search/ and <run>/config.toml. Writes <run>/search/repicks/<digest>.json only: the "
                    "search stays up to date. --compare also trains the new pick on the run's comparison seeds, "
                    "paired with the baselines already trained.")
    p.add_argument("--run", required=True, help="the run folder of a finished search")
    p.add_argument("--config", default=None, help="run config (TOML); default: the run's own config.toml. It may "
                   "differ from the run's in the objective only")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="""the new objective, e.g. --set 'target.objective={bpb=1.0, "piqa/acc"={weight=0.5, """
                        """goal="maximize"}}'""")
    p.add_argument("--compare", action="store_true", help="also train the new pick's comparison proxies "
                   "(search.eval_seeds of them), paired with the run's baselines")
    p.add_argument("-v", "--verbose", action="count", default=1, help="debug logs, and a traceback with an error")
    p.set_defaults(func=_repick)


def _repick(args) -> int:
    from climb.config import load_config
    from climb.config.checks import check_run_dir
    from climb.runtime.layout import RunPaths
    from climb.runtime.runlock import hold
    check_run_dir(args.run)
    paths = RunPaths(Path(args.run).resolve())
    if not paths.config.is_file():
        raise InputError(f"--run {args.run}: no config.toml there; give the run folder of a finished search")
    run_cfg = load_config(paths.config)
    cfg = load_config(args.config or paths.config, args.overrides)
    with hold(paths.root):
        from climb.stages.search.repick import repick, table
        if args.compare:
            from climb.runtime import preflight
            preflight.check_target(cfg, paths.root)
        out = repick(run_cfg, cfg, paths, train=args.compare)
    print("\n" + table(out) + f"\n\nre-pick: {paths.search.repick(out['digest'])}\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="climb", description="Find the data mixture to pretrain a language model on.")
    sub = ap.add_subparsers(dest="command", required=True)
    for s in ("run", *STAGES):
        _stage_parser(sub, s).set_defaults(func=_run_stage)
    _repick_parser(sub)
    add_predictor_parser(sub)
    return ap


class Interrupted(KeyboardInterrupt):
    """SIGTERM, turned into an exception so that cleanup (children, temporary files, the lock) runs."""

    signum = signal.SIGTERM


def _on_sigterm(signum, frame):
    raise Interrupted()


def _os_error(e: OSError) -> str:
    where = f" ({e.filename})" if e.filename else ""
    if e.errno == errno.ENOSPC:
        return f"no space left on the device{where}; free some and run the same command again (it resumes)"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"cannot write{where}: {e.strerror}; run where you may write, or point --run at a folder "
                "of your own")
    return f"{e.strerror or e}{where}"


def _shown(e: BaseException, msg: str, verbose: int) -> str:
    if verbose > 1:
        import traceback
        traceback.print_exception(e)
    return msg


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0), or a bad option, said in one line (2)
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    verbose = getattr(args, "verbose", 1)
    _setup_logging(verbose)
    import threading
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        return args.func(args)
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        run = getattr(args, "run", None) or "the run folder"
        print(f"climb: stopped by {signal.Signals(signum).name}; what was done is kept in {run}: run "
              f"`{shlex.join(['climb'] + argv)}` again to resume", file=sys.stderr)
        if verbose > 1:
            raise
        return 128 + int(signum)
    except (ConfigError, InputError, FileNotFoundError) as e:
        msg = _shown(e, str(e), verbose)
    except OSError as e:
        msg = _shown(e, _os_error(e), verbose)
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print(f"climb: error: {' '.join(msg.split())}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
