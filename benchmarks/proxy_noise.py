"""How noisy is a proxy's score, and how much signal does a swarm carry?

For each proxy variant (a set of `proxy.*` overrides) on a finished run's token
store and target, at equal proxy tokens unless a variant changes them:

- replicates: R mixtures (natural, uniform and the first swarm mixtures) each
  trained with S seeds. `seed_sd` is the pooled within-mixture sd (one proxy's
  seed noise); `paired_sd` is the sd of the mixture x seed interaction, the
  part of the noise that does not cancel when mixtures share a seed, as the
  search's proxies do;
- a swarm: N mixtures from the search's own initial sampler, one seed each.
  `swarm_sd` is the spread of the objective; `snr` = swarm_sd / paired_sd;
- on the demo, Spearman(tech share, objective) over the swarm
  (`benchmarks/demo_answer.py`): whether the proxies see the known answer.

Proxies run in worker processes with one torch thread each.

    python benchmarks/proxy_noise.py --run runs/demo --variants iid exact common stratified
    python benchmarks/proxy_noise.py --run runs/demo --variant-set 'long=proxy.steps=400' --replicates 4 --seeds 4
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from common import RESULTS, run_paths, write_result

# proxy.* overrides per named variant ("iid" is the sampler before exact batches and common streams).
VARIANTS = {
    "iid": {"exact_batches": False, "common_streams": False},
    "exact": {"exact_batches": True, "common_streams": False},
    "common": {"exact_batches": False, "common_streams": True},
    "stratified": {"exact_batches": True, "common_streams": True},
}


def _init_worker() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)


def _run(task: dict) -> dict:
    from climb.runtime.proxy_runs import train_and_score
    return train_and_score(task)


def proxy_key(variant: str, over: dict, run: str, t) -> str:
    """What makes a screen's proxy the same one on another start: the variant and its overrides, the
    run, the mixture's id, weights and seed."""
    return json.dumps([variant, over, run, t.mixture_id, [round(w, 9) for w in t.weights], t.seed], sort_keys=True)


def kept_file_for(out: str) -> Path:
    """Where a screen keeps its finished proxies by default: under runs/ (not committed), named
    after its results file."""
    return Path(__file__).resolve().parents[1] / "runs" / "proxy_noise" / (Path(out).stem + ".proxies.jsonl")


def load_kept(keep: Path) -> dict:
    """The finished proxies a stopped screen kept, by `proxy_key` (a torn last line is skipped)."""
    kept = {}
    if keep.exists():
        for line in keep.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            kept[row["key"]] = row["rec"]
    return kept


def run_kept(pool, tasks: list, variant: str, over: dict, run: str, keep: Path, kept: dict) -> list:
    """Each task's record in order: those kept from an earlier start as they were, the others trained
    (in `pool`) and appended to `keep` as each finishes, so that a stop loses only the proxies in flight."""
    from concurrent.futures import as_completed
    keys = [proxy_key(variant, over, run, t) for t in tasks]
    todo = {pool.submit(_run, t): k for t, k in zip(tasks, keys) if k not in kept}
    if len(todo) < len(tasks):
        print(f"{variant}: {len(tasks) - len(todo)} of {len(tasks)} proxies kept from an earlier start", flush=True)
    keep.parent.mkdir(parents=True, exist_ok=True)
    for fut in as_completed(todo):
        rec = fut.result()
        kept[todo[fut]] = rec
        if rec.get("status") == "ok":
            with keep.open("a") as f:
                f.write(json.dumps({"key": todo[fut], "rec": rec}) + "\n")
    return [kept[k] for k in keys]


def noise_stats(table: np.ndarray) -> dict:
    """table[m, s]: objective of mixture m with seed s; the search's own noise figures plus the table."""
    from climb.optimize.quality import noise
    n = noise(table)
    return {"seed_sd": n["seed_sd"], "paired_sd": n["paired_sd"], "mixture_means": table.mean(1).round(4).tolist(),
            "table": table.round(4).tolist()}


