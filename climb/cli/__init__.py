"""The `climb` command line.

    climb run     --config pipelines/demo.toml [--run runs/demo] [--set cluster.k=32 ...]
    climb embed | cluster | tokenize | search | validate | export | report  (same options; earlier stages first)
    climb predictor evaluate | propose ...             (swarm CSVs in, metrics or mixtures out)
    climb run --config pipelines/demo.toml --executor dask --dask-workers 2

Errors a user can cause (a bad config or --set, an unreadable or empty file, a
run folder in use, a read-only folder, a full disk, a trainer that always
fails) end with one line on stderr and exit code 2; `-v` adds the traceback.
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


def _stage_parser(sub, name: str, help_: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_)
    p.add_argument("--config", default="pipelines/demo.toml", help="run config (TOML)")
    p.add_argument("--run", default=None, help="run folder (default: runs/<config name>)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set search.iterations=[64,32,16]")
    p.add_argument("--executor", choices=["local", "dask"], help="where stage tasks run")
    p.add_argument("--dask-workers", type=int, help="local Dask cluster size")
    p.add_argument("--dask-address", help="existing Dask scheduler, e.g. tcp://127.0.0.1:8786")
    p.add_argument("-v", "--verbose", action="count", default=1)
    if name == "export":
        p.add_argument("--weights", help="export these weights (JSON list or file) instead of the search's")
    return p


def config_from_args(args):
    from climb.config import load_config
    ov = list(args.overrides)
    if args.executor:
        ov.append(f"executor.kind={args.executor!r}".replace("'", '"'))
    if args.dask_workers:
        ov.append(f"executor.dask_workers={args.dask_workers}")
    if args.dask_address:
        ov += [f'executor.dask_address="{args.dask_address}"', 'executor.kind="dask"']
    cfg = load_config(args.config, ov)
    if args.run:
        from climb.config.checks import check_run_dir
        check_run_dir(args.run)
    run_dir = Path(args.run) if args.run else Path("runs") / cfg.name
    return cfg, run_dir


def _run_stage(args) -> int:
    from climb.runtime.runlock import hold
    cfg, run_dir = config_from_args(args)
    # The lock first: a second process on the folder is refused before the heavy imports.
    with hold(run_dir):
        from climb import pipeline
        if args.command == "run":
            pipeline.run_all(cfg, run_dir)
        elif args.command == "export" and args.weights:
            import json

            from climb.runtime.stage import RunPaths
            from climb.stages import export
            try:  # a file holding the weights, or the weights themselves (too long for a file name)
                raw = Path(args.weights).read_text() if Path(args.weights).is_file() else args.weights
            except OSError:
                raw = args.weights
            try:
                w = json.loads(raw)
            except ValueError:
                raise InputError(f"--weights {args.weights!r}: neither a JSON list nor a file holding one") from None
            pipeline.run_stage("search", cfg, run_dir)
            export.run(cfg, RunPaths(run_dir.resolve()), weights=w["weights"] if isinstance(w, dict) else w)
        else:
            pipeline.run_stage(args.command, cfg, run_dir)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="climb", description="Find the data mixture to pretrain a language model on.")
    sub = ap.add_subparsers(dest="command", required=True)
    _stage_parser(sub, "run", "every stage, end to end").set_defaults(func=_run_stage)
    helps = {"embed": "embed the corpus", "cluster": "k-means, prune, merge, summarise",
             "tokenize": "train the proxies' tokenizer and build the per-cluster token store",
             "search": "the proxy-swarm search for the best mixture",
             "validate": "train a larger model on the found mixture and baselines: does it transfer?",
             "export": "write the optimised dataset and blend files", "report": "plots and summary page"}
    for s in STAGES:
        _stage_parser(sub, s, helps[s]).set_defaults(func=_run_stage)
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
    args = build_parser().parse_args(argv)
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
