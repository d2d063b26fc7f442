"""Map independent stage tasks in-process or on Dask.

Tasks are small picklable arguments (file paths, small configs); each task
writes its own output files, so a crashed or killed task is simply re-run.
Results come back in task order whatever order they finish in.

    from climb.executor import make_executor
    with make_executor(cfg.executor) as ex:
        stats = ex.map(embed_shard, tasks, desc="embed")
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

log = logging.getLogger(__name__)


class LocalExecutor:
    kind = "local"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn: Callable, tasks: Sequence[Any], desc: str = "", resources: dict | None = None,
            on_result: Callable[[int, Any], None] | None = None) -> list:
        out = []
        for i, t in enumerate(tqdm(tasks, desc=desc, disable=len(tasks) < 2, leave=False)):
            r = fn(t)
            if on_result is not None:
                on_result(i, r)
            out.append(r)
        return out


class DaskExecutor:
    kind = "dask"

    def __init__(self, address: str = "", workers: int = 2, threads_per_worker: int = 1):
        self.address, self.workers, self.threads = address, workers, threads_per_worker
        self.client = self.cluster = None

    def __enter__(self):
        from distributed import Client, LocalCluster
        if self.address:
            self.client = Client(self.address)
        else:
            self.cluster = LocalCluster(n_workers=self.workers, threads_per_worker=self.threads,
                                        processes=True, dashboard_address=None)
            self.client = Client(self.cluster)
        log.info("dask: %s", self.client.dashboard_link if self.client else "")
        return self

    def __exit__(self, *exc):
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()
        return False

    def _usable(self, resources: dict | None) -> dict | None:
        """Ask for a resource (e.g. GPU) only when some worker advertises it."""
        if not resources:
            return None
        have = {r for w in self.client.scheduler_info(n_workers=-1)["workers"].values()
                for r in w.get("resources", {})}
        wanted = {k: v for k, v in resources.items() if k in have}
        return wanted or None

    def map(self, fn: Callable, tasks: Sequence[Any], desc: str = "", resources: dict | None = None,
            on_result: Callable[[int, Any], None] | None = None) -> list:
        from distributed import as_completed
        if not tasks:
            return []
        futures = self.client.map(fn, list(tasks), pure=False, resources=self._usable(resources))
        index = {f.key: i for i, f in enumerate(futures)}
        out: list = [None] * len(futures)
        for fut in tqdm(as_completed(futures), total=len(futures), desc=desc, leave=False):
            i = index[fut.key]
            out[i] = fut.result()
            if on_result is not None:
                on_result(i, out[i])
        return out


def make_executor(cfg) -> LocalExecutor | DaskExecutor:
    if cfg.kind == "dask" or cfg.dask_address:
        return DaskExecutor(cfg.dask_address, cfg.dask_workers, cfg.dask_threads_per_worker)
    return LocalExecutor()