def _parse_set(items: list[str]) -> dict:
    out = {}
    for it in items:
        k, v = it.split("=", 1)
        out[k.removeprefix("proxy.")] = json.loads(v) if v[:1] in "[{0123456789-tf" else v
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="runs/demo", help="a finished run (tokenize/tokens, target)")
    ap.add_argument("--config", default="", help="config of the run (default: <run>/config.toml)")
    ap.add_argument("--variants", nargs="*", default=[], choices=sorted(VARIANTS))
    ap.add_argument("--variant-set", nargs="*", default=[],
                    help="NAME=proxy.k=v,proxy.k2=v2 (on top of the config), e.g. long=proxy.steps=400")
    ap.add_argument("--replicates", type=int, default=4, help="mixtures trained with every seed")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--swarm", type=int, default=16, help="mixtures of the initial sampler, one seed each")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "proxy_noise.json"))
    ap.add_argument("--keep", default="",
                    help="each finished proxy's record, one JSON line, so that a stopped screen goes on "
                         "where it stopped (default: beside --out, <out>.proxies.jsonl under runs/)")
    a = ap.parse_args(argv)

    from climb.config import load_config
    from climb.stages.search import candidate_pool, mixture_space, proxy_task
    from proxies.tokens import TokenStore
    from benchmarks.demo_answer import cluster_label_shares

    run = Path(a.run).resolve()
    cfg = load_config(a.config or run / "config.toml")
    paths = run_paths(run)
    store = TokenStore(paths.tokenize.store)
    space = mixture_space(cfg, store.tokens.astype(np.int64))
    swarm = candidate_pool(cfg, space, max(a.swarm * 20, 1000), cfg.search.seed)[: a.swarm]
    reps = [space["natural"], space["uniform"]] + list(swarm[: max(0, a.replicates - 2)])
    try:
        tech = cluster_label_shares(run)
    except Exception as e:  # not the demo corpus (no label column)
        print(f"no tech shares ({e})", file=sys.stderr)
        tech = None

    variants = {v: VARIANTS[v] for v in a.variants}
    for spec in a.variant_set:
        name, rest = spec.split("=", 1)
        variants[name] = _parse_set(rest.split(","))
    results = json.loads(Path(a.out).read_text()) if Path(a.out).exists() else {}
    keep = Path(a.keep) if a.keep else kept_file_for(a.out)
    kept = load_kept(keep)
    with ProcessPoolExecutor(a.workers, initializer=_init_worker,
                             mp_context=__import__("multiprocessing").get_context("spawn")) as pool:
        for name, over in variants.items():
            pc = dataclasses.replace(cfg.proxy, **over)
            t0 = time.time()

            def task(mid, w, seed):
                return proxy_task(dataclasses.replace(cfg, proxy=pc), paths, mid, 0, w, seed)
            rep_tasks = [task(f"rep{m}-s{s}", w, 1000 + s) for m, w in enumerate(reps) for s in range(a.seeds)]
            swarm_tasks = [task(f"swarm{j}", w, 1000) for j, w in enumerate(swarm)]
            recs = run_kept(pool, rep_tasks + swarm_tasks, name, over, str(run), keep, kept)
            bad = [r for r in recs if r["status"] != "ok"]
            if bad:
                raise SystemExit(f"{name}: {len(bad)} proxies failed: {bad[0].get('error')}")
            table = np.array([r["objective"] for r in recs[: len(rep_tasks)]]).reshape(len(reps), a.seeds)
            obj = np.array([r["objective"] for r in recs[len(rep_tasks):]])
            st = noise_stats(table)
            st.update(swarm_sd=float(obj.std(ddof=1)), swarm=obj.round(4).tolist(),
                      snr=float(obj.std(ddof=1) / st["paired_sd"]), snr_seed=float(obj.std(ddof=1) / st["seed_sd"]),
                      train_loss=float(np.mean([r["metrics"]["train_loss"] for r in recs])),
                      tokens=int(recs[0]["tokens"]), overrides=over, seconds=round(time.time() - t0, 1),
                      proxy_seconds=float(np.mean([r["seconds"] for r in recs])))
            if tech is not None:
                st["spearman_tech"] = float(spearmanr(swarm @ tech, obj).statistic)
            results[name] = st
            print(f"{name}: seed_sd {st['seed_sd']:.4f} paired_sd {st['paired_sd']:.4f} swarm_sd {st['swarm_sd']:.4f} "
                  f"snr {st['snr']:.2f} tech rho {st.get('spearman_tech', float('nan')):.2f} "
                  f"train_loss {st['train_loss']:.3f} ({st['seconds']:.0f} s, {st['proxy_seconds']:.1f} s/proxy)",
                  flush=True)
            write_result(Path(a.out), results, indent=1)


if __name__ == "__main__":
    main()
