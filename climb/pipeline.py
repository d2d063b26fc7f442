"""The stages as plain Python functions, each running what it depends on first.

    from climb import pipeline
    cfg = pipeline.load("pipelines/demo.toml", ["search.iterations=[8,4]"])
    pipeline.run_all(cfg, "runs/demo")  # embed -> cluster -> tokenize -> search [-> validate] -> export -> report
    pipeline.run_stage("cluster", cfg, "runs/demo")

Before the first stage, the inputs climb builds itself are built: with
`corpus.build = "demo"`, the demo corpus under `<run>/data` (climb.stages.embed.demo).

Both hold the run folder's lock (climb.runtime.runlock) while they run: a second
process on the same folder is refused with a message naming the first. The run
folder is local (or a mounted filesystem): it holds a lock, append-only logs and
memory-mapped arrays, which an object store cannot. Inputs may be URLs, and
`export.destination` sends the dataset to an object store; a URL destination is
checked before the first stage runs, not after the search.

With `[track]` set, the invocation is one parent run in the experiment tracker, continued
when the run resumes; after each stage (and during a search or validation) the proxies the
run folder records are logged as its child runs (climb.runtime.track). A tracker that fails
warns once; the stages never see it.
"""
from __future__ import annotations

import logging
from pathlib import Path

from climb.config import OPTIONAL, STAGES, RunConfig, load_config
from climb.config.checks import check_run_dir
from climb.io.errors import InputError
from climb.runtime import preflight, track
from climb.runtime.runlock import hold
from climb.runtime.layout import RunPaths
from climb.stages import cluster, embed, export, report, search, tokenize, validate
from climb.stages.embed import demo

log = logging.getLogger(__name__)
_RUN = {"embed": embed.run, "cluster": cluster.run, "tokenize": tokenize.run, "search": search.run,
        "validate": validate.run, "export": export.run, "report": report.run}


def load(config: str | Path | None, overrides=()) -> RunConfig:
    return load_config(config, overrides)


def _paths(run_dir: str | Path) -> RunPaths:
    check_run_dir(run_dir)
    return RunPaths(Path(run_dir).resolve())


def run_stage(stage: str, cfg: RunConfig, run_dir: str | Path, with_deps: bool = True) -> dict:
    """Run one stage (and, by default, every stage before it; finished ones are skipped)."""
    if stage not in _RUN:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    paths = _paths(run_dir)
    order = STAGES[: STAGES.index(stage) + 1] if with_deps else (stage,)
    # export is not a dependency of report; it runs when asked or with `run`. validate runs
    # when asked, or before a later stage when the config enables it.
    order = tuple(s for s in order if s == stage or (s != "export" and _enabled(cfg, s)))
    stats = {}
    with hold(paths.root):
        if "export" in order:
            export.check_destination(cfg, paths)
        if any(s in order for s in ("search", "validate")):
            check_target(cfg)
        build_inputs(cfg, paths)
        preflight.check(cfg, paths, order)
        saved = _save_config(cfg, paths)  # after the checks: a refused command leaves config.toml as it was
        with track.session(cfg, paths) as tracker:
            for s in order:
                _before(s, cfg, paths, saved, stats)
                log.info("== %s ==", s)
                with tracker.during(s):
                    stats[s] = _RUN[s](cfg, paths)
    return stats[stage]


def run_all(cfg: RunConfig, run_dir: str | Path) -> dict:
    paths = _paths(run_dir)
    out = {}
    with hold(paths.root):
        export.check_destination(cfg, paths)
        check_target(cfg)
        build_inputs(cfg, paths)
        preflight.check(cfg, paths, [s for s in STAGES if _enabled(cfg, s)])
        saved = _save_config(cfg, paths)
        with track.session(cfg, paths) as tracker:
            for s in STAGES:
                if not _enabled(cfg, s):
                    continue
                _before(s, cfg, paths, saved, out)
                log.info("== %s ==", s)
                with tracker.during(s):
                    out[s] = _RUN[s](cfg, paths)
    return out


def _save_config(cfg: RunConfig, paths: RunPaths) -> bytes | None:
    """Write config.toml; return what it held before (None: there was none)."""
    before = paths.config.read_bytes() if paths.config.exists() else None
    paths.save_config(cfg)
    return before


def _before(stage: str, cfg: RunConfig, paths: RunPaths, saved: bytes | None, done: dict) -> None:
    """The checks due before `stage` (climb.runtime.preflight.before; before the search, also its
    bounds against the clusters, climb.stages.search.common.check_bounds, and an earlier run it reuses
    against this one's clusters, tokenizer, target and proxies, climb.stages.search.check_reuse). One
    refused while every stage before it was skipped as up to date leaves the run folder as it was,
    config.toml included."""
    try:
        preflight.before(stage, cfg, paths)
        if stage == "search":
            from climb.stages.search.common import check_bounds
            from climb.stages.search import check_reuse
            check_bounds(cfg, paths)
            check_reuse(cfg, paths)
    except InputError:
        if all(st.get("skipped_stage") for st in done.values()):
            if saved is None:
                paths.config.unlink(missing_ok=True)
            elif paths.config.read_bytes() != saved:
                paths.config.write_bytes(saved)
        raise


def check_target(cfg: RunConfig) -> None:
    """Fail before any stage runs where the target's harness tasks cannot be loaded from here."""
    if cfg.target.lm_eval:
        from climb.runtime.harness import check
        check(cfg.target)


def build_inputs(cfg: RunConfig, paths: RunPaths) -> None:
    """What climb makes itself before the stages read it: the demo corpus, when the config asks."""
    if cfg.corpus.build:
        log.info("== corpus (%s) ==", cfg.corpus.build)
    demo.ensure_corpus(cfg, paths)


def _enabled(cfg: RunConfig, stage: str) -> bool:
    return stage not in OPTIONAL or getattr(cfg, stage).enabled
