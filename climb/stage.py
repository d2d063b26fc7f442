"""Run folders, stage manifests and the skip-if-unchanged rule.

A run lives in one folder: `<run>/{config.toml, embed/, cluster/, search/,
export/, report/}`. Each stage writes `manifest.json` last, holding a hash of
the config sections it depends on, its upstream manifests' hashes and its input
fingerprints. A stage whose manifest hash matches is skipped; one without a
manifest resumes task by task from the files already written.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import RunConfig, section_hash, to_toml
from .io import read_json, resolve_corpus_files, write_json

log = logging.getLogger(__name__)
STAGES = ("embed", "cluster", "search", "export", "report")


@dataclass(frozen=True)
class RunPaths:
    root: Path

    def stage(self, name: str) -> Path:
        p = self.root / name
        p.mkdir(parents=True, exist_ok=True)
        return p

    def manifest(self, name: str) -> Path:
        return self.root / name / "manifest.json"

    def corpus_files(self, cfg: RunConfig) -> list[Path]:
        return resolve_corpus_files(cfg.corpus.paths, self.root, cfg.corpus.max_shards)

    def save_config(self, cfg: RunConfig) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.toml").write_text(to_toml(cfg))


def upstream_hash(paths: RunPaths, stage: str) -> str:
    m = paths.manifest(stage)
    if not m.exists():
        raise FileNotFoundError(f"stage {stage!r} has not run in {paths.root}; run `climb {stage}` first")
    return read_json(m)["hash"]


def stage_key(*parts: Any) -> str:
    return section_hash(*parts)


def is_done(paths: RunPaths, stage: str, key: str) -> bool:
    m = paths.manifest(stage)
    if not m.exists():
        return False
    try:
        return read_json(m).get("hash") == key
    except ValueError:
        return False


def begin(paths: RunPaths, stage: str, key: str, keep_on_change: bool = False) -> Path:
    """Start (or resume) a stage. Task outputs left by a run with another config
    are stale: they are removed, or, for a stage too costly to lose (the search),
    moved aside to `<stage>.prev-<time>`."""
    import shutil
    d = paths.stage(stage)
    state = d / "state.json"
    if state.exists() and read_json(state).get("hash") != key:
        if keep_on_change:
            old = d.with_name(f"{stage}.prev-{time.strftime('%Y%m%d-%H%M%S')}")
            log.warning("%s: config or inputs changed; previous results moved to %s", stage, old)
            d.rename(old)
        else:
            log.info("%s: config or inputs changed; removing the previous outputs in %s", stage, d)
            shutil.rmtree(d)
        d.mkdir(parents=True)
    elif not state.exists() and any(d.iterdir()):
        for child in d.iterdir():  # outputs of unknown provenance: do not resume from them
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    write_json(state, {"hash": key})
    return d


def finish(paths: RunPaths, stage: str, key: str, stats: dict, started: float) -> dict:
    stats = dict(stats, seconds=round(time.time() - started, 3))
    write_json(paths.manifest(stage), {"stage": stage, "hash": key, "stats": stats,
                                       "finished": time.strftime("%Y-%m-%dT%H:%M:%S")})
    log.info("%s done in %.1fs", stage, stats["seconds"])
    return stats


def skipped(paths: RunPaths, stage: str) -> dict:
    log.info("%s: up to date, skipped (delete %s to force)", stage, paths.manifest(stage))
    return dict(read_json(paths.manifest(stage))["stats"], skipped_stage=True)
