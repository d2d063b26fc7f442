"""The Dask backend: the same files as the in-process run, and a killed worker loses nothing.

- `test_dask_run_equals_local_run`: embed -> cluster -> search -> export on a
  tiny corpus, in-process and on a 2-process `LocalCluster`, both through the
  pipeline (which holds the run folder's lock in the client); every output file
  is compared (search results keyed by mixture id: arrival order may differ).
- `test_only_the_client_holds_the_run_lock`: seen from a worker, the run folder
  is held by the client process.
- `test_builtin_proxies_equal_on_dask`: the built-in trainer (CPU, one thread)
  gives the same records in a worker process as in this one.
- `test_one_local_cluster_per_process_replaced_once_stopped`: executors share
  one local cluster per process; a stopped one is replaced by a fresh one.
- `test_killed_worker_mid_search`: a real `dask scheduler` and two `dask worker`
  processes; one is SIGKILLed (with its children, and the process groups of the
  proxy commands it started) while it trains a proxy; the
  search completes on the other worker with nothing lost or duplicated and the
  same results as the undisturbed in-process run.
- `test_gpu_worker_lost_falls_back`: the only worker with a `GPU` resource dies
  mid-map; the waiting tasks run on the plain worker after the grace period.

Worker processes load the real embedding model (offline, from its pip package);
the external "trainer" is tests/helpers/quadratic_proxy.py. Every process a
test starts is SIGKILLed with its process group by a finalizer, pass or fail.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from climb.runtime import executor

from climb import pipeline

from climb.stages import search
from climb.config import ConfigError, load_config
from climb.runtime.executor import DaskExecutor, LocalExecutor
from climb.runtime.proxy_runs import train_and_score
from climb.runtime.layout import RunPaths

from conftest import vocab_docs, write_parquet_shards

distributed = pytest.importorskip("distributed")

HELPER = Path(__file__).parent / "helpers" / "quadratic_proxy.py"
ITERATIONS = (5, 3)


def _env() -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    env.pop("CLIMB_DASK_DASHBOARD", None)
    return env


# ------------------------------------------------------------------ configs and runs
def config_from_args(corpus: Path, *extra: str, command: str | None = None):
    command = command or f"{sys.executable} {HELPER} {{weights}} {{out}}"
    return load_config(None, [
        f'corpus.paths=["{corpus}/*.parquet"]', "embed.max_seq_length=32", "embed.batch_size=16",
        'embed.device="cpu"', "cluster.k=4", "cluster.niter=10",
        "proxy.vocab_size=300", "proxy.seq_len=16", "proxy.tokenizer_docs=100", f'proxy.command="{command}"',
        'target.objective=["loss"]', 'target.goal="minimize"', 'target.texts=["x"]',
        f"search.iterations={list(ITERATIONS)}", "search.pool_size=2000", "search.min_weight=0.0",
        "search.epoch_cap=100.0", "export.token_budget=3000", "export.rows_per_shard=7", *extra])


def _run(cfg, root: Path) -> RunPaths:
    # Through the pipeline, which holds the run folder's lock in this process (the client)
    # while the stages' tasks run on the workers.
    pipeline.run_stage("export", cfg, root)
    return RunPaths(root)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dask-corpus")
    write_parquet_shards(folder, vocab_docs(30, seed=3), 3)  # 90 short documents in 3 shards
    return folder


@pytest.fixture(scope="module")
def local_run(corpus, tmp_path_factory):
    """The undisturbed in-process run every Dask run is compared with."""
    return _run(config_from_args(corpus), tmp_path_factory.mktemp("local") / "run")


@pytest.fixture(scope="module")
def shared_clusters():
    """Close the local clusters / clients the executor shares between stages."""
    yield
    executor.shutdown()


# ------------------------------------------------------------------ comparisons
def _results(paths: RunPaths) -> dict[str, dict]:
    recs = search.read_results(paths)
    ids = [r["mixture_id"] for r in recs]
    assert len(ids) == len(set(ids)), f"duplicated mixture ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    return {r["mixture_id"]: {k: v for k, v in r.items() if k != "seconds"} for r in recs}


def _json(p: Path) -> dict:
    return json.loads(p.read_text())


def _comparison(paths: RunPaths) -> dict:
    return {n: {k: v for k, v in r.items() if k != "seconds"}
            for n, r in _json(paths.root / "search" / "comparison.json").items()}


def _assert_search_equal(a: RunPaths, b: RunPaths) -> None:
    ra, rb = _results(a), _results(b)
    assert sorted(ra) == sorted(rb) and len(ra) == sum(ITERATIONS)
    for mid in ra:
        assert ra[mid] == rb[mid], mid
    for it in range(len(ITERATIONS)):
        assert _json(a.root / "search" / f"plan_{it}.json") == _json(b.root / "search" / f"plan_{it}.json")
    assert _json(a.root / "search" / "mixture.json") == _json(b.root / "search" / "mixture.json")
    assert _comparison(a) == _comparison(b)


def _assert_tables_equal(a: Path, b: Path) -> None:
    ta, tb = pq.read_table(a), pq.read_table(b)
    assert ta.equals(tb), f"{a} != {b}"


def _files(root: Path, pattern: str) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.glob(pattern))


# ------------------------------------------------------------------ same answer
def test_dask_run_equals_local_run(corpus, local_run, shared_clusters, tmp_path):
    cfg = config_from_args(corpus, 'executor.kind="dask"', "executor.dask_workers=2", "executor.dask_threads_per_worker=1")
    dask_run = _run(cfg, tmp_path / "run")
    a, b = local_run.root, dask_run.root
    # embed: identical vectors and ids per shard
    assert _files(a / "embed", "*.npy") == _files(b / "embed", "*.npy") and len(_files(a / "embed", "*.npy")) == 3
    for f in _files(a / "embed", "*.npy"):
        np.testing.assert_array_equal(np.load(a / "embed" / f), np.load(b / "embed" / f))
    for f in _files(a / "embed", "*.ids.parquet"):
        _assert_tables_equal(a / "embed" / f, b / "embed" / f)
    # ... from the same embedding backend (embed.backend travels with the tasks)
    backends = [_json(r.manifest("embed"))["stats"]["backend"] for r in (local_run, dask_run)]
    assert backends[0] == backends[1] and len(backends[0]) == 1, backends
    # cluster: centroids, fine and final assignments, the summary
    np.testing.assert_array_equal(np.load(a / "cluster" / "centroids.npy"), np.load(b / "cluster" / "centroids.npy"))
    for sub in ("fine", "assign"):
        names = _files(a / "cluster" / sub, "*.parquet")
        assert names == _files(b / "cluster" / sub, "*.parquet") and len(names) == 3
        for f in names:
            _assert_tables_equal(a / "cluster" / sub / f, b / "cluster" / sub / f)
    assert _json(a / "cluster" / "clusters.json") == _json(b / "cluster" / "clusters.json")
    # search: token stores (per shard then merged), plans, results by mixture id, final mixture
    toks = _files(a / "tokenize" / "tokens", "**/*.bin")
    assert toks == _files(b / "tokenize" / "tokens", "**/*.bin") and toks
    for f in toks:
        assert (a / "tokenize" / "tokens" / f).read_bytes() == (b / "tokenize" / "tokens" / f).read_bytes(), f
    assert _json(a / "tokenize" / "tokens" / "index.json") == _json(b / "tokenize" / "tokens" / "index.json")
    _assert_search_equal(local_run, dask_run)
    # export: the same files holding the same document ids in the same order
    data = _files(a / "export" / "data", "**/*.parquet")
    assert data == _files(b / "export" / "data", "**/*.parquet") and len(data) > 3
    for f in data:
        _assert_tables_equal(a / "export" / "data" / f, b / "export" / "data" / f)
    assert _json(a / "export" / "mixture.json") == _json(b / "export" / "mixture.json")
    for f in ("interleave.json",):
        assert (a / "export" / f).read_text() == (b / "export" / f).read_text()


LOCK_PROBE = """import sys
from climb.runtime.runlock import RunLocked, hold
try:
    with hold(sys.argv[1]): print("held")
