"""Map independent stage tasks in-process or on Dask.

Tasks are small picklable arguments (file paths, small configs); each task
writes its own output files, so a crashed or killed task is simply re-run.
Results come back in task order whatever order they finish in; `on_result`
sees each task's result once, as it arrives.

    from climb.runtime.executor import make_executor
    with make_executor(cfg.executor) as ex:
        stats = ex.map(embed_shard, tasks, desc="embed", resources={"GPU": 1})

Backends (`[executor]` in the run config, or `--executor/--dask-workers/--dask-address`):
- `LocalExecutor`: one task after another in this process (the default).
- `DaskExecutor` with `dask_address = ""`: a `LocalCluster` of `dask_workers`
  worker processes with `dask_threads_per_worker` threads each. It is started
  once per process and shared by every stage of a run (workers keep their
  loaded models and token stores); it is closed at exit or by `shutdown()`.
- `DaskExecutor` with `dask_address = "tcp://host:8786"` (or the path of a
  scheduler file, `*.json`): an existing scheduler and its workers, which must
  see the same files at the same paths.
Opening, sharing and closing that client and cluster is `climb.runtime.dask_client`'s
`DaskSession`; `DaskExecutor` maps tasks on it.

A task asks for `resources={"GPU": 1}` only when some worker advertises a `GPU`
resource (`dask worker --resources GPU=1`); without one it runs anywhere. If
every worker holding the resource goes away mid-stage, the waiting tasks are
resubmitted without it after `dask_resource_grace_s` seconds (default 120), so
the stage finishes on the remaining workers instead of hanging.

Dask settings in `[executor]` (all optional), each overridden by its environment
variable when that is set:
- `dask_dashboard` (`CLIMB_DASK_DASHBOARD`): dashboard address of the local
  cluster, e.g. `:8787` (off by default; needs `bokeh`, see the `dask` extra).
- `dask_memory_limit` (`CLIMB_DASK_MEMORY_LIMIT`): memory limit per local worker,
  e.g. `8GiB` (default: RAM / workers).
- `dask_reuse` (`CLIMB_DASK_REUSE=0` turns it off): share one local cluster between
  stages; off, a local cluster is started and closed per stage.
- `dask_connect_timeout_s` (`CLIMB_DASK_CONNECT_TIMEOUT_S`): seconds to wait for the
  scheduler at `dask_address` (default 30).
- `dask_resource_grace_s` (`CLIMB_DASK_RESOURCE_GRACE_S`): see above.
A `DaskExecutor` made in code takes the same settings as arguments; one left at
None is the environment variable's value, or the `ExecutorConfig` default.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from climb.config import ExecutorConfig
from climb.runtime.dask_client import DaskSession, shutdown  # noqa: F401  (shutdown: climb.runtime.executor.shutdown)

log = logging.getLogger(__name__)


class LocalExecutor:
    """Tasks one after another in this process; or, for maps that ask for it (`parallel=True`,
    the proxy runs), in `processes` worker processes with one torch thread each."""
    kind = "local"

    def __init__(self, processes: int = 1):
        self.processes = max(1, int(processes))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def slots(self, resources: dict | None = None) -> int:
        """How many tasks of a parallel map run at once."""
        return self.processes

    def map(self, fn: Callable, tasks: Sequence[Any], desc: str = "", resources: dict | None = None,
            on_result: Callable[[int, Any], None] | None = None, parallel: bool = False,
            fresh_every: int = 0) -> list:
        """`fresh_every` > 0 (a serial map): more tasks than that run in a child process replaced
        after every `fresh_every` of them (climb.runtime.workers.fresh_map), fewer in this one."""
        if parallel and self.processes > 1 and len(tasks) > 1:
            from climb.runtime.workers import pool_map
            return pool_map(fn, tasks, self.processes, desc=desc, on_result=on_result)
        if not parallel and 0 < fresh_every < len(tasks):
            from climb.runtime.workers import fresh_map
            return fresh_map(fn, tasks, fresh_every, desc=desc, on_result=on_result)
        out = []
        for i, t in enumerate(tqdm(tasks, desc=desc, disable=len(tasks) < 2, leave=False)):
            r = fn(t)
            if on_result is not None:
                on_result(i, r)
            out.append(r)
        return out


# ExecutorConfig field -> the environment variable that overrides it when set.
ENV = {"dask_dashboard": "CLIMB_DASK_DASHBOARD", "dask_memory_limit": "CLIMB_DASK_MEMORY_LIMIT",
       "dask_reuse": "CLIMB_DASK_REUSE", "dask_connect_timeout_s": "CLIMB_DASK_CONNECT_TIMEOUT_S",
       "dask_resource_grace_s": "CLIMB_DASK_RESOURCE_GRACE_S"}


def dask_setting(name: str, value: Any) -> Any:
    """An `[executor]` Dask setting: its environment variable when set, else `value`."""
    raw = os.environ.get(ENV[name])
    if raw is None:
        return value
    if isinstance(value, bool):
        return raw != "0"
    if isinstance(value, float):
        try:
            return float(raw)
        except ValueError:
            log.warning("%s=%r is not a number; using executor.%s = %s", ENV[name], raw, name, value)
            return value
    return raw


def _session_attribute(name: str) -> property:
    """An attribute of the executor's `DaskSession`, read and set on the executor."""
    return property(lambda self: getattr(self.session, name),
                    lambda self, value: setattr(self.session, name, value),
                    doc=f"The session's `{name}`.")


