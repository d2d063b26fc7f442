"""Write a file atomically: readers see the old file or the whole new one, never part of it.

``atomic_path(path)`` yields a temporary path in the same folder (a hidden
``.NAME.XXXX.tmp``); when the block succeeds the temporary file is made readable
by everyone (0644), fsync'ed and renamed over ``path`` with ``os.replace``; when
it raises, the temporary file is removed and ``path`` is left as it was. Used by
the proxies package and, through ``climb.io.files.atomic_path``, by climb. Standard
library only (importing it loads no torch).

Usage::

    from proxies.atomic import atomic_path
    with atomic_path("runs/x/index.json") as tmp:
        tmp.write_text(text)

Tested by ``pytest tests/test_io.py``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; fsync it and rename it into place on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:  # name the file meant, not the temporary one
        raise type(e)(e.errno, e.strerror, str(path)) from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes files private; outputs are meant to be shared
        _fsync(tmp)  # the data is on disk before the name points at it
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
