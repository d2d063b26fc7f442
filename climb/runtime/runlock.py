"""One process at a time per run folder.

Two processes writing one run folder double token stores and results, so the
process that drives a run holds an exclusive lock on `<run>/.climb.lock` (an
OS file lock through `filelock`: the kernel drops it when its holder exits,
however it exits). Beside it, `<run>/.climb.lock.json` names the holder (PID,
host, command, start). A second process is refused with `RunLocked`, one line
naming the holder. A lock left by a process that died is free again: the next
run takes it over and says whose it was.

Only the driving process (the Dask client) takes the lock; stage tasks on Dask
workers write inside the folder on its behalf and never touch the lock. Nested
holds in one process (the CLI around `pipeline.run_stage`) share one lock.

    from climb.runtime.runlock import hold
    with hold(run_dir):
        ...
"""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from climb.io.files import InputError, write_json

log = logging.getLogger(__name__)
LOCK_NAME = ".climb.lock"
INFO_NAME = ".climb.lock.json"
_HELD: dict[Path, list] = {}  # run folder -> [FileLock or None, depth]
_GUARD = threading.Lock()


class RunLocked(InputError):
    """Another process holds the run folder."""


def holder(root: Path) -> dict | None:
    """Who holds (or last held) the lock of a run folder, as it wrote it."""
    try:
        return json.loads((Path(root) / INFO_NAME).read_text())
    except (OSError, ValueError):
        return None


def _who(info: dict | None) -> str:
    if not info:
        return "another process"
    return (f"PID {info.get('pid')} on host {info.get('host')} (since {info.get('started')}: "
            f"{info.get('command', '?')})")


def _command(limit: int = 100) -> str:
    """What is running, short enough for a one-line message."""
    argv0 = sys.argv[0] if sys.argv else ""
    name = "climb" if argv0.endswith(("climb", "cli.py")) else os.path.basename(argv0) or "python"
    text = " ".join([name, *sys.argv[1:]])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _acquire(root: Path):
    """The held FileLock, or None for a folder this process cannot write (nothing will be written)."""
    from filelock import FileLock, Timeout
    lock = FileLock(str(root / LOCK_NAME))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        info = holder(root)
        raise RunLocked(f"run folder {root} is in use by {_who(info)}; wait for it to finish, or stop it "
                        f"(kill {info.get('pid') if info else '<pid>'}) and run again") from None
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            log.debug("run folder %s is read-only (%s): not locked", root, e)
            return None
        raise
    return lock


@contextmanager
def hold(root: str | Path):
    """Hold the run folder's lock for the duration of the block (re-entrant in one process)."""
    root = Path(root).resolve()
    with _GUARD:
        entry = _HELD.get(root)
        if entry is not None:
            entry[1] += 1
    if entry is not None:
        try:
            yield
        finally:
            with _GUARD:
                entry[1] -= 1
        return
    root.mkdir(parents=True, exist_ok=True)
    lock = _acquire(root)
    if lock is not None:
        previous = holder(root)
        if previous and (previous.get("pid"), previous.get("host")) != (os.getpid(), socket.gethostname()):
            log.warning("taking over the lock of %s left by %s, which no longer holds it", root, _who(previous))
        try:
            write_json(root / INFO_NAME, {"pid": os.getpid(), "host": socket.gethostname(),
                                          "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                          "command": _command()})
        except BaseException:
            lock.release()
            raise
    entry = [lock, 1]
    with _GUARD:
        _HELD[root] = entry
    try:
        yield
    finally:
        with _GUARD:
            _HELD.pop(root, None)
        if lock is not None:
            try:
                (root / INFO_NAME).unlink(missing_ok=True)
            finally:
                lock.release()