class DaskExecutor:
    """Maps tasks on the client of a `DaskSession` (opened on entering, let go on leaving)."""
    kind = "dask"

    def __init__(self, address: str = "", workers: int = 2, threads_per_worker: int = 1,
                 reuse: bool | None = None, dashboard: str | None = None, memory_limit: str | None = None,
                 connect_timeout_s: float | None = None, resource_grace_s: float | None = None):
        given = {"dask_reuse": reuse, "dask_dashboard": dashboard, "dask_memory_limit": memory_limit,
                 "dask_connect_timeout_s": connect_timeout_s, "dask_resource_grace_s": resource_grace_s}
        default = ExecutorConfig()
        s = {k: dask_setting(k, getattr(default, k)) if v is None else v for k, v in given.items()}
        self.session = DaskSession(address, workers, threads_per_worker, reuse=s["dask_reuse"],
                                   dashboard=s["dask_dashboard"], memory_limit=s["dask_memory_limit"],
                                   connect_timeout_s=s["dask_connect_timeout_s"])
        self.resource_grace_s = s["dask_resource_grace_s"]

    address = _session_attribute("address")
    workers = _session_attribute("workers")
    threads = _session_attribute("threads")
    reuse = _session_attribute("reuse")
    dashboard = _session_attribute("dashboard")
    memory_limit = _session_attribute("memory_limit")
    connect_timeout_s = _session_attribute("connect_timeout_s")
    client = _session_attribute("client")  # None outside the `with` block
    cluster = _session_attribute("cluster")  # the local cluster, None on an existing scheduler

    def __enter__(self):
        self.session.open()
        return self

    def __exit__(self, *exc):
        self.session.close()
        return False

    def slots(self, resources: dict | None = None) -> int:
        """How many tasks run at once: the workers (holding the resources, if any hold them) times their threads."""
        workers = self.session.workers_with(self.session.advertised(resources))
        return max(1, sum(w.get("nthreads", 1) for w in workers))

    def map(self, fn: Callable, tasks: Sequence[Any], desc: str = "", resources: dict | None = None,
            on_result: Callable[[int, Any], None] | None = None, parallel: bool = True,
            fresh_every: int = 0) -> list:
        # fresh_every is the local executor's; a Dask worker's memory is held by its memory_limit.
        from distributed import as_completed
        from distributed.scheduler import KilledWorker
        tasks = list(tasks)
        if not tasks:
            return []
        want = self.session.advertised(resources)
        futures = self.client.map(fn, tasks, pure=False, resources=want)
        live = {f.key: (i, f) for i, f in enumerate(futures)}  # key -> (task index, future)
        out: list = [None] * len(tasks)
        ac = as_completed(futures, loop=self.client.loop)
        holders = _ResourceHolders(self.session, want, self.resource_grace_s, desc or fn.__name__)
        bar = tqdm(total=len(tasks), desc=desc, leave=False, disable=len(tasks) < 2)
        try:
            while live:
                if want is None:
                    batch = ac.next_batch(block=True)
                else:
                    batch = ac.next_batch(block=False)
                    if not batch:
                        time.sleep(0.2)
                        if holders.gone_for_grace():
                            self._resubmit_anywhere(fn, tasks, live, ac)
                            want = None
                        continue
                for fut in batch:
                    got = live.pop(fut.key, None)
                    if got is None:  # a future replaced by a resubmission
                        continue
                    i = got[0]
                    try:
                        out[i] = fut.result()
                    except KilledWorker as e:
                        raise RuntimeError(
                            f"{desc or fn.__name__}: task {i} was running on a worker that died each of "
                            f"the allowed times (out of memory? raise the workers' memory limit or lower "
                            f"the batch size): {e}") from e
                    bar.update(1)
                    if on_result is not None:
                        on_result(i, out[i])
        finally:
            bar.close()
            if live:  # an error or an interrupt: nothing left running for a map nobody waits on
                self.client.cancel([f for _, f in live.values()])
        return out

    def _resubmit_anywhere(self, fn: Callable, tasks: list, live: dict, ac) -> None:
        """Replace the waiting futures with ones that need no resource (finished ones are kept)."""
        old = sorted(((i, f) for i, f in live.values() if f.status == "pending"), key=lambda x: x[0])
        idx = [i for i, _ in old]
        log.warning("resubmitting %d tasks of %s without resource constraints", len(idx), fn.__name__)
        for _, f in old:
            live.pop(f.key)
        self.client.cancel([f for _, f in old])
        new = self.client.map(fn, [tasks[i] for i in idx], pure=False)
        for i, f in zip(idx, new):
            live[f.key] = (i, f)
            ac.add(f)


