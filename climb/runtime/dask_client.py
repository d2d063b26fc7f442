"""The Dask client that `climb.runtime.executor.DaskExecutor` maps its tasks on: where it
comes from, how long it lives, and what its workers offer.

A `DaskSession` holds a client for one `with DaskExecutor(...)` block:
- `address = ""`: a `LocalCluster` of `workers` worker processes with
  `threads_per_worker` threads each, and a client on it;
- `address = "tcp://host:8786"` or a scheduler file (`*.json`): a client on that
  scheduler (the cluster is then None: someone else runs it).

With `reuse` (the default) the client, and its local cluster, is kept in this
process under a key, ("local", workers, threads) or ("address", address), and the
next session with the same key takes it over, so every stage of a run shares one
cluster (workers keep their loaded models and token stores). A kept client that
has stopped running (or whose local cluster has) is closed and replaced by a
fresh one. Kept clients are closed at exit, or by `shutdown()`. Without `reuse` a
session opens its own and closes it when it ends.
"""
from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import threading
from typing import Any

log = logging.getLogger(__name__)

# The client (and, for a local cluster, the cluster) kept per key in this process.
_SHARED: dict[tuple, tuple[Any, Any]] = {}
_LOCK = threading.Lock()
_SHUTDOWN_REGISTERED = False


def shutdown() -> None:
    """Close every client and local cluster this process kept (also run at exit)."""
    with _LOCK:
        items = list(_SHARED.values())
        _SHARED.clear()
    for client, cluster in items:
        close_quietly(client, cluster)


def close_quietly(client, cluster) -> None:
    """Close a client, then its cluster (None for either is skipped); errors are only logged."""
    for thing in (client, cluster):
        if thing is None:
            continue
        try:
            thing.close()
        except Exception as e:  # closing is best effort (e.g. at interpreter exit)
            log.debug("closing %r: %s", thing, e)


def _register_shutdown() -> None:
    # Registered after distributed is imported, so it runs before distributed's own
    # exit hooks (atexit is last in, first out): clients close before their clusters.
    global _SHUTDOWN_REGISTERED
    if not _SHUTDOWN_REGISTERED:
        atexit.register(shutdown)
        _SHUTDOWN_REGISTERED = True


def is_running(client, cluster) -> bool:
    """Whether the client, and its local cluster if it has one, still run."""
    if getattr(client, "status", "") != "running":
        return False
    if cluster is None:
        return True
    return getattr(getattr(cluster, "status", None), "name", "") == "running"


class DaskSession:
    """A Dask client for one `with` block, kept for the next session when `reuse` is on."""

    def __init__(self, address: str = "", workers: int = 2, threads_per_worker: int = 1, reuse: bool = True,
                 dashboard: str = "", memory_limit: str = "", connect_timeout_s: float = 30.0):
        self.address, self.workers, self.threads = address, workers, threads_per_worker
        self.reuse, self.dashboard, self.memory_limit = reuse, dashboard, memory_limit
        self.connect_timeout_s = connect_timeout_s
        self.client = self.cluster = None
        self.owned = False  # True when this session must close what it opened

    def key(self) -> tuple:
        """What sessions sharing one client have in common."""
        return ("address", self.address) if self.address else ("local", self.workers, self.threads)

    # ------------------------------------------------------------ open and close
    def open(self) -> None:
        """Take over the kept client of this key if it still runs; else open one (and keep it)."""
        key = self.key()
        with _LOCK:
            shared = _SHARED.get(key) if self.reuse else None
            if shared is not None and not is_running(*shared):
                _SHARED.pop(key, None)
                close_quietly(*shared)
                shared = None
            if shared is None:
                shared = self._start()
                if self.reuse:
                    _SHARED[key] = shared
                    describe(*shared)
            self.client, self.cluster = shared
            self.owned = not self.reuse
        if self.owned:
            describe(self.client, self.cluster)

    def close(self) -> None:
        """Close the client (and cluster) if this session owns it; a kept one stays open."""
        if self.owned:
            close_quietly(self.client, self.cluster)
        self.client = self.cluster = None

    def _start(self) -> tuple[Any, Any]:
        """A new (client, cluster): on the scheduler at `address`, or on a new local cluster."""
        import distributed  # noqa: F401  (before the exit hook: see _register_shutdown)
        _register_shutdown()
        if self.address:
            return self._connect(), None
        return self._start_local_cluster()

    def _connect(self):
        from distributed import Client

        from climb.config import ConfigError
        timeout = self.connect_timeout_s
        try:
            if self.address.endswith(".json"):  # a scheduler file (dask scheduler --scheduler-file)
                if not os.path.isfile(self.address):
                    raise ConfigError(f"Dask scheduler file {self.address} not found; start the "
                                      f"scheduler with `dask scheduler --scheduler-file {self.address}`")
                return Client(scheduler_file=self.address, timeout=timeout, set_as_default=False)
            return Client(self.address, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError) as e:
            raise ConfigError(
                f"cannot reach the Dask scheduler at {self.address} ({e}); start one with "
                "`dask scheduler` and workers with `dask worker ADDRESS`, or drop --dask-address "
                "to use a local cluster") from e

    def _start_local_cluster(self) -> tuple[Any, Any]:
        import dask
        from distributed import Client, LocalCluster
        kwargs: dict = {}
        if self.memory_limit:
            kwargs["memory_limit"] = self.memory_limit
        dash = self.dashboard
        if dash and importlib.util.find_spec("bokeh") is None:
            log.warning("a Dask dashboard is asked for (executor.dask_dashboard or CLIMB_DASK_DASHBOARD) but "
                        "bokeh is not installed: no dashboard (pip install 'bokeh>=3.1', or the climb[dask] extra)")
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

    # ------------------------------------------------------------ the workers
    def _worker_infos(self):
        return self.client.scheduler_info(n_workers=-1)["workers"].values()

    def workers_with(self, resources: dict | None) -> list[dict]:
        """The workers (their scheduler info) that advertise every resource named (all of them for none)."""
        return [w for w in self._worker_infos()
                if all(w.get("resources", {}).get(k, 0) >= v for k, v in (resources or {}).items())]

    def advertised(self, resources: dict | None) -> dict | None:
        """The resources asked for that some worker advertises (e.g. GPU), or None when there are none."""
        if not resources:
            return None
        have = {r for w in self._worker_infos() for r in w.get("resources", {})}
        wanted = {k: v for k, v in resources.items() if k in have}
        return wanted or None


def describe(client, cluster) -> None:
    """Log the scheduler, its workers and the dashboard; for a scheduler someone else runs, warn when
    its workers run in another folder than this process."""
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
        _warn_if_workers_elsewhere(client)


def _warn_if_workers_elsewhere(client) -> None:
    # Tasks carry paths; a worker started in another folder resolves relative ones elsewhere.
    try:
        cwds = set(client.run(os.getcwd).values())
    except Exception:  # a worker without climb installed etc.: the tasks will say so
        cwds = set()
    if cwds - {os.getcwd()}:
        log.warning("dask workers run in %s but this process in %s: relative paths (a relative "
                    "--run, corpus.paths, target files) point elsewhere there; use absolute paths "
                    "on a filesystem every worker sees", sorted(cwds), os.getcwd())
