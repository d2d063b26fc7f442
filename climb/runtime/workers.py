"""Worker processes for proxy runs on a CPU: one proxy per core, one torch thread each.

On idle cores one proxy per core in single-thread processes trains about as fast
as one proxy at a time on all cores (see BENCHMARKS.md, Proxies in worker
processes), with records identical to a serial one-thread run;
a proxy with one thread per process does not stall when another program takes a
core, where two OpenMP threads per proxy wait on each other. So on a CPU the search
trains one proxy per available core, each in its own process with one thread. Workers are started once (spawned, since a
forked torch can deadlock) and kept for the life of the process, so each loads
the token store (memory-mapped), tokenizer and target once and reuses them.

    from climb.runtime.workers import pool_map, cpu_slots
    records = pool_map(train_and_score, tasks, processes=cpu_slots())

`fresh_map` is the other kind: tasks one at a time in a child process replaced every
few tasks, for work whose native libraries keep memory per task (the tokenize stage).
"""
from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

log = logging.getLogger(__name__)
_POOLS: dict[int, ProcessPoolExecutor] = {}


def cpu_slots() -> int:
    """Cores this process may run on (its affinity mask, not the machine's core count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _log_like_parent(level: int) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")


def _init(level: int) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)
    _log_like_parent(level)


def _pool(n: int) -> ProcessPoolExecutor:
    pool = _POOLS.get(n)
    if pool is None or getattr(pool, "_broken", False):
        pool = ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                                   initargs=(logging.getLogger().getEffectiveLevel(),))
        _POOLS[n] = pool
    return pool


def shutdown(kill: bool = False) -> None:
    """Stop the worker processes (at exit; `kill` stops running proxies too)."""
    for n, pool in list(_POOLS.items()):
        _POOLS.pop(n, None)
        _stop(pool, kill)


def _stop(pool: ProcessPoolExecutor, kill: bool) -> None:
    """Shut a pool down; `kill` terminates its running tasks first."""
    if kill:
        for p in list(getattr(pool, "_processes", {}).values()):
            p.terminate()
    pool.shutdown(wait=not kill, cancel_futures=True)


atexit.register(shutdown)


def _init_fresh(level: int) -> None:
    """A recycled child (`fresh_map`): its logging, and death with its parent (Linux), so that a
    killed run leaves no child finishing a task that the rerun does again beside it."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass
        if os.getppid() == 1:  # the parent died before the line above ran
            os._exit(1)
    _log_like_parent(level)


def fresh_map(fn: Callable, tasks: Sequence[Any], every: int, desc: str = "",
              on_result: Callable[[int, Any], None] | None = None) -> list:
    """fn over tasks one at a time, in order, in a child process replaced after every `every`
    tasks: what a native library keeps of each task (the BPE tokenizer's encoder holds about
    8 MB a corpus shard for the life of the process, see docs/scaling.md) is returned to the
    system with the child, so memory does not grow with the number of tasks."""
    tasks = list(tasks)
    every = max(1, int(every))
    out: list = []
    bar = tqdm(total=len(tasks), desc=desc, leave=False)
    # One pool a chunk, shut down after it (3.11's max_tasks_per_child can hang on a worker's exit).
    for start in range(0, len(tasks), every):
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_init_fresh,
                                   initargs=(logging.getLogger().getEffectiveLevel(),))
        try:
            for f in [pool.submit(fn, t) for t in tasks[start:start + every]]:
                out.append(f.result())
                if on_result is not None:
                    on_result(len(out) - 1, out[-1])
                bar.update()
        except BaseException:
            _stop(pool, kill=True)
            bar.close()
            raise
        _stop(pool, kill=False)
    bar.close()
    return out


def pool_map(fn: Callable, tasks: Sequence[Any], processes: int, desc: str = "",
             on_result: Callable[[int, Any], None] | None = None) -> list:
    """fn over tasks in `processes` workers; results in task order, on_result(i, r) as each arrives."""
    tasks = list(tasks)
    pool = _pool(processes)
    out: list = [None] * len(tasks)
    try:
        pending = {pool.submit(fn, t): i for i, t in enumerate(tasks)}
        with tqdm(total=len(tasks), desc=desc, leave=False) as bar:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for f in sorted(done, key=pending.get):
                    i = pending.pop(f)
                    out[i] = f.result()
                    if on_result is not None:
                        on_result(i, out[i])
                    bar.update()
    except BaseException:
        # Ctrl-C or a failed task: running proxies are stopped, not left to finish unseen.
        shutdown(kill=True)
        raise
    return out
