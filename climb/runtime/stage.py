"""Run folders, stage manifests and the skip-if-unchanged rule.

A run lives in one folder, whose files `RunPaths` names (climb/runtime/layout.py). Each stage writes `manifest.json` last, holding a hash of
the config sections it depends on, its upstream manifests' hashes and its input
fingerprints, and the size and mtime_ns of every file the stage wrote. Later stages
key on its `hash`, which is the key itself unless the stage passes on less (the token
store passes on its settings and inputs, not its cap: a model reading at most the cap of
a cluster gets the same tokens whatever the cap). A stage whose manifest hash matches
and whose files are as it left them is skipped; one without a manifest resumes task by
task from the files already written. A file damaged or deleted since (a shard cut short, an assignment
file removed) is taken away with the manifest, so the stage resumes and its
producer writes that file again; a stage reading the outputs of an earlier one
first checks them the same way and, if one is damaged, stops with a message
naming the file and the command that re-creates it.

Every stage runs inside `execute`: key, skip, begin (or resume), its own work over
the executor, finish. Its tasks are frozen dataclasses. Inside a stage, work resumes
task by task by one rule: a task writes each output whole (a temporary name renamed
into place) and its last output marks it complete; a task that finds its outputs in
place returns what they record instead of running again (an embedding shard's
`.npy` and `.ids.parquet`, a fine-assignment file, a token-store part's `done.json`,
a proxy's record in an append-only results log). Tasks that cost little to redo (the
cluster summary, export shards) run again whole.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from climb.config import digest
from climb.io.files import InputError, read_json, write_json
from climb.runtime.layout import RunPaths

log = logging.getLogger(__name__)
# Bookkeeping files of a stage folder, not outputs. The state is not `state.json`:
# `datasets.load_dataset` refuses a folder holding one (its own save_to_disk marker),
# and the export folder is meant to load as a dataset.
STATE = "stage_state.json"
OWN_FILES = ("manifest.json", STATE)
# Folders inside a stage's folder that are not its outputs: re-picks (`climb repick`) are written
# beside a finished search and must never make it look changed.
NOT_OUTPUTS = ("repicks",)


def state_file(folder: Path) -> Path:
    """A stage folder's state file (an older run's `state.json` is renamed to it)."""
    new, old = folder / STATE, folder / "state.json"
    if not new.exists() and old.exists():
        try:
            if "hash" in read_json(old):
                old.rename(new)
        except ValueError:
            pass
    return new


def output_fingerprints(folder: Path) -> dict[str, list]:
    """Size, mtime_ns and SHA-256 of every file under a stage folder (temporary and bookkeeping
    files aside): the time says cheaply that a file is as written, the digest that a file
    whose time changed (a copy without its times) still is."""
    from climb.io.digests import file_digest
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        parts = p.relative_to(folder).parts
        if rel in OWN_FILES or parts[0] in NOT_OUTPUTS or any(part.startswith(".") for part in parts) \
                or not p.is_file():
            continue
        st = p.stat()
        out[rel] = [st.st_size, st.st_mtime_ns, file_digest(p)]
    return out


def damaged_outputs(paths: RunPaths, stage: str) -> list[str]:
    """Outputs of a finished stage that are missing or changed since its manifest: another size,
    or another time and other bytes. A file whose time alone changed (copied without its times)
    is as written; the manifest then keeps its new time, so the next check is a stat again."""
    from climb.io.digests import file_digest
    folder = paths.root / stage
    manifest = read_json(paths.manifest(stage))
    recorded = manifest.get("outputs") or {}
    bad, touched = [], {}
    for rel, entry in recorded.items():
        size, mtime_ns = entry[:2]
        try:
            st = (folder / rel).stat()
        except FileNotFoundError:
            bad.append(rel)
            continue
        if st.st_size != size:
            bad.append(rel)
        elif st.st_mtime_ns != mtime_ns:
            if len(entry) > 2 and file_digest(folder / rel) == entry[2]:
                touched[rel] = [size, st.st_mtime_ns, entry[2]]
            else:
                bad.append(rel)
    if touched and not bad:
        write_json(paths.manifest(stage), {**manifest, "outputs": {**recorded, **touched}})
    return bad


def _describe(paths: RunPaths, stage: str, bad: list[str]) -> str:
    first = paths.root / stage / bad[0]
    state = "missing" if not first.exists() else "changed (size or time)"
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    return f"{first} is {state} since `climb {stage}` wrote it{more}"


def upstream_resume(paths: RunPaths, stage: str) -> str | None:
    """An earlier stage's resume key (the part of its key its settings make), None if it has none."""
    m = paths.manifest(stage)
    return read_json(m).get("resume") if m.exists() else None


def output_digest(paths: RunPaths, stage: str, rel: str) -> str | None:
    """The SHA-256 a finished stage's manifest records for one of its outputs (None: not recorded)."""
    m = paths.manifest(stage)
    entry = (read_json(m).get("outputs") or {}).get(rel) if m.exists() else None
    return entry[2] if entry and len(entry) > 2 else None