except RunLocked as e: print(e)
"""


def test_only_the_client_holds_the_run_lock(local_run, shared_clusters):
    from climb.runtime.runlock import hold
    with hold(local_run.root):
        with DaskExecutor("", workers=2, threads_per_worker=1) as ex:
            out = ex.map(subprocess.check_output, [[sys.executable, "-c", LOCK_PROBE, str(local_run.root)]])
    assert f"in use by PID {os.getpid()}" in out[0].decode()  # seen from a worker: the client holds it


def test_builtin_proxies_equal_on_dask(local_run, shared_clusters):
    """Built-in trainer, CPU, one thread per worker: bit-identical records in a worker process."""
    cfg = load_config(local_run.root / "config.toml")
    pc = dataclasses.replace(cfg.proxy, command="", n_layer=1, n_embd=32, steps=6, batch_size=4,
                             warmup_steps=2, device="cpu")
    shard = sorted(cfg.corpus.paths)[0].replace("*.parquet", "part-00000.parquet")
    tc = dataclasses.replace(cfg.target, texts=(shard,), objective=("bpb",))
    k = _json(local_run.root / "tokenize" / "tokens" / "index.json")["n_clusters"]
    tasks = [search.proxy_task(dataclasses.replace(cfg, proxy=pc, target=tc), local_run, f"b{j}", 0,
                          np.roll(np.arange(1, k + 1), j) / (k * (k + 1) / 2), seed=j) for j in range(3)]
    here = LocalExecutor().map(train_and_score, tasks)
    with DaskExecutor("", workers=2, threads_per_worker=1) as ex:
        there = ex.map(train_and_score, tasks, resources={"GPU": 1})
        # Dask's nanny default (MALLOC_TRIM_THRESHOLD_=65536) makes torch ~1.7x slower: not set.
        envs = ex.client.run(lambda: __import__("os").environ.get("MALLOC_TRIM_THRESHOLD_"))
    assert len(envs) == 2 and set(envs.values()) == {None}
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in here]
    assert all(r["status"] == "ok" for r in here), here
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in there]


def test_one_local_cluster_per_process_replaced_once_stopped(shared_clusters):
    """Executors with the same local cluster settings share one cluster while it runs; a kept
    client or cluster that has stopped is closed and replaced; with reuse off an executor
    closes its own at the end."""
    def local_executor(**kw):
        return DaskExecutor("", workers=1, threads_per_worker=1, **kw)

    with local_executor() as first:
        client, cluster = first.client, first.cluster
        assert first.map(abs, [-1, -2]) == [1, 2]
    assert first.client is None and first.cluster is None  # the executor lets go of it ...
    assert client.status == "running" and cluster.status.name == "running"  # ... the process keeps it
    with local_executor() as second:
        assert second.client is client and second.cluster is cluster
    client.close()  # the kept client stops while its cluster runs on
    with local_executor() as third:
        client2, cluster2 = third.client, third.cluster
        assert client2 is not client and cluster2 is not cluster
    assert cluster.status.name == "closed"  # the old cluster was closed, not left running
    cluster2.close()  # the kept cluster stops (its scheduler went away)
    with local_executor() as fourth:
        client3, cluster3 = fourth.client, fourth.cluster
        assert client3 is not client2 and cluster3 is not cluster2
        assert fourth.map(abs, [-3]) == [3]
    assert client2.status == "closed"
    with local_executor(reuse=False) as own:
        own_client, own_cluster = own.client, own.cluster
        assert own_cluster is not cluster3
    assert own_client.status == "closed" and own_cluster.status.name == "closed"
    assert client3.status == "running" and cluster3.status.name == "running"
    executor.shutdown()
    assert client3.status == "closed" and cluster3.status.name == "closed"


# ------------------------------------------------------------------ real scheduler and workers
class DaskProcesses:
    """A `dask scheduler` and `dask worker`s on 127.0.0.1, each in its own process group."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.sched_file = folder / "scheduler.json"
        self.procs: list[subprocess.Popen] = []
        self.workers: dict[str, subprocess.Popen] = {}
        self.address = ""

    def _start(self, args: list[str], name: str) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "wb")
        p = subprocess.Popen([sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT,
                             env=_env(), cwd=os.getcwd(), start_new_session=True)
        log.close()
        self.procs.append(p)
        return p

    def scheduler(self) -> str:
        self._start(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                     "--no-dashboard", "--scheduler-file", str(self.sched_file)], "scheduler")
        deadline = time.time() + 60
        while not self.sched_file.exists():
            assert self.procs[0].poll() is None, (self.folder / "scheduler.log").read_text()
            assert time.time() < deadline, "the scheduler did not start"
            time.sleep(0.1)
        self.address = json.loads(self.sched_file.read_text())["address"]
        return self.address

    def worker(self, name: str, *extra: str) -> None:
        self.workers[name] = self._start(
            ["distributed.cli.dask_worker", "--scheduler-file", str(self.sched_file), "--name", name,
             "--nthreads", "1", "--no-nanny", "--no-dashboard", "--memory-limit", "0",
             "--local-directory", str(self.folder / f"{name}-scratch"), *extra], name)

    def wait_for_workers(self, n: int) -> None:
        from distributed import Client
        with Client(self.address, timeout=30) as c:
            c.wait_for_workers(n, timeout=90)

    def kill(self, name: str) -> None:
        """SIGKILL a worker and every process it started (its process group): a node lost."""
        p = self.workers[name]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)

    def close(self) -> None:
        """SIGKILL every process group started (workers first); their scratch space is in tmp_path."""
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGKILL)  # the process and anything it started
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


