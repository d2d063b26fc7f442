"""Map independent stage tasks in-process or on Dask.

Tasks are small picklable arguments (file paths, small configs); each task
writes its own output files, so a crashed or killed task is simply re-run.
Results come back in task order whatever order they finish in; `on_result`
sees each task's result once, as it arrives.

    from climb.executor import make_executor
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

import atexit
import importlib.util
import logging
import os
import threading
import time
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from .config import ExecutorConfig

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
            on_result: Callable[[int, Any], None] | None = None, parallel: bool = False) -> list:
        if parallel and self.processes > 1 and len(tasks) > 1:
            from .workers import pool_map
            return pool_map(fn, tasks, self.processes, desc=desc, on_result=on_result)
        out = []
        for i, t in enumerate(tqdm(tasks, desc=desc, disable=len(tasks) < 2, leave=False)):
            r = fn(t)
            if on_result is not None:
                on_result(i, r)
            out.append(r)
        return out


# One client (and, for a local cluster, the cluster) per key, shared by the
# stages of a run in this process: ("local", workers, threads) or ("address", addr).
_SHARED: dict[tuple, tuple[Any, Any]] = {}
_LOCK = threading.Lock()


def shutdown() -> None:
    """Close every client and local cluster this process started (also run at exit)."""
    with _LOCK:
        items = list(_SHARED.values())
        _SHARED.clear()
    for client, cluster in items:
        _close(client, cluster)


def _close(client, cluster) -> None:
    for thing in (client, cluster):
        if thing is None:
            continue
        try:
            thing.close()
        except Exception as e:  # closing is best effort (e.g. at interpreter exit)
            log.debug("closing %r: %s", thing, e)


_ATEXIT = False


def _register_shutdown() -> None:
    # Registered after distributed is imported, so it runs before distributed's own
    # exit hooks (atexit is last in, first out): clients close before their clusters.
    global _ATEXIT
    if not _ATEXIT:
        atexit.register(shutdown)
        _ATEXIT = True


def _alive(client, cluster) -> bool:
    if getattr(client, "status", "") != "running":
        return False
    if cluster is None:
        return True
    return getattr(getattr(cluster, "status", None), "name", "") == "running"


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


class DaskExecutor:
    kind = "dask"

    def __init__(self, address: str = "", workers: int = 2, threads_per_worker: int = 1,
                 reuse: bool | None = None, dashboard: str | None = None, memory_limit: str | None = None,
                 connect_timeout_s: float | None = None, resource_grace_s: float | None = None):
        self.address, self.workers, self.threads = address, workers, threads_per_worker
        given = {"dask_reuse": reuse, "dask_dashboard": dashboard, "dask_memory_limit": memory_limit,
                 "dask_connect_timeout_s": connect_timeout_s, "dask_resource_grace_s": resource_grace_s}
        default = ExecutorConfig()
        s = {k: dask_setting(k, getattr(default, k)) if v is None else v for k, v in given.items()}
        self.reuse, self.dashboard, self.memory_limit = s["dask_reuse"], s["dask_dashboard"], s["dask_memory_limit"]
        self.connect_timeout_s, self.resource_grace_s = s["dask_connect_timeout_s"], s["dask_resource_grace_s"]
        self.client = self.cluster = None
        self._own = False  # True when this executor must close what it opened

    # ------------------------------------------------------------ lifecycle
    def _key(self) -> tuple:
        return ("address", self.address) if self.address else ("local", self.workers, self.threads)

    def _open(self):
        from distributed import Client, LocalCluster
        _register_shutdown()
        if self.address:
            from .config import ConfigError
            timeout = self.connect_timeout_s
            try:
                if self.address.endswith(".json"):  # a scheduler file (dask scheduler --scheduler-file)
                    if not os.path.isfile(self.address):
                        raise ConfigError(f"Dask scheduler file {self.address} not found; start the "
                                          f"scheduler with `dask scheduler --scheduler-file {self.address}`")
                    return Client(scheduler_file=self.address, timeout=timeout, set_as_default=False), None
                return Client(self.address, timeout=timeout, set_as_default=False), None
            except (OSError, TimeoutError) as e:
                raise ConfigError(
                    f"cannot reach the Dask scheduler at {self.address} ({e}); start one with "
                    "`dask scheduler` and workers with `dask worker ADDRESS`, or drop --dask-address "
                    "to use a local cluster") from e
        kwargs: dict = {}
        if self.memory_limit:
            kwargs["memory_limit"] = self.memory_limit
        dash = self.dashboard
        if dash and importlib.util.find_spec("bokeh") is None:
            log.warning("a Dask dashboard is asked for (executor.dask_dashboard or CLIMB_DASK_DASHBOARD) but "
                        "bokeh is not installed: no dashboard (pip install 'bokeh>=3.1', or the climb[dask] extra)")
        import dask
        # Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, which turns off
        # glibc's dynamic mmap threshold: torch then maps and unmaps its activations on
        # every step and a proxy trains much slower than in-process. Keep glibc's defaults.
        # The scheduler always serves a few HTTP routes (health, metrics); without a
        # dashboard they go to a free local port instead of claiming 8787.
        with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
            cluster = LocalCluster(n_workers=self.workers, threads_per_worker=self.threads, processes=True,
                                   dashboard_address=dash or None,
                                   scheduler_kwargs=None if dash else {"dashboard_address": "127.0.0.1:0"},
                                   **kwargs)
        try:
            return Client(cluster, set_as_default=False), cluster
        except BaseException:
            cluster.close()
            raise

    def __enter__(self):
        key = self._key()
        with _LOCK:
            shared = _SHARED.get(key) if self.reuse else None
            if shared is not None and not _alive(*shared):
                _SHARED.pop(key, None)
                _close(*shared)
                shared = None
            if shared is None:
                shared = self._open()
                if self.reuse:
                    _SHARED[key] = shared
                    self._describe(*shared)
            self.client, self.cluster = shared
            self._own = not self.reuse
        if self._own:
            self._describe(self.client, self.cluster)
        return self

    def __exit__(self, *exc):
        if self._own:
            _close(self.client, self.cluster)
        self.client = self.cluster = None
        return False

    def _describe(self, client, cluster) -> None:
        info = client.scheduler_info(n_workers=-1)
        # The scheduler always serves HTTP (health, metrics); the dashboard only when
        # it was asked for and bokeh imports there.
        port = info.get("services", {}).get("dashboard")
        try:
            has_dash = client.run_on_scheduler(
                lambda: "distributed.dashboard.scheduler" in __import__("sys").modules)
        except Exception:
            has_dash = False
        host = client.scheduler.address.split("://")[-1].rsplit(":", 1)[0]
        dash = f"dashboard http://{host}:{port}/status" if port and has_dash else "no dashboard"
        log.info("dask: %s scheduler %s, %d workers (%d threads), %s",
                 "local" if cluster is not None else "existing", client.scheduler.address,
                 len(info["workers"]), sum(w.get("nthreads", 0) for w in info["workers"].values()), dash)
        if cluster is None:
            # Tasks carry paths; a worker started in another folder resolves relative ones elsewhere.
            try:
                cwds = set(client.run(os.getcwd).values())
            except Exception:  # a worker without climb installed etc.: the tasks will say so
                cwds = set()
            if cwds - {os.getcwd()}:
                log.warning("dask workers run in %s but this process in %s: relative paths (a relative "
                            "--run, corpus.paths, target files) point elsewhere there; use absolute paths "
                            "on a filesystem every worker sees", sorted(cwds), os.getcwd())

    # ------------------------------------------------------------ mapping
    def _workers_with(self, resources: dict | None) -> list[dict]:
        """The workers that advertise every resource named (all of them for none)."""
        workers = self.client.scheduler_info(n_workers=-1)["workers"].values()
        return [w for w in workers
                if all(w.get("resources", {}).get(k, 0) >= v for k, v in (resources or {}).items())]

    def _holders(self, resources: dict) -> int:
        """Workers that advertise every resource named."""
        return len(self._workers_with(resources))

    def slots(self, resources: dict | None = None) -> int:
        """How many tasks run at once: the workers (holding the resources, if any hold them) times their threads."""
        return max(1, sum(w.get("nthreads", 1) for w in self._workers_with(self._usable(resources))))

    def _usable(self, resources: dict | None) -> dict | None:
        """Ask for a resource (e.g. GPU) only when some worker advertises it."""
        if not resources:
            return None
        have = {r for w in self.client.scheduler_info(n_workers=-1)["workers"].values()
                for r in w.get("resources", {})}
        wanted = {k: v for k, v in resources.items() if k in have}
        return wanted or None

    def map(self, fn: Callable, tasks: Sequence[Any], desc: str = "", resources: dict | None = None,
            on_result: Callable[[int, Any], None] | None = None, parallel: bool = True) -> list:
        from distributed import as_completed
        from distributed.scheduler import KilledWorker
        tasks = list(tasks)
        if not tasks:
            return []
        want = self._usable(resources)
        futures = self.client.map(fn, tasks, pure=False, resources=want)
        live = {f.key: (i, f) for i, f in enumerate(futures)}  # key -> (task index, future)
        out: list = [None] * len(tasks)
        ac = as_completed(futures, loop=self.client.loop)
        grace = self.resource_grace_s
        starving_since: float | None = None
        next_check = 0.0
        bar = tqdm(total=len(tasks), desc=desc, leave=False, disable=len(tasks) < 2)
        try:
            while live:
                if want is None:
                    batch = ac.next_batch(block=True)
                else:
                    batch = ac.next_batch(block=False)
                    if not batch:
                        time.sleep(0.2)
                        if time.monotonic() < next_check:
                            continue
                        next_check = time.monotonic() + min(5.0, grace / 4)
                        if self._holders(want):
                            starving_since = None
                        elif starving_since is None:
                            starving_since = time.monotonic()
                            log.warning("%s: no worker with resources %s is left; the remaining tasks "
                                        "run anywhere in %.0fs unless one joins", desc or fn.__name__, want,
                                        grace)
                        elif time.monotonic() - starving_since >= grace:
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


def make_executor(cfg, processes: int = 1) -> LocalExecutor | DaskExecutor:
    """The executor of a stage; `processes` sizes the local process pool of parallel maps."""
    if cfg.kind == "dask" or cfg.dask_address:
        s = {k: dask_setting(k, getattr(cfg, k)) for k in ENV}
        return DaskExecutor(cfg.dask_address, cfg.dask_workers, cfg.dask_threads_per_worker,
                            reuse=s["dask_reuse"], dashboard=s["dask_dashboard"],
                            memory_limit=s["dask_memory_limit"], connect_timeout_s=s["dask_connect_timeout_s"],
                            resource_grace_s=s["dask_resource_grace_s"])
    return LocalExecutor(processes)
