"""Dask scale-out: embedding and the proxy swarm on 1 vs 2 worker processes, and
the Dask backend's overhead against in-process on a small demo-like run.

    python benchmarks/dask_scaleout.py [--corpus ../shared/data/corpus] [--docs 2000]
        [--proxies 8] [--out benchmarks/results/dask_scaleout.json] [--keep DIR]
    python benchmarks/dask_scaleout.py --quick --out /tmp/x.json   # a smoke test of the script
    python benchmarks/dask_scaleout.py --parts embed,swarm   # re-measure some; others kept in --out

The output is a JSON list of {"name", "ours", "baseline", "unit", "ratio", "details"}.

1. Embedding: the first `--docs` documents of one corpus shard, split into 4
   shards (so two workers can share them), embedded with the demo's settings
   (max_seq_length 128) in-process, then on a local Dask cluster of 1 and of 2
   worker processes. Workers are warmed first (model loaded), so the figures
   are throughput, not start-up. The outputs are checked identical.
2. Proxy swarm: `--proxies` built-in proxies of the demo size (pipelines/demo.toml:
   2 layers, 64 wide, 150 steps of 16 x 128 tokens, scored by bits per byte on
   100 held-out documents), trained on clusters of that corpus subset, on 1 and
   2 workers (and in-process). Records checked identical.
3. Overhead: `climb run` of a small demo-like config end to end in a fresh
   process, in-process vs `--executor dask --dask-workers 2` (cluster start-up,
   worker imports and model loads included).

Everything runs with one thread per process (OMP_NUM_THREADS=1), so 1 vs 2
compares processes. The load average is recorded with each figure: on a shared
machine other jobs take cores too, and 2 workers can only scale if 2 cores are
free. Needs ../shared/data/corpus; without it the script says so and exits 0.
"""
from __future__ import annotations

from common import (CORPUS, RESULTS, ROOT, go_offline, load_avg, now, run_climb, run_paths, shared_or_skip,
                    write_result)