@pytest.fixture
def dask_processes(tmp_path, request):
    procs = DaskProcesses(tmp_path)
    request.addfinalizer(procs.close)
    request.addfinalizer(executor.shutdown)  # runs first: clients go before their scheduler
    return procs


SLOW = '''import json, os, subprocess, sys, time
weights, out, log, delay = sys.argv[1:5]
mid = json.load(open(weights))["mixture_id"]
# Each proxy command runs in a process group of its own; note the worker that started
# it (the parent, or the shell's parent) and that group.
worker = os.getppid()
if open(f"/proc/{worker}/comm").read().strip() in ("sh", "dash", "bash"):
    worker = int(open(f"/proc/{worker}/stat").read().rsplit(")", 1)[1].split()[1])
def note(what):
    with open(log, "a") as fh:
        fh.write(f"{what} {mid} {worker} {os.getpgid(0)}\\n")
note("start")
time.sleep(float(delay))
subprocess.run([sys.executable, HELPER, weights, out], check=True)
note("end")
'''


def _slow_command(folder: Path, delay: float) -> tuple[str, Path]:
    script, log = folder / "slow_proxy.py", folder / "proxy.log"
    script.write_text(f"HELPER = {str(HELPER)!r}\n" + SLOW)
    return f"{sys.executable} {script} {{weights}} {{out}} {log} {delay}", log


