"""The stages as plain Python functions, each running what it depends on first.

    from climb import pipeline
    cfg = pipeline.load("pipelines/demo.toml", ["search.iterations=[8,4]"])
    pipeline.run_all(cfg, "runs/demo")          # embed -> cluster -> search -> export -> report
    pipeline.run_stage("cluster", cfg, "runs/demo")
"""
from __future__ import annotations

import logging
from pathlib import Path

from . import cluster, embed, export, report, search
from .config import RunConfig, load_config
from .stage import STAGES, RunPaths

log = logging.getLogger(__name__)
_RUN = {"embed": embed.run, "cluster": cluster.run, "search": search.run, "export": export.run,
        "report": report.run}


def load(config: str | Path | None, overrides=()) -> RunConfig:
    return load_config(config, overrides)


def run_stage(stage: str, cfg: RunConfig, run_dir: str | Path, with_deps: bool = True) -> dict:
    """Run one stage (and, by default, every stage before it; finished ones are skipped)."""
    if stage not in _RUN:
        raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    paths = RunPaths(Path(run_dir).resolve())
    paths.save_config(cfg)
    order = STAGES[: STAGES.index(stage) + 1] if with_deps else (stage,)
    # export is not a dependency of report; it runs when asked or with `run`.
    order = tuple(s for s in order if s != "export" or stage == "export")
    stats = {}
    for s in order:
        log.info("== %s ==", s)
        stats[s] = _RUN[s](cfg, paths)
    return stats[stage]


def run_all(cfg: RunConfig, run_dir: str | Path) -> dict:
    paths = RunPaths(Path(run_dir).resolve())
    paths.save_config(cfg)
    out = {}
    for s in STAGES:
        log.info("== %s ==", s)
        out[s] = _RUN[s](cfg, paths)
    return out
