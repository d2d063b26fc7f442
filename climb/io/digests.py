"""Inputs and outputs identified by what they contain, not where they lie or when they were touched.

A run's stage keys take each input's *content* (`content_fingerprint`: the shard's name,
its size and a SHA-256 of its bytes for a local file; for a URL its size and the store's
content tag, ETag or checksum) and no absolute path or modification time, so a corpus
copied without its times, mounted elsewhere or downloaded again with the same bytes
keys as before, and a run folder copied with plain `cp -r` or moved skips every stage.

Reading a large corpus to hash it would cost as much as a stage if it were done each
time, so digests are cached (`DigestCache`, `<run>/.climb/digests.json`) by path, size,
modification time and inode: an unchanged file is not read again; a file whose times
alone changed is read once more and found the same.

    from climb.io.digests import DigestCache, content_fingerprint
    cache = DigestCache(run_dir / ".climb" / "digests.json")
    key_part = content_fingerprint(files, cache)
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path

CHUNK = 8 << 20


def file_digest(path: str | Path) -> str:
    """SHA-256 of a local file's bytes, read in 8 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class DigestCache:
    """Content digests of local files, kept by (path, size, mtime_ns, inode) in a JSON file."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        self.read = 0  # bytes hashed by this cache (what a hit saves)
        try:
            self.entries: dict[str, list] = json.loads(self.path.read_text()) if self.path else {}
        except (OSError, ValueError):
            self.entries = {}
        self._dirty = False

    def digest(self, path: str | Path) -> str:
        p = str(Path(path).resolve())
        st = os.stat(p)
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        with self._lock:
            hit = self.entries.get(p)
            if hit and hit[:3] == stamp:
                return hit[3]
        d = file_digest(p)
        with self._lock:
            self.entries[p] = stamp + [d]
            self.read += st.st_size
            self._dirty = True
        return d

    def save(self) -> None:
        """Write the cache (whole or not at all); a cache that cannot be written is only slower."""
        if not self.path or not self._dirty:
            return
        from climb.io.files import atomic_path
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(self.path) as tmp:
                Path(tmp).write_text(json.dumps(self.entries))
            self._dirty = False
        except OSError:
            pass


def content_fingerprint(paths: Sequence[str | Path], cache: DigestCache | None = None) -> list[list]:
    """What a stage key takes from its inputs: per local file [name, size, sha256]; per URL
    [name, size, the store's content tag] (its ETag, checksum or blob id; a time where the
    store gives none). No folder, URL prefix or modification time enters."""
    from climb.io.files import file_name, is_url
    cache = cache or DigestCache(None)
    out = []
    for p in paths:
        if is_url(p):
            from climb.io.remote import info, tag
            out.append([file_name(p), *tag(info(str(p)))])
            continue
        out.append([file_name(p), os.stat(p).st_size, cache.digest(p)])
    cache.save()
    return out