def _log(log: Path) -> list[tuple[str, str, int]]:
    """(event, mixture id, worker pid) per line of the slow proxy's log."""
    return [e[:3] for e in _events(log)]


def _events(log: Path) -> list[tuple]:
    if not log.exists():
        return []
    return [(w, m, int(g), *map(int, rest)) for w, m, g, *rest in
            (line.split() for line in log.read_text().splitlines() if line.strip())]


def _running(log: Path, pgid: int) -> set[str]:
    ev = _log(log)
    return ({m for w, m, g in ev if w == "start" and g == pgid} - {m for w, m, g in ev if w == "end" and g == pgid})


def test_killed_worker_mid_search(corpus, local_run, dask_processes, tmp_path):
    address = dask_processes.scheduler()
    dask_processes.worker("w0")
    dask_processes.worker("w1")
    dask_processes.wait_for_workers(2)
    command, log = _slow_command(tmp_path, 0.4)
    cfg = config_from_args(corpus, f'executor.dask_address="{address}"', command=command)
    # Same corpus, embeddings and clusters as the undisturbed run; the search runs on the workers.
    paths = RunPaths(tmp_path / "run")
    paths.save_config(cfg)
    for stage in ("embed", "cluster", "tokenize"):
        shutil.copytree(local_run.root / stage, paths.root / stage)
    error: list[BaseException] = []

    def run_search():
        try:
            search.run(cfg, paths)
        except BaseException as e:  # reported by the main thread
            error.append(e)

    t = threading.Thread(target=run_search, daemon=True)
    t.start()
    victim = dask_processes.workers["w0"].pid
    deadline = time.time() + 90
    # Kill w0 while it is training a proxy, after some results have been written (results.jsonl
    # grows as proxies finish, mid-stage: what a crashed search resumes from).
    while not (len(search.read_results(paths)) >= 2 and _running(log, victim)):
        assert t.is_alive(), f"the search ended before the kill: {error}"
        assert time.time() < deadline, "the search never got going"
        time.sleep(0.05)
    interrupted = _running(log, victim)
    written = len(search.read_results(paths))
    dask_processes.kill("w0")
    for pgid in {e[3] for e in _events(log) if e[2] == victim}:  # a node lost: its proxies go too
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    t.join(timeout=120)
    assert not t.is_alive(), "the search did not finish on the remaining worker"
    assert not error, error
    assert written < sum(ITERATIONS)  # the kill really was mid-stage
    results = _results(paths)  # no duplicated mixture ids
    assert interrupted <= set(results)  # the proxy w0 was training was redone elsewhere
    survivor = dask_processes.workers["w1"].pid
    assert {m for w, m, g in _log(log) if w == "end" and g == survivor} >= interrupted
    _assert_search_equal(local_run, paths)  # nothing lost: the same answer as undisturbed
    assert json.loads(paths.manifest("search").read_text())["stats"]["proxies"] == sum(ITERATIONS)