class _ResourceHolders:
    """Watches, while a map's tasks wait for some resources, whether any worker still holds them."""

    def __init__(self, session: DaskSession, resources: dict | None, grace_s: float, what: str):
        self.session, self.resources, self.grace_s, self.what = session, resources, grace_s, what
        self.missing_since: float | None = None
        self.next_check = 0.0

    def gone_for_grace(self) -> bool:
        """True once no worker has held the resources for the grace period; the scheduler is asked
        at most every min(5 s, grace / 4)."""
        if time.monotonic() < self.next_check:
            return False
        self.next_check = time.monotonic() + min(5.0, self.grace_s / 4)
        if self.session.workers_with(self.resources):
            self.missing_since = None
        elif self.missing_since is None:
            self.missing_since = time.monotonic()
            log.warning("%s: no worker with resources %s is left; the remaining tasks "
                        "run anywhere in %.0fs unless one joins", self.what, self.resources, self.grace_s)
        elif time.monotonic() - self.missing_since >= self.grace_s:
            return True
        return False


def make_executor(cfg, processes: int = 1) -> LocalExecutor | DaskExecutor:
    """The executor of a stage; `processes` sizes the local process pool of parallel maps."""
    if cfg.kind == "dask" or cfg.dask_address:
        s = {k: dask_setting(k, getattr(cfg, k)) for k in ENV}
        return DaskExecutor(cfg.dask_address, cfg.dask_workers, cfg.dask_threads_per_worker,
                            reuse=s["dask_reuse"], dashboard=s["dask_dashboard"],
                            memory_limit=s["dask_memory_limit"], connect_timeout_s=s["dask_connect_timeout_s"],
                            resource_grace_s=s["dask_resource_grace_s"])
    return LocalExecutor(processes)
