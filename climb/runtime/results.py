"""The proxy records of a search: `search/results.jsonl`, append-only, one JSON object a line.

Nothing lost, nothing doubled:
- each record is written with one `write` to a file opened for appending, then
  fsync'ed; if the write fails part-way (a full disk, an interrupt) the file is
  cut back to where the record began;
- before anything is appended, a file that does not end in a newline (a process
  killed mid-write) is repaired: lines that are not complete JSON objects are
  moved to `results.rejected.jsonl` beside it, never built upon;
- records are strict JSON: NaN and infinities are written as null (the record's
  `status` says whether it counts);
- reading keeps the last record of each (mixture id, seed): a failed proxy that
  a resumed search trained again is counted once, with its new result.

    from climb.runtime import results
    results.append(path, record)
    recs = results.load(path)
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from climb.io.files import InputError, atomic_path, strict_json

log = logging.getLogger(__name__)


class ProxyFailures(InputError):
    """Too few proxies succeeded to go on; the message quotes the first failure."""


def _record(raw: bytes) -> dict | None:
    try:
        rec = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) and "mixture_id" in rec else None


def _parse(lines: list[bytes]) -> tuple[list[dict], list[bytes]]:
    """Complete records, and the pieces of lines that are not one."""
    good, bad = [], []
    for raw in lines:
        if not raw.strip():
            continue
        rec = _record(raw)
        if rec is None:
            # A record appended onto a cut line (as older versions did) is still whole
            # after the fragment: keep it, set the fragment aside.
            start = raw.rfind(b'{"mixture_id"', 1)
            rec = _record(raw[start:]) if start > 0 else None
            bad.append(raw[:start] if rec is not None else raw)
        if rec is not None:
            good.append(rec)
    return good, bad


def load(path: Path, warn: bool = True) -> list[dict]:
    """Every complete record, the last one per (mixture id, seed), in file order. `warn=False`
    for a reader beside the writer (a line still being appended is left for the next read)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    good, bad = _parse(data.split(b"\n"))
    if bad and warn:
        log.warning("%s: %d line(s) are not complete records (a write was cut short); they are left out "
                    "and set aside on the next search run", path, len(bad))
    last: dict[tuple, int] = {}
    for i, rec in enumerate(good):
        last[(rec["mixture_id"], rec.get("seed"))] = i
    return [good[i] for i in sorted(last.values())]


def proxy_records(paths) -> list[tuple[str, dict]]:
    """(purpose, record) of every proxy a run folder (RunPaths) records: the search's log, its
    experts, replicate, one-shot and comparison files, and the validation's log; the last record per
    (mixture id, seed). Read as they are, also while a stage is writing them."""
    out = [("search", r) for r in load(paths.search.results, warn=False)]
    for purpose, file in (("base", paths.search.base), ("merge", paths.search.merge),
                          ("experts", paths.search.experts), ("replicate", paths.search.replicates), ("finalists", paths.search.finalists),
                          ("one-shot", paths.search.one_shot), ("comparison", paths.search.comparison)):
        try:
            data = json.loads(Path(file).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            data = data.get("records", data) if purpose == "finalists" else data
            out += [(purpose, r) for r in data.values() if isinstance(r, dict) and "mixture_id" in r]
    return out + [("validation", r) for r in load(paths.validate.results, warn=False)]


def repair(path: Path) -> int:
    """Move lines that are not complete records to `<name>.rejected.jsonl`; returns how many moved."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    lines = data.split(b"\n")
    good, bad = _parse(lines)
    if not bad and (not data or data.endswith(b"\n")):
        return 0
    rejected = path.with_name(path.stem + ".rejected.jsonl")
    with open(rejected, "ab") as fh:
        for raw in bad:
            fh.write(raw.rstrip(b"\n") + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            fh.write(b"".join(strict_json(r).encode() + b"\n" for r in good))
            fh.flush()
            os.fsync(fh.fileno())
    log.warning("%s: %d incomplete line(s) (a write cut short) moved to %s; the proxies they stood for "
                "are trained again", path, len(bad), rejected)
    return len(bad)


def _ends_cleanly(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size == 0 or os.pread(fd, 1, size - 1) == b"\n"


def append(path: Path, rec: dict) -> None:
    """Append one record durably; a failed write leaves the file as it was."""
    path = Path(path)
    line = (strict_json(rec) + "\n").encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        if not _ends_cleanly(fd):
            os.close(fd)
            fd = -1
            repair(path)
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        start = os.fstat(fd).st_size
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass  # the next append repairs the tail instead
            raise
    finally:
        if fd >= 0:
            os.close(fd)


def retry(rec: dict | None, retry_failed: bool) -> bool:
    """Whether a proxy with this record (None: none yet) is to be trained."""
    return rec is None or (retry_failed and rec.get("status") != "ok")


def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def require_successes(records: list[dict], need: int, what: str = "proxies") -> None:
    """Stop, with the first failure's message, when fewer than `need` records succeeded."""
    ok = [r for r in records if r.get("status") == "ok"]
    if len(ok) >= need:
        return
    failed = [r for r in records if r.get("status") != "ok"]
    first = (f"; the first failure ({failed[0]['mixture_id']}): {one_line(failed[0].get('error', '?'))}"
             if failed else "")
    raise ProxyFailures(f"only {len(ok)} of {len(records)} {what} succeeded ({need} needed){first}. Fix the "
                        "cause and run the same command again: failed proxies are trained again")