NOTE = """import os, sys, time
log, delay, mid = sys.argv[1:4]
def note(what):
    with open(log, "a") as fh:
        fh.write(f"{what} {mid} {os.getpgid(0)}\\n")
note("start")
time.sleep(float(delay))
note("end")
print(mid)
"""


def test_gpu_worker_lost_falls_back(dask_processes, tmp_path, monkeypatch):
    """The only worker with a GPU resource dies mid-map: the rest runs on the plain worker."""
    monkeypatch.setenv("CLIMB_DASK_RESOURCE_GRACE_S", "1")
    dask_processes.scheduler()
    dask_processes.worker("gpu", "--resources", "GPU=1")
    dask_processes.worker("cpu")
    dask_processes.wait_for_workers(2)
    log = tmp_path / "tasks.log"
    # A stdlib function, so the workers import nothing heavy: each task is a child process.
    tasks = [[sys.executable, "-c", NOTE, str(log), "0.3", f"m{j}"] for j in range(5)]
    gpu, cpu = dask_processes.workers["gpu"].pid, dask_processes.workers["cpu"].pid
    seen: list[int] = []
    out: list = []
    with DaskExecutor(str(dask_processes.sched_file)) as ex:  # a scheduler file works as the address
        t = threading.Thread(target=lambda: out.append(ex.map(
            subprocess.check_output, tasks, resources={"GPU": 1}, on_result=lambda i, r: seen.append(i))))
        t.start()
        deadline = time.time() + 60
        while not _running(log, gpu):
            assert time.time() < deadline and t.is_alive(), "no task started on the GPU worker"
            time.sleep(0.05)
        assert {g for w, m, g in _log(log)} == {gpu}  # GPU tasks go to the GPU worker only
        dask_processes.kill("gpu")
        t.join(timeout=60)
        assert not t.is_alive(), "the map hung after its only GPU worker died"
    assert sorted(seen) == list(range(5))  # each result once
    assert [r.decode().strip() for r in out[0]] == [f"m{j}" for j in range(5)]  # in task order
    assert {g for w, m, g in _log(log) if w == "end"} == {cpu}