go_offline(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


def entry(name: str, ours: float, baseline: float, unit: str, details: dict) -> dict:
    # ratio > 1 means ours is better: higher is better for rates, lower for seconds.
    better_low = unit == "s"
    ratio = (baseline / ours if better_low else ours / baseline) if (ours and baseline) else None
    return {"name": name, "ours": round(ours, 3), "baseline": round(baseline, 3), "unit": unit,
            "ratio": round(ratio, 3) if ratio else None, "details": details}


def _warm_embed(ecfg) -> str:  # runs on each worker (pickled by value: defined in __main__)
    import torch
    from climb.stages.embed import load_model
    torch.set_num_threads(1)
    load_model(ecfg)
    return "ok"


def _warm_proxy() -> int:
    import torch
    import climb.runtime.proxy_runs  # noqa: F401
    torch.set_num_threads(1)
    return torch.get_num_threads()


def write_subsets(corpus: Path, work: Path, docs: int) -> tuple[Path, Path, Path]:
    src = sorted(corpus.glob("*.parquet"))
    t = pq.read_table(src[0], columns=["id", "text"]).slice(0, docs)
    emb = work / "corpus"
    emb.mkdir(parents=True)
    q = -(-t.num_rows // 4)
    for i in range(4):
        pq.write_table(t.slice(i * q, q), emb / f"part-{i:05d}.parquet")
    target = work / "target.parquet"
    pq.write_table(pq.read_table(src[1], columns=["id", "text"]).slice(0, 100), target)
    small = work / "small"
    small.mkdir()
    s = pq.read_table(src[2], columns=["id", "text"]).slice(0, 600)
    for i in range(2):
        pq.write_table(s.slice(i * 300, 300), small / f"part-{i:05d}.parquet")
    return emb, target, small


def bench_embed(cfg, paths, results: list, details_common: dict) -> None:
    from climb.stages import embed
    from climb.runtime.executor import DaskExecutor
    import torch
    torch.set_num_threads(1)
    files = paths.corpus_files(cfg)
    embed.load_model(cfg.embed)  # in-process model loaded before timing, as the workers' are
    t0 = time.time()
    l0 = load_avg()
    stats = embed.run(cfg, paths)  # the real stage, in-process: also the input of the swarm below
    local_s = time.time() - t0
    docs = stats["docs"]
    print(f"embed in-process: {docs} docs in {local_s:.1f}s ({docs / local_s:.1f} docs/s), load {l0}", flush=True)
    ref = {paths.embed.vectors(s).name: np.load(paths.embed.vectors(s)) for s in paths.shards()}
    per_n = {}
    for n in (1, 2):
        out_dir = paths.root / f"embed-dask{n}"
        tasks = [embed.EmbedTask(path=str(f), out_dir=str(out_dir), corpus=cfg.corpus, embed=cfg.embed) for f in files]
        t_start = time.time()
        with DaskExecutor("", workers=n, threads_per_worker=1, reuse=False) as ex:
            started = time.time() - t_start
            ex.client.run(_warm_embed, cfg.embed)
            warm = time.time() - t_start - started
            l0 = load_avg()
            t0 = time.time()
            ex.map(embed.embed_shard, tasks, desc=f"embed x{n}", resources={"GPU": 1})
            secs = time.time() - t0
            l1 = load_avg()
        same = all(np.array_equal(ref[k], np.load(out_dir / k)) for k in ref)
        per_n[n] = {"seconds": round(secs, 2), "docs_per_s": round(docs / secs, 2), "cluster_start_s": round(started, 2),
                    "worker_model_load_s": round(warm, 2), "load_before": l0, "load_after": l1,
                    "identical_to_in_process": same}
        print(f"embed dask x{n}: {docs / secs:.1f} docs/s ({secs:.1f}s; start {started:.1f}s, model load "
              f"{warm:.1f}s), load {l0} -> {l1}, identical: {same}", flush=True)
    details = {**details_common, "docs": docs, "shards": len(files), "max_seq_length": cfg.embed.max_seq_length,
               "model": cfg.embed.model, "in_process": {"seconds": round(local_s, 2),
                                                        "docs_per_s": round(docs / local_s, 2)},
               "workers_1": per_n[1], "workers_2": per_n[2]}
    results.append(entry("embed_throughput_2_vs_1_workers", per_n[2]["docs_per_s"], per_n[1]["docs_per_s"],
                         "docs/s", details))
    results.append(entry("embed_throughput_dask_1_worker_vs_in_process", per_n[1]["docs_per_s"], docs / local_s,
                         "docs/s", {**details_common, "docs": docs}))


def bench_swarm(cfg, paths, n_proxies: int, results: list, details_common: dict, in_process: bool) -> None:
    from climb.stages import cluster, search, tokenize
    from climb.runtime.executor import DaskExecutor, LocalExecutor
    from climb.runtime.proxy_runs import train_and_score
    cluster.run(cfg, paths)
    tokenize.run(cfg, paths)
    tokens = tokenize.cluster_tokens(paths)
    space = search.mixture_space(cfg, tokens)
    rng = np.random.default_rng(0)
    k = len(tokens)
    ws = [np.where(space["usable"], rng.dirichlet(np.ones(k)), 0.0) for _ in range(n_proxies)]
    tasks = [search.proxy_task(cfg, paths, f"bench-{j:02d}", 0, w / w.sum(), cfg.search.seed) for j, w in enumerate(ws)]
    strip = lambda recs: [{a: b for a, b in r.items() if a != "seconds"} for r in recs]  # noqa: E731
    per = {}
    if in_process:
        l0 = load_avg()
        t0 = time.time()
        recs = LocalExecutor().map(train_and_score, tasks)
        secs = time.time() - t0
        per["in_process"] = {"seconds": round(secs, 2), "proxies_per_min": round(60 * n_proxies / secs, 3),
                             "load_before": l0, "load_after": load_avg(), "records": strip(recs)}
        print(f"swarm in-process: {n_proxies} proxies in {secs:.1f}s, load {l0}", flush=True)
    for n in (1, 2):
        with DaskExecutor("", workers=n, threads_per_worker=1, reuse=False) as ex:
            ex.client.run(_warm_proxy)
            l0 = load_avg()
            t0 = time.time()
            recs = ex.map(train_and_score, tasks, desc=f"swarm x{n}", resources={"GPU": 1})
            secs = time.time() - t0
            l1 = load_avg()
        per[n] = {"seconds": round(secs, 2), "proxies_per_min": round(60 * n_proxies / secs, 3),
                  "load_before": l0, "load_after": l1, "records": strip(recs)}
        print(f"swarm dask x{n}: {n_proxies} proxies in {secs:.1f}s ({60 * n_proxies / secs:.2f}/min), "
              f"load {l0} -> {l1}", flush=True)
    ok = all(r["status"] == "ok" for r in per[1]["records"])
    same = per[1]["records"] == per[2]["records"] and (not in_process or per["in_process"]["records"] == per[1]["records"])
    for v in per.values():
        v.pop("records")
    pc = cfg.proxy
    details = {**details_common, "proxies": n_proxies, "all_ok": ok, "identical_records": same,
               "proxy": {"n_layer": pc.n_layer, "n_embd": pc.n_embd, "seq_len": pc.seq_len, "steps": pc.steps,
                         "batch_size": pc.batch_size, "vocab_size": pc.vocab_size},
               "target_docs": 100, "clusters": k, "workers_1": per[1], "workers_2": per[2],
               **({"in_process": per["in_process"]} if in_process else {})}
    results.append(entry("swarm_throughput_2_vs_1_workers", per[2]["proxies_per_min"], per[1]["proxies_per_min"],
                         "proxies/min", details))


def bench_overhead(small: Path, target: Path, work: Path, results: list, details_common: dict,
                   steps: int = 30) -> None:
    from climb.stages.search import read_results
    sets = [f'corpus.paths=["{small}/*.parquet"]', 'corpus.build=""', "embed.max_seq_length=64",
            "cluster.k=8", "proxy.vocab_size=512", "proxy.tokenizer_docs=600", f"proxy.steps={steps}",
            "proxy.warmup_steps=3", "search.iterations=[4,2]", "search.experts=0", "search.pool_size=5000",
            f'target.texts=["{target}"]', "export.token_budget=50000", 'embed.device="cpu"', 'proxy.device="cpu"']
    walls, stages = {}, {}
    for kind in ("local", "dask"):
        run = work / f"overhead-{kind}"
        executor = ["--executor", "dask", "--dask-workers", "2"] if kind == "dask" else []
        l0 = load_avg()
        t0 = time.time()
        proc = run_climb(["run", "--config", ROOT / "pipelines" / "demo.toml", "--run", run, *executor], sets,
                         check=False, capture=True)
        walls[kind] = time.time() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"climb run ({kind}) failed:\n{proc.stderr[-3000:]}")
        stages[kind] = {s: run_paths(run).stats(s).get("seconds")
                        for s in ("embed", "cluster", "search", "export", "report")}
        stages[kind]["load_before"], stages[kind]["load_after"] = l0, load_avg()
        print(f"overhead run {kind}: {walls[kind]:.1f}s, stages {stages[kind]}", flush=True)
    a, b = work / "overhead-local", work / "overhead-dask"
    pa_, pb_ = run_paths(a), run_paths(b)
    ra = {r["mixture_id"]: r["objective"] for r in read_results(pa_)}
    rb = {r["mixture_id"]: r["objective"] for r in read_results(pb_)}
    same = ra == rb and all(pq.read_table(pa_.cluster.assignments(s)).equals(pq.read_table(pb_.cluster.assignments(s)))
                            for s in pa_.shards())
    results.append(entry("dask_overhead_small_run_2_workers_vs_in_process", walls["dask"], walls["local"], "s",
                         {**details_common, "docs": 600, "shards": 2, "proxies": 6 + 3, "proxy_steps": steps,
                          "command": "climb run --config pipelines/demo.toml " + " ".join(f"--set {s}" for s in sets),
                          "stage_seconds": stages, "same_assignments_and_search_results": same}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, default=CORPUS)
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--proxies", type=int, default=8)
    ap.add_argument("--no-in-process-swarm", action="store_true", help="skip the in-process swarm baseline")
    ap.add_argument("--out", type=Path, default=RESULTS / "dask_scaleout.json")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, to check the script runs (figures meaningless)")
    ap.add_argument("--parts", default="embed,swarm,overhead",
                    help="comma-separated subset of embed,swarm,overhead; entries of the other parts already "
                         "in --out are kept")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if parts - {"embed", "swarm", "overhead"}:
        ap.error(f"unknown part(s) {sorted(parts - {'embed', 'swarm', 'overhead'})}")
    steps = [] if not args.quick else ["proxy.steps=5", "proxy.warmup_steps=1"]
    if args.quick:
        args.docs, args.proxies = 200, 2
    if shared_or_skip(args.corpus, "dask_scaleout", "*.parquet") is None:
        return 0
    from climb.config import load_config
    from climb.runtime.executor import shutdown

    work = args.keep or Path(tempfile.mkdtemp(prefix="climb-dask-bench-"))
    if args.keep and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    t_all = time.time()
    common = {"cpus": os.cpu_count(), "threads_per_process": 1, "load_at_start": load_avg(),
              "note": "load average = runnable processes incl. other users' jobs on this shared machine"}
    results: list = []
    try:
        emb, target, small = write_subsets(args.corpus, work, args.docs)
        cfg = load_config(ROOT / "pipelines" / "demo.toml", [
            f'corpus.paths=["{emb}/*.parquet"]', 'corpus.build=""', 'embed.device="cpu"', 'proxy.device="cpu"',
            f'target.texts=["{target}"]', "cluster.k=8", "proxy.tokenizer_docs=2000", *steps])
        paths = run_paths(work / "run")
        paths.save_config(cfg)
        if parts & {"embed", "swarm"}:  # the swarm trains on clusters of the embedded subset
            bench_embed(cfg, paths, results if "embed" in parts else [], common)
        if "swarm" in parts:
            bench_swarm(cfg, paths, args.proxies, results, common, in_process=not args.no_in_process_swarm)
        shutdown()
        if "overhead" in parts:
            bench_overhead(small, target, work, results, common, steps=5 if args.quick else 30)
    finally:
        shutdown()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for r in results:
        r["details"].update(date=now(), benchmark_seconds=round(time.time() - t_all, 1),
                            load_at_end=load_avg(), quick=args.quick)
    if args.out.exists() and parts != {"embed", "swarm", "overhead"}:
        new = {r["name"] for r in results}
        results = [r for r in json.loads(args.out.read_text()) if r["name"] not in new] + results
    write_result(args.out, results)
    for r in results:
        print(f"{r['name']}: {r['ours']} vs {r['baseline']} {r['unit']} (ratio {r['ratio']})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