def upstream_key(paths: RunPaths, stage: str) -> str:
    """The key a later stage takes from an earlier one: the hash in its manifest (with the
    content digest of a repair that changed its outputs), after checking its outputs are
    as it left them."""
    m = paths.manifest(stage)
    if not m.exists():
        raise FileNotFoundError(f"stage {stage!r} has not run in {paths.root}; run `climb {stage}` first")
    try:
        manifest = read_json(m)
    except ValueError:
        raise InputError(f"{m} is damaged; run `climb {stage}` (same --config and --run) to re-create it") from None
    bad = damaged_outputs(paths, stage)
    if bad:
        raise InputError(f"{_describe(paths, stage, bad)}; run `climb {stage}` (same --config and --run) "
                         "to re-create it")
    # A repair that changed what the stage produced (see finish) changes what later stages key on.
    return digest(manifest["hash"], manifest["content"]) if manifest.get("content") else manifest["hash"]


def is_done(paths: RunPaths, stage: str, key: str, keep: tuple[str, ...] = (),
            cascade: dict[str, str] | None = None, legacy_key: str | tuple[str, ...] | None = None) -> bool:
    """Whether the stage finished with this key and its outputs are intact.

    Damaged outputs are removed with the manifest, so the stage resumes and writes
    them again; `keep` names files repaired in place instead (an append-only log),
    and `cascade` maps a file to a folder that depends on it and goes with it.
    A manifest holding `legacy_key` (one key or several: the stage's key as an older
    climb computed it for the same settings and inputs; a manifest written before stage
    keys were content keys holds it as its `hash`) is upgraded in place (`upgrade`),
    nothing redone.
    """
    m = paths.manifest(stage)
    if not m.exists():
        return False
    try:
        manifest = read_json(m)
    except ValueError:
        return False
    held = manifest.get("key", manifest.get("hash"))
    if held != key:
        older = (legacy_key,) if isinstance(legacy_key, str) else tuple(legacy_key or ())
        if not (held in older and not damaged_outputs(paths, stage)):
            return False
        upgrade(paths, stage, key)
    elif "key" not in manifest and not damaged_outputs(paths, stage):
        upgrade(paths, stage, key)  # the same key as before: its outputs' digests are added
    bad = damaged_outputs(paths, stage)
    if not bad:
        return True
    log.warning("%s: %s; running %s again to re-create it", stage, _describe(paths, stage, bad), stage)
    folder = paths.root / stage
    import shutil
    old = read_json(m)
    write_json(state_file(folder), {"hash": key, "resume": old.get("resume"),
                                    "repairing": {k: old.get(k) for k in ("digest", "content")}})
    for rel in bad:
        if rel in keep:
            continue
        (folder / rel).unlink(missing_ok=True)
        dependent = (cascade or {}).get(rel)
        if dependent and (folder / dependent).exists():
            shutil.rmtree(folder / dependent)
    m.unlink()
    return False


def upgrade(paths: RunPaths, stage: str, key: str) -> None:
    """A manifest of an older run folder, its outputs found as it recorded them, given the
    key it matches now and its outputs' digests. Its `hash`, which later stages keyed on,
    stays: they are not redone either."""
    m = paths.manifest(stage)
    manifest = read_json(m)
    write_json(m, {**manifest, "key": key, "outputs": output_fingerprints(paths.root / stage)})
    if str(paths.root) not in _UPGRADED:
        log.info("%s: upgraded this run folder's manifests to the current keys (inputs and outputs known by what "
                 "they hold, each stage keyed on what its outputs depend on); nothing is redone", paths.root)
    _UPGRADED.add(str(paths.root))


_UPGRADED: set = set()


def older_key(paths: RunPaths, stage: str, compute: Callable[[], str]) -> str | None:
    """compute(): the stage's key as an older run folder computed it, asked only where the
    stage's manifest predates content keys (it has no `key`); None elsewhere."""
    m = paths.manifest(stage)
    try:
        return compute() if m.exists() and "key" not in read_json(m) else None
    except (OSError, ValueError):
        return None