# ------------------------------------------------------------------ configuration
def test_cli_executor_options():
    from climb.cli import config_from_args, build_parser
    args = build_parser().parse_args(["cluster", "--config", "pipelines/demo.toml", "--executor", "dask",
                                      "--dask-workers", "3"])
    cfg, _ = config_from_args(args)
    assert (cfg.executor.kind, cfg.executor.dask_workers, cfg.executor.dask_address) == ("dask", 3, "")
    args = build_parser().parse_args(["run", "--config", "pipelines/demo.toml", "--dask-address",
                                      "tcp://10.0.0.5:8786"])
    cfg, _ = config_from_args(args)
    assert (cfg.executor.kind, cfg.executor.dask_address) == ("dask", "tcp://10.0.0.5:8786")
    assert isinstance(executor.make_executor(cfg.executor), DaskExecutor)
    assert isinstance(executor.make_executor(load_config(None).executor), LocalExecutor)


def test_unreachable_scheduler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CLIMB_DASK_CONNECT_TIMEOUT_S", "1")
    with pytest.raises(ConfigError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        with DaskExecutor("tcp://127.0.0.1:9", reuse=False):
            pass
    with pytest.raises(ConfigError, match="scheduler file .*missing.json not found"):
        with DaskExecutor(str(tmp_path / "missing.json"), reuse=False):
            pass


def test_dask_settings_come_from_the_config_and_the_environment_overrides(monkeypatch):
    for var in executor.ENV.values():
        monkeypatch.delenv(var, raising=False)
    cfg = load_config(None, ["executor.kind=\"dask\"", "executor.dask_dashboard=\":8790\"",
                             "executor.dask_memory_limit=\"2GiB\"", "executor.dask_reuse=false",
                             "executor.dask_connect_timeout_s=5", "executor.dask_resource_grace_s=7"])
    ex = executor.make_executor(cfg.executor)
    assert (ex.dashboard, ex.memory_limit, ex.reuse, ex.connect_timeout_s, ex.resource_grace_s) == \
        (":8790", "2GiB", False, 5.0, 7.0)
    # The defaults are the ones the environment variables had
    plain = DaskExecutor("")
    assert (plain.dashboard, plain.memory_limit, plain.reuse, plain.connect_timeout_s, plain.resource_grace_s) == \
        ("", "", True, 30.0, 120.0)
    monkeypatch.setenv("CLIMB_DASK_DASHBOARD", "")
    monkeypatch.setenv("CLIMB_DASK_MEMORY_LIMIT", "3GiB")
    monkeypatch.setenv("CLIMB_DASK_REUSE", "1")
    monkeypatch.setenv("CLIMB_DASK_CONNECT_TIMEOUT_S", "2.5")
    monkeypatch.setenv("CLIMB_DASK_RESOURCE_GRACE_S", "not a number")  # ignored: the config's value
    ex = executor.make_executor(cfg.executor)
    assert (ex.dashboard, ex.memory_limit, ex.reuse, ex.connect_timeout_s, ex.resource_grace_s) == \
        ("", "3GiB", True, 2.5, 7.0)
    # Arguments given in code win over both
    assert DaskExecutor("", reuse=False, connect_timeout_s=1.0).reuse is False
    with pytest.raises(ConfigError, match="dask_connect_timeout_s must be positive"):
        load_config(None, ["executor.dask_connect_timeout_s=0"])
    with pytest.raises(ConfigError, match="dask_resource_grace_s must be at least 0"):
        load_config(None, ["executor.dask_resource_grace_s=-1"])
