"""The export's destination: a folder or an object store URL (`export.destination`).

An object store has no atomic rename, so every object is written under a staging key
and moved into place whole (climb.io.remote); the blend files go last, once every shard
they name is in place. `<run>/export/destination.json` keeps the size and tag of every
object written, so one deleted or changed since is found (`damaged_destination`), and
objects an earlier export to the same destination wrote and this one did not are
deleted; nothing else there is touched.
"""
from __future__ import annotations

from pathlib import Path

from climb.config import RunConfig
from climb.io.files import InputError, file_stamp, is_url, join, local_path, read_json, write_json, write_text
from climb.runtime.layout import RunPaths
from climb.stages.export import megatron as export_megatron
from climb.stages.export import units as export_units


def destination(cfg: RunConfig, paths: RunPaths) -> str | None:
    """Where the dataset goes when not to <run>/export: a URL, or an absolute folder."""
    d = cfg.export.destination.replace("{run}", str(paths.root)).rstrip("/")
    if not d:
        return None
    return d if is_url(d) else str(local_path(d).resolve())


def check_destination(cfg: RunConfig, paths: RunPaths) -> None:
    """Fail before any stage runs where the destination cannot work (no package, no bucket, no access)
    or export.tokenizer cannot be loaded."""
    export_units.check(cfg.export.tokenizer)
    export_megatron.check_ready(cfg.export.tokenizer, cfg.export.format)
    if export_megatron.wants(cfg.export.format, "megatron"):
        export_units.load(cfg.export.tokenizer).eod_id(cfg.export.eod)
    dest = destination(cfg, paths)
    if dest and is_url(dest):
        from climb.io.remote import check_destination as check
        check(dest)


def _listing(dest: str) -> dict[str, list]:
    """{path relative to dest: [size, tag]} of what is there now (local: size and mtime_ns)."""
    if is_url(dest):
        from climb.io.remote import listing
        return listing(dest)
    root = Path(dest)
    return {p.relative_to(root).as_posix(): file_stamp(p)
            for p in root.rglob("*") if p.is_file() and not any(
                s.startswith(".") for s in p.relative_to(root).parts)} if root.is_dir() else {}


def _remove(target: str) -> None:
    if is_url(target):
        from climb.io.remote import remove
        remove(target)
    else:
        Path(target).unlink(missing_ok=True)


def damaged_destination(paths: RunPaths) -> list[str]:
    """Objects an export wrote to its destination that are missing or changed since."""
    rec = paths.export.destination
    if not rec.exists():
        return []
    written = read_json(rec)
    now = _listing(written["destination"])
    return [join(written["destination"], rel) for rel, fp in written["files"].items() if now.get(rel) != fp]


def _previous_outputs(paths: RunPaths, dest: str | None) -> list[str]:
    """What an earlier export wrote to this destination (read before `begin` clears the folder)."""
    rec = paths.export.destination
    try:
        written = read_json(rec) if dest and rec.exists() else {}
    except ValueError:
        return []
    return list(written.get("files", {})) if written.get("destination") == dest else []


def _publish(paths: RunPaths, dest: str, previous: list[str], blends: dict[str, str], shards: list[str]) -> None:
    """The blend files to the destination, after every shard they name is in place; then
    what a previous export there wrote and this one did not goes, and what is there now
    is recorded in <run>/export/destination.json."""
    for name, text in blends.items():
        write_text(join(dest, name), text, staging=dest if is_url(dest) else None)
    ours = set(shards) | set(blends)
    for rel in sorted(set(previous) - ours):
        _remove(join(dest, rel))
    now = _listing(dest)
    missing = sorted(ours - set(now))
    if missing:
        raise InputError(f"{join(dest, missing[0])} is not there right after it was written; is something else "
                         "writing to export.destination?")
    write_json(paths.export.destination,
               {"destination": dest, "files": {rel: now[rel] for rel in sorted(ours)}})