def begin(paths: RunPaths, stage: str, key: str, keep_on_change: bool = False,
          keep_dirs: tuple[str, ...] = (), resume_key: str | None = None) -> Path:
    """Start (or resume) a stage. Task outputs left by a run with another config
    are stale: they are removed, or, for a stage too costly to lose (the search),
    moved aside to `<stage>.prev-<time>`. `keep_dirs` are subfolders that key their own
    contents (the export's counts, by tokenizer and clusters) and stay. `resume_key`: the
    part of the key that only the stage's settings make (not its inputs); where it is
    unchanged, only inputs changed (a shard added, one replaced), and the outputs stay for
    the stage's tasks to keep those whose own inputs are unchanged (each task checks)."""
    import shutil
    d = paths.stage(stage)
    state = state_file(d)
    old = read_json(state) if state.exists() else {}
    if state.exists() and old.get("hash") != key and resume_key and old.get("resume") == resume_key:
        log.info("%s: its inputs changed, its settings did not; outputs of unchanged inputs are kept", stage)
    elif state.exists() and old.get("hash") != key:
        if keep_on_change:
            old = d.with_name(f"{stage}.prev-{time.strftime('%Y%m%d-%H%M%S')}")
            log.warning("%s: config or inputs changed; previous results moved to %s", stage, old)
            d.rename(old)
            d.mkdir(parents=True)
        else:
            log.info("%s: config or inputs changed; removing the previous outputs in %s", stage, d)
            for child in d.iterdir():
                if child.name not in keep_dirs:
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
    elif not state.exists() and any(d.iterdir()):
        for child in d.iterdir():  # outputs of unknown provenance: do not resume from them
            if child.name not in keep_dirs:
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    kept = read_json(state) if state.exists() else {}
    write_json(state, {**kept, "hash": key, "resume": resume_key})
    return d


def _files_digest(folder: Path, files: tuple[str, ...]) -> str | None:
    import hashlib
    if not files:
        return None
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.encode() + b"\0" + (folder / rel).read_bytes())
    return h.hexdigest()[:16]


def finish(paths: RunPaths, stage: str, key: str, stats: dict, started: float,
           digest_files: tuple[str, ...] = (), passes_on: str | None = None) -> dict:
    """Write the manifest: key, stats, output fingerprints, and a digest of `digest_files`.

    `passes_on`: the hash later stages key on, where it is not the stage's own key: the
    part of it that what they read depends on (the token store passes on its settings and
    inputs, not its cap: climb.stages.tokenize).

    After a repair (is_done found damaged outputs) the digest is compared with the one
    before: where the stage did not reproduce what it had (k-means on a GPU, say), the
    new digest becomes the manifest's `content`, which later stages key on, so they
    run again instead of mixing old and new results.
    """
    stats = dict(stats, seconds=round(time.time() - started, 3))
    folder = paths.root / stage
    files_digest = _files_digest(folder, digest_files)
    state = read_json(state_file(folder)) if state_file(folder).exists() else {}
    content = None
    if "repairing" in state:
        before = state["repairing"]
        content = before.get("content") if files_digest == before.get("digest") else files_digest
        if content != before.get("content"):
            log.warning("%s: the re-created outputs differ from the previous ones; later stages run again", stage)
        write_json(state_file(folder), {"hash": key, "resume": state.get("resume")})
    # `hash` is what later stages key on; `key` what this stage's next run matches (equal
    # but in an upgraded older run folder, see upgrade, or where the stage passes on less).
    manifest = {"stage": stage, "hash": passes_on or key, "key": key, "resume": state.get("resume"), "stats": stats,
                "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "digest": files_digest,
                "outputs": output_fingerprints(folder)}
    if content:
        manifest["content"] = content
    write_json(paths.manifest(stage), manifest)
    log.info("%s done in %.1fs", stage, stats["seconds"])
    return stats


def execute(paths: RunPaths, stage: str, key: str, body: Callable[[Path, Any], dict], *, executor=None,
            processes: int = 1, keep: tuple[str, ...] = (), cascade: dict[str, str] | None = None,
            keep_on_change: bool = False, digest_files: tuple[str, ...] = (), keep_dirs: tuple[str, ...] = (),
            legacy_key: str | tuple[str, ...] | None = None, resume_key: str | None = None,
            passes_on: str | None = None) -> dict:
    """What every stage does around its own work: skip it if it finished with this key and
    its outputs are intact; otherwise begin (or resume) it, run `body(folder, executor)`
    (the executor of `executor`, an ExecutorConfig, with `processes` local workers; None
    without one), and write the manifest from the stats it returns.

    `keep`, `cascade` and `legacy_key` (see is_done), `keep_on_change`, `keep_dirs` and
    `resume_key` (see begin) and `digest_files` and `passes_on` (see finish) are the
    stage's own rules for repairs and changes.
    """
    if is_done(paths, stage, key, keep, cascade, legacy_key):
        return skipped(paths, stage)
    started = time.time()
    folder = begin(paths, stage, key, keep_on_change, keep_dirs, resume_key)
    if executor is None:
        stats = body(folder, None)
    else:
        from climb.runtime.executor import make_executor
        with make_executor(executor, processes) as ex:
            stats = body(folder, ex)
    return finish(paths, stage, key, stats, started, digest_files, passes_on)


def skipped(paths: RunPaths, stage: str) -> dict:
    log.info("%s: up to date, skipped (delete %s to force)", stage, paths.manifest(stage))
    return dict(read_json(paths.manifest(stage))["stats"], skipped_stage=True)
