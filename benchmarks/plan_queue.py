"""A long measurement as a plan that outlives the shell it started in.

A plan (`benchmarks/plans/NAME.plan`) lists named items, one per line, `name: command`, in the
order they should start; a line starting with `#` is a comment. The queue runs them in `--lanes` parallel lanes
(one core each is the sane setting on a small machine), and keeps its state beside the runs, in
`runs/.queue/NAME/`:

    <item>.claim   who runs it now (pid and boot id); removed when it ends
    <item>.done    it ended with status 0 (the time and the seconds it took)
    <item>.failed  it ended with another status (rerun on the queue's next start)
    <item>.log     its output

    python benchmarks/plan_queue.py run benchmarks/plans/bench_long.plan --lanes 2   # start or go on
    python benchmarks/plan_queue.py status benchmarks/plans/bench_long.plan          # what is where

Starting the queue again goes on where it stopped: done items are skipped, claims left by a
process that is gone (killed, or a machine that has rebooted since) are taken over, and each item
resumes as its own command does (the benchmark drivers resume run folder by run folder, proxy by
proxy). On a new machine, which keeps the repository's committed records and not `runs/`, the queue
starts from the plan's first item again: each driver then skips what its records hold, rebuilds
the base folders it needs, and trains only what no record has. Two queues on one plan share the work through the claims instead of repeating it, and `--lanes`
bounds the items of the plan running at once, whoever started them: an item already running
(a claim whose process is alive) holds a lane.
An item's command runs with `bash -c` at the repository root, offline (HF_HUB_OFFLINE=1), with
the machine's cores shared among the lanes for torch's threads (OMP_NUM_THREADS, unless set).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import OFFLINE, ROOT  # noqa: F401  (ROOT on sys.path first)

STATE = ROOT / "runs" / ".queue"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def parse(plan: Path) -> list[tuple[str, str]]:
    """The plan's items in order; a clear error on a malformed line or a repeated name."""
    items, seen = [], set()
    for n, line in enumerate(plan.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, cmd = line.partition(":")
        name, cmd = name.strip(), cmd.strip()
        if not sep or not NAME.match(name) or not cmd:
            raise SystemExit(f"{plan}:{n}: expected `name: command` (name of letters, digits, _.+-), got {line!r}")
        if name in seen:
            raise SystemExit(f"{plan}:{n}: item {name!r} is named twice")
        seen.add(name)
        items.append((name, cmd))
    return items


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _alive(claim: dict) -> bool:
    if claim.get("boot_id") != _boot_id():
        return False
    for key in ("pid", "child"):  # the queue, or the item it started (which may outlive a killed queue)
        try:
            os.kill(int(claim[key]), 0)
            return True
        except (OSError, KeyError, ValueError, TypeError):
            pass
    return False


def item_env(lanes: int) -> dict:
    """An item's environment: offline, and its share of the cores for torch's and BLAS's threads
    (the machine's cores over the lanes), unless the caller set them. An item that trains proxies in
    its own process would otherwise take a thread per core in every lane, and the lanes' threads
    wait on each other."""
    threads = str(max(1, (os.cpu_count() or 1) // max(1, lanes)))
    return {**os.environ, **OFFLINE, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads),
            "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS", threads)}


class Queue:
    def __init__(self, plan: Path, state: Path | None = None):
        self.plan, self.items = plan, parse(plan)
        self.dir = (state or STATE) / plan.stem
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()

    def path(self, name: str, kind: str) -> Path:
        return self.dir / f"{name}.{kind}"

    def state(self, name: str) -> str:
        if self.path(name, "done").exists():
            return "done"
        c = self.path(name, "claim")
        if c.exists():
            try:
                return "running" if _alive(json.loads(c.read_text())) else "stale"
            except (OSError, ValueError):
                return "stale"
        return "failed" if self.path(name, "failed").exists() else "waiting"

    def claim(self, name: str) -> bool:
        """Take `name` if nobody alive holds it and it is not done (atomic across processes)."""
        c = self.path(name, "claim")
        with self.lock:
            if self.state(name) in ("done", "running"):
                return False
            if self.state(name) == "stale":
                c.unlink(missing_ok=True)
            try:
                fd = os.open(c, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                json.dump({"pid": os.getpid(), "boot_id": _boot_id(), "since": time.strftime("%F %T")}, f)
            return True

    def run_item(self, name: str, cmd: str, lane: int) -> int:
        self.path(name, "failed").unlink(missing_ok=True)
        say(f"lane {lane}: start {name}")
        t0 = time.time()
        with open(self.path(name, "log"), "a") as log:
            log.write(f"# {time.strftime('%F %T')} {cmd}\n")
            log.flush()
            child = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                     env=item_env(self.lanes))
            c = self.path(name, "claim")
            c.write_text(json.dumps(dict(json.loads(c.read_text()), child=child.pid)))
            rc = child.wait()
        took = round(time.time() - t0, 1)
        if rc == 0:
            self.path(name, "done").write_text(json.dumps({"finished": time.strftime("%F %T"), "seconds": took}))
        else:
            self.path(name, "failed").write_text(json.dumps({"finished": time.strftime("%F %T"), "rc": rc}))
        self.path(name, "claim").unlink(missing_ok=True)
        say(f"lane {lane}: {'done' if rc == 0 else f'FAILED (status {rc})'} {name} after {took / 60:.1f} min"
            f" (log {self.path(name, 'log')})")
        return rc

    def lane(self, lane: int, failed: list) -> None:
        tried = self.tried  # an item this queue has started is not started by it again (a failure waits)
        while True:
            with self.lock:
                full = sum(self.state(n) == "running" for n, _ in self.items) >= self.lanes
                got = None if full else next(((n, c) for n, c in self.items if n not in tried and self.claim(n)),
                                             None)
            if full:  # the plan's lanes are held (by another queue on it, or by items started by hand)
                time.sleep(self.poll)
                continue
            if got is None:
                return
            name, cmd = got
            tried.add(name)
            if self.run_item(name, cmd, lane) != 0:
                failed.append(name)

    def run(self, lanes: int, poll: float = 30.0) -> int:
        self.lanes, self.poll, self.tried = lanes, poll, set()
        failed: list[str] = []
        threads = [threading.Thread(target=self.lane, args=(i + 1, failed)) for i in range(lanes)]
        for t in threads:
            t.start()
            time.sleep(0.2)
        for t in threads:
            t.join()
        left = [n for n, _ in self.items if self.state(n) != "done"]
        say(f"queue {self.plan.stem}: {len(self.items) - len(left)} of {len(self.items)} done"
            + (f"; failed: {', '.join(failed)}" if failed else "")
            + (f"; left: {', '.join(left)}" if left else ""))
        return 1 if failed else 0

    def status(self) -> list[dict]:
        rows = []
        for name, _ in self.items:
            row = {"item": name, "state": self.state(name)}
            if row["state"] == "done":
                row.update(json.loads(self.path(name, "done").read_text()))
            log = self.path(name, "log")
            if row["state"] in ("running", "failed", "stale") and log.exists():
                lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
                row["last"] = lines[-1][:160] if lines else ""
            rows.append(row)
        return rows


def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {msg}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verb", choices=["run", "status"])
    ap.add_argument("plan", type=Path)
    ap.add_argument("--lanes", type=int, default=1, help="items run at once (default 1)")
    ap.add_argument("--state", type=Path, default=None, help="state folder (default runs/.queue)")
    a = ap.parse_args(argv)
    if not a.plan.exists():
        raise SystemExit(f"no plan at {a.plan}")
    if a.lanes < 1:
        raise SystemExit("--lanes must be at least 1")
    q = Queue(a.plan, a.state)
    if a.verb == "status":
        for r in q.status():
            extra = (f" {r['seconds'] / 60:.0f} min, {r['finished']}" if r["state"] == "done"
                     else f"  {r['last']}" if r.get("last") else "")
            print(f"{r['state']:8} {r['item']}{extra}")
        return 0
    return q.run(a.lanes)


if __name__ == "__main__":
    sys.exit(main())
