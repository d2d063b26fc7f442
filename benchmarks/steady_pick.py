"""One run, one dependable answer? Default searches over many seeds, and their picks replayed.

A search's found objective moves with its search seed. This benchmark trains the default
search (8 -> 8 -> 8 -> 4, from scratch) on one base folder per preset, one run per search
seed, and keeps each run's whole swarm in its record (every proxy's mixture and objective,
the replicates, the comparison), so that any other final rule can be replayed on the same
trajectory later, in another session, from the record alone:

    # train the default runs that are missing (a copy of the base each; about 8 min a run on 2 cores)
    python benchmarks/steady_pick.py train --preset tech --seeds 20 21 22 23 24 25 26 27 28 29

    # replay final rules on every recorded run: the pick changes, the trajectory does not;
    # each new pick is trained on the comparison seeds (paired with the runs' baselines)
    python benchmarks/steady_pick.py replay --preset tech --seeds 20 ... 29 --rules seen predicted-mean ...

    # the spread of the found objective split into measurement, pick and region
    python benchmarks/steady_pick.py decompose --preset tech --seeds 20 ... 29 --json benchmarks/results/steady_decompose_tech.json

    # every recorded run read together: a ridge line fitted on the other runs' swarms forecasts each
    # run's found mixture and replayed picks; searches simulated on that line at several proxy noises
    python benchmarks/steady_pick.py pooled --preset bench --seeds 20 ... 27 --rules measured-denoised
    python benchmarks/steady_pick.py line-searches --preset bench --seeds 20 ... 27

Runs are `runs/g49<preset>_default_s<seed>`, the base `runs/g49<preset>_base`, records
`benchmarks/results/records/g49<preset>_default_s<seed>.json`. The comparison uses ten
seeds (`search.eval_seeds = 10`), so that the measurement's own noise can be read off by
splitting them in halves. Only the first seed's run trains uniform and natural; every run
on the same base is judged against those (same mixtures, same seeds, same base: the same
proxies).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from common import write_result  # noqa: E402

EVAL_SEEDS = 10
DEFAULT_SETS = ["search.experts=0", "search.iterations=[8,8,8,4]", f"search.eval_seeds={EVAL_SEEDS}"]
# Searches judged against the default, each on the same base and comparison seeds (the rule in
# docs/benchmarks/steady-answer.md, "The next measurement"): arm -> its search settings.
ARMS = {
    "default": DEFAULT_SETS,
    # The region, not the pick, moves the answer: the same 28 proxies, half of them spent on a
    # first round twice as wide, before the predictor steers.
    "wide": ["search.experts=0", "search.iterations=[16,8,4]", f"search.eval_seeds={EVAL_SEEDS}"],
    # The wide first round still missed the tech clusters on a seed: half of the pool (so half of
    # the first round) drawn around the clusters the target's documents read like.
    "target": DEFAULT_SETS + ["search.target_prior=0.5"],
    # The target arm's search with its last iteration spent on two finalists, each trained on two
    # further shared seeds, the pick the finalist with the best mean.
    "target-final": DEFAULT_SETS + ["search.target_prior=0.5", "search.finalists=2"],
    # The target arm's search with its last round twice as large at the same 28 proxies (its last
    # round's new mixtures gave the pick in 7 seeds of 10; the finalists, who gave it up, lost).
    "target-last": ["search.experts=0", "search.iterations=[8,8,4,8]", f"search.eval_seeds={EVAL_SEEDS}",
                    "search.target_prior=0.5"],
    # The target arm's search with the measured near-best averaged as its final pick.
    "target-mean4": DEFAULT_SETS + ["search.target_prior=0.5", 'search.final="measured-predicted"',
                                    "search.final_top_k=4"],
}
PRESETS = {
    "tech": {"config": "pipelines/demo.toml", "sets": [], "known_answer": True},
    "sport": {"config": "pipelines/demo.toml",
              "sets": ['corpus.build="demo:sport"', 'target.texts=["{run}/data/target/sport_heldout.jsonl"]'],
              "known_answer": True},
    "bench": {"config": "pipelines/bench.toml", "sets": ["corpus.max_shards=2"], "known_answer": False,
              "extra": ['search.baselines=["uniform","natural"]']},
}
RECORDS = REPO / "benchmarks" / "results" / "records"


def names(preset: str, seed: int | None = None, arm: str = "default") -> Path:
    return REPO / "runs" / (f"g49{preset}_base" if seed is None else f"g49{preset}_{arm}_s{seed}")


def _climb(args: list[str], log_path: Path) -> None:
    cmd = [sys.executable, "-m", "climb.cli"] + args
    print(" ".join(cmd), flush=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                       env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))


def common_args(preset: str) -> list[str]:
    p = PRESETS[preset]
    return ["--config", p["config"]] + [a for s in p["sets"] for a in ("--set", s)]


def record(run: Path, known_answer: bool) -> dict:
    """The run as `variant_pair.record` reads it, with its whole swarm and, where the target
    is a held-out section, every cluster's share of it (so a replayed pick's share is known)."""
    from benchmarks.variant_pair import record as base_record
    from climb.runtime import results as results_log
    from climb.runtime.layout import RunPaths
    rec = base_record(run)
    paths = RunPaths(run)
    rec["swarm"] = [{k: r.get(k) for k in ("mixture_id", "iteration", "seed", "weights", "objective", "status",
                                           "metrics")}
                    for r in results_log.load(paths.search.results)]
    if paths.search.finalists.exists():  # search.finalists: the finalists, their seeds and records
        rec["finalists"] = json.loads(paths.search.finalists.read_text())
    if known_answer:
        from benchmarks.demo_answer import analyse
        a = analyse(run)
        rec["held_out_share"] = a["tech_share"]
        rec["cluster_held_out_share"] = a["cluster_tech_share"]
    return rec


def ensure_base(preset: str) -> Path:
    """The preset's base folder, built where it is missing; one process builds it while any other
    waits on a lock (queue items on one base may start together on a new machine)."""
    import fcntl
    base = names(preset)
    base.parent.mkdir(parents=True, exist_ok=True)
    with open(base.with_suffix(".build-lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / "tokenize" / "manifest.json").exists():
            _climb(["tokenize", "--run", str(base)] + common_args(preset), base.with_suffix(".log"))
    return base


def train(preset: str, seeds: list[int], arm: str = "default") -> None:
    ensure_base(preset)
    for i, seed in enumerate(seeds):
        run, kept = names(preset, seed, arm), RECORDS / f"{names(preset, seed, arm).name}.json"
        if kept.exists():
            continue
        # The first seed of an arm trains the baselines: the default's judge the rest, and another
        # arm's check that its base (rebuilt, perhaps on another day) gives the default's figures.
        first = not any(RECORDS.glob(f"g49{preset}_{arm}_s*.json")) and i == 0
        _search_run(preset, seed, arm, baselines=first)
        rec = record(run, PRESETS[preset]["known_answer"])
        if arm != "default":
            rec["base_check"] = base_check(preset, rec)
        write_result(kept, rec, indent=1)
        print(f"recorded {kept.name}" + (f" (base check: {rec['base_check']})" if arm != "default" else ""),
              flush=True)


def _search_run(preset: str, seed: int, arm: str, baselines: bool) -> Path:
    """The arm's search of `seed` in its own folder (a copy of the base); a finished one is left."""
    base, run = names(preset), names(preset, seed, arm)
    if not (run / "search" / "manifest.json").exists():
        if not run.exists():
            shutil.copytree(base, run, copy_function=shutil.copy2)
        sets = [f"search.seed={seed}"] + ARMS[arm] + PRESETS[preset].get("extra", []) + (
            [] if baselines else ["search.baselines=[]"])
        _climb(["search", "--run", str(run)] + common_args(preset) + [a for s in sets for a in ("--set", s)],
               run.with_suffix(".log"))
    return run


def restore(preset: str, seed: int, arm: str = "default") -> Path:
    """A recorded run's folder where only its record is left (a new machine keeps the records, not
    the runs), for what reads the folder itself (a reused search names it): the base built where it
    is missing, the search run again without the baselines, and its found mixture checked against
    the record's. A search on the same base and seed trains the same proxies, so a difference means
    another base or another search, and the folder is refused."""
    import numpy as np
    run = names(preset, seed, arm)
    rec = json.loads((RECORDS / f"{run.name}.json").read_text())
    ensure_base(preset)
    _search_run(preset, seed, arm, baselines=False)
    got = json.loads((run / "search" / "mixture.json").read_text())["weights"]
    if not np.allclose(got, rec["mixtures"]["weights"], atol=1e-6):
        raise SystemExit(f"{run.name}: the search run again finds another mixture than its record "
                         f"(L1 {np.abs(np.subtract(got, rec['mixtures']['weights'])).sum():.2e}); its base or "
                         "search is not the recorded one")
    return run


def base_check(preset: str, rec: dict) -> str:
    """Whether an arm's baselines, where it trained them, match the default's to 1e-9."""
    ours = {n: {s: rec["comparison"][f"{n}/{s}"]["objective"] for s in rec["comparison_seeds"]}
            for n in ("uniform", "natural") if f"{n}/{rec['comparison_seeds'][0]}" in rec["comparison"]}
    if not ours:
        return "not trained here"
    theirs = _baselines(preset)
    if not theirs:
        return "not checked: no default run of this preset has recorded its baselines yet"
    worst = max(abs(ours[n][s] - theirs[n][str(s)]) for n in ours for s in ours[n])
    return "same base" if worst < 1e-9 else f"DIFFERENT BASE: baselines differ by up to {worst:.2e}"


# Final rules a replay can make: search.* settings on top of the run's own.
RULES = {
    "seen": {"search.final": "seen"},
    "measured-predicted": {"search.final": "measured-predicted"},
    "predicted": {"search.final": "predicted", "search.final_top_k": 1},
    "predicted-mean16": {"search.final": "predicted", "search.final_top_k": 16},
    "predicted-mean128": {"search.final": "predicted", "search.final_top_k": 128},
    "predicted-kl": {"search.final": "predicted", "search.final_top_k": 16, "search.final_kl": 0.05},
    # The mean of the four measured mixtures the predictor rates best (each once): an average over
    # the measured near-best instead of the one proxy that measured luckiest.
    "measured-mean4": {"search.final": "measured-predicted", "search.final_top_k": 4},
    # The measured mixture the predictor rates best when it takes each measurement to carry at least
    # the run's measured seed noise (search.final_noise = "measured"): where the seeds move a proxy
    # as much as the mixtures do, the predictor smooths over the luck instead of reproducing it.
    "measured-denoised": {"search.final": "measured-predicted", "search.final_noise": "measured"},
}


def run_config(preset: str, seed: int, rule: str = "seen", arm: str = "default"):
    """The config a recorded run searched under, with `rule`'s final settings."""
    from climb.config import load_config
    p = PRESETS[preset]
    base = names(preset)
    sets = [x.replace("{run}", str(base)) for x in p["sets"]] + [f"search.seed={seed}"] + ARMS[arm]
    sets += [f"{k}={json.dumps(v)}" for k, v in RULES[rule].items()]
    return load_config(REPO / p["config"], sets)


def _space(preset: str, cfg) -> dict:
    """The mixture space a run on the preset's base searched, with the target's affinity recomputed on
    the base where the config uses it (so the pool is drawn as the run drew it)."""
    import numpy as np

    from climb.runtime.layout import RunPaths
    from climb.stages.search.common import mixture_space
    from climb.stages.tokenize import cluster_tokens
    paths = RunPaths(names(preset))
    space = mixture_space(cfg, cluster_tokens(paths))
    if cfg.search.target_prior:
        from climb.stages.search.affinity import target_affinity
        space["target"] = np.asarray(target_affinity(cfg, paths, space["usable"], write=False)["share"])
    return space


def replay_pick(preset: str, rec: dict, rule: str, arm: str = "default") -> dict:
    """The pick `rule` makes on the recorded run's results (the trajectory is the record's)."""
    from climb.stages.search.common import final_mixture, replicate_noise
    cfg = run_config(preset, rec["search_seed"], rule, arm)
    pick = final_mixture(cfg, _space(preset, cfg), rec["swarm"],
                         noise=replicate_noise(rec["quality"].get("replicates") or {}))
    return {"weights": pick["weights"], "predicted": pick["predicted"], "steadiness": pick.get("steadiness")}


def recorded(preset: str, seed: int, arm: str):
    """(record, config, mixture space) of a recorded run, the space as its search drew its pool;
    None where there is no record."""
    f = RECORDS / f"g49{preset}_{arm}_s{seed}.json"
    if not f.exists():
        return None
    cfg = run_config(preset, seed, arm=arm)
    return json.loads(f.read_text()), cfg, _space(preset, cfg)


def replays_file(preset: str, arm: str) -> Path:
    """Where the replayed picks on an arm's recorded runs are kept."""
    return RECORDS / (f"g49{preset}_replays.json" if arm == "default" else f"g49{preset}_{arm}_replays.json")


def figure(preset: str, seeds: list[int], arm: str, out: str | None) -> dict:
    """Each recorded run's own steadiness figures, made again from its record (the pick and the
    posterior regret the predictor allows it, climb.optimize.pick.posterior_regret; the bootstrap
    pick_sd), against the seed-to-seed sd of the found objective: the figure should be within a
    factor of 2 of that sd (issue 49, step 3)."""
    import numpy as np

    from climb.stages.search.common import final_mixture
    rows = []
    for s in seeds:
        if (got := recorded(preset, s, arm)) is None:
            continue
        rec, cfg, space = got
        pick = final_mixture(cfg, space, rec["swarm"])
        if cfg.search.finalists:  # the steadiness figures are the predictor's; the pick is the finalists'
            from climb.stages.search.finalists import pick as finalist
            best = np.asarray(finalist(cfg, rec["finalists"])[0]["weights"], float)
            pick["weights"] = (best / best.sum()).tolist()
        if not np.allclose(pick["weights"], rec["mixtures"]["weights"], atol=1e-6):
            raise SystemExit(f"seed {s}: the replayed pick is not the recorded one; the record's search differs")
        st = pick["steadiness"]
        rows.append({"seed": s, "found": rec["score"], "posterior_spread": st["posterior_spread"],
                     "posterior_regret": st["posterior_regret"], "pick_sd": st["pick_sd"]})
        print(f"seed {s}: found {rec['score']:.4f}, posterior spread {st['posterior_spread']:.4f}, regret "
              f"{st['posterior_regret']:.4f}, bootstrap pick_sd {st['pick_sd']:.4f}", flush=True)
    sd = float(np.std([r["found"] for r in rows], ddof=1))
    rms = {k: float(np.sqrt(np.mean([r[k] ** 2 for r in rows]))) for k in ("posterior_spread", "posterior_regret",
                                                                        "pick_sd")}
    obj = {"preset": preset, "arm": arm, "seeds": [r["seed"] for r in rows], "per_seed": rows, "found_sd": sd,
           "rms": rms, "ratio": {k: v / sd for k, v in rms.items()},
           "within_2x": {k: 0.5 <= v / sd <= 2.0 for k, v in rms.items()}}
    print(json.dumps({k: v for k, v in obj.items() if k != "per_seed"}, indent=1))
    if out:
        write_result(out, obj)
    return obj


def simulated(preset: str, seeds: list[int], arm: str, samples: int = 2, runs: int = 4, pool: int = 1000,
              out: str | None = None, truth: str = "sample") -> dict:
    """Another candidate for a run's own steadiness figure: the whole search simulated on the run's
    posterior. The predictor's GP, fitted on a recorded run's proxies, is sampled jointly over a pool
    drawn as the run draws its own (`samples` functions); on each, the search is simulated
    (climb.optimize.strategy.simulate, the run's iterations and strategy, measurements with the run's
    paired noise) with `runs` search seeds; the figure is the RMS over samples of the sd of the
    simulated picks' values, against the seed-to-seed sd of the recorded found objectives.

    `truth = "mean"`: the search simulated on the posterior mean alone (one function, `samples` x
    `runs` search seeds): the spread a re-run would show if the run's own view of the landscape were
    right, the predictor's doubt about regions nobody measured left out.

    `truth = "neighbours"`: the figure every run now keeps as `steadiness.rerun_sd`
    (climb.stages.search.common.rerun_figure): the search simulated eight times on what the run's
    measured mixtures say of their neighbourhood (climb.optimize.rerun.neighbours_mean); no region can
    be better than the best measured, so a run whose measurements all sit in one region sees its
    re-runs land there."""
    import numpy as np

    from climb.optimize.acquisition import gp_posterior, spread_model
    from climb.optimize.predictor import make_predictor
    from climb.optimize.strategy import from_search_config, simulate
    from climb.stages.search.common import candidate_pool
    rows = []
    for s in seeds:
        if (got := recorded(preset, s, arm)) is None:
            continue
        rec, cfg, space = got
        noise = rec["quality"].get("paired_sd") or 0.0
        if truth in ("neighbours", "trend", "predicted"):
            from climb.stages.search.common import rerun_figure
            rows.append({"seed": s, "found": rec["score"],
                         "simulated_spread": rerun_figure(cfg, space, rec["swarm"], noise, truth=truth)["rerun_sd"]})
            print(f"seed {s}: found {rec['score']:.4f}, simulated spread {rows[-1]['simulated_spread']:.4f}", flush=True)
            continue
        ok = [r for r in rec["swarm"] if r["status"] == "ok"]
        X, y = np.array([r["weights"] for r in ok]), np.array([r["objective"] for r in ok])
        P = candidate_pool(cfg, space, pool, s + 7)
        gp = spread_model(make_predictor(cfg.search.predictor, seed=s).fit(X, y), X, y, s)
        mean, cov = gp_posterior(gp, P, full_cov=True)
        root = np.linalg.cholesky(cov + 1e-8 * np.mean(np.diag(cov)) * np.eye(len(P)))
        rng = np.random.default_rng(s)
        strategy = from_search_config(cfg.search)
        sds = []
        for k in range(1 if truth == "mean" else samples):
            fk = mean if truth == "mean" else mean + root @ rng.standard_normal(len(P))
            n_runs = samples * runs if truth == "mean" else runs
            picks = [simulate(P, fk, rec["goal"], cfg.search.iterations, strategy, seed=1000 * k + j, noise=noise)["pick"]
                     for j in range(n_runs)]
            sds.append(float(np.std(fk[picks], ddof=1)))
        rows.append({"seed": s, "found": rec["score"], "simulated_spread": float(np.sqrt(np.mean(np.square(sds))))})
        print(f"seed {s}: found {rec['score']:.4f}, simulated spread {rows[-1]['simulated_spread']:.4f}", flush=True)
    sd = float(np.std([r["found"] for r in rows], ddof=1))
    rms = float(np.sqrt(np.mean([r["simulated_spread"] ** 2 for r in rows])))
    obj = {"preset": preset, "arm": arm, "seeds": [r["seed"] for r in rows], "per_seed": rows, "found_sd": sd,
           "rms_simulated_spread": rms, "ratio": rms / sd, "samples": samples, "runs": runs, "pool": pool,
           "truth": truth}
    print(json.dumps({k: v for k, v in obj.items() if k != "per_seed"}, indent=1))
    if out:
        write_result(out, obj)
    return obj


def _keep_replay(kept: Path, name: str, entry: dict) -> None:
    """Write one replayed pick into the arm's replay file, merged under a lock with what is there:
    two replays of one arm (one rule each) may run side by side without losing each other's proxies."""
    import fcntl
    kept.parent.mkdir(parents=True, exist_ok=True)
    with open(kept.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        have = json.loads(kept.read_text()) if kept.exists() else {}
        have[name] = entry
        tmp = kept.with_suffix(".tmp")
        write_result(tmp, have, indent=1)
        tmp.replace(kept)


BASE_TOL = 1e-6  # a proxy's objective on a rebuilt base against the record's (noise: 1e-3 and more)
_checked: dict = {}


def same_base(preset: str, rec: dict) -> str:
    """Refuse to replay a run on a base other than the one it searched on: its replays would not be
    paired with its comparison. The same digest (centroids and tokenizer bytes) passes; another one
    (a base rebuilt: faiss and the tokenizer need not give the same bytes twice) passes if a natural
    mixture's proxy on the first comparison seed, trained here, gives the objective some record on
    that digest has for it, within BASE_TOL. Returns how it passed."""
    from benchmarks.variant_pair import base_digest
    here = base_digest(names(preset))
    theirs = rec.get("base")
    if not theirs or theirs == here:
        return "same digest"
    if (here, theirs) in _checked:
        return _checked[here, theirs]
    kept = names(preset) / "base_checks.json"  # a check passed once holds for the folder's life
    done = json.loads(kept.read_text()) if kept.exists() else {}
    if f"{here} {theirs}" in done:
        _checked[here, theirs] = done[f"{here} {theirs}"]
        return _checked[here, theirs]
    seed = rec["comparison_seeds"][0]
    src = next((r for f in sorted(RECORDS.glob(f"g49{preset}_*_s*.json"))
                if (r := json.loads(f.read_text())).get("base") == theirs and f"natural/{seed}" in r["comparison"]), None)
    if src is None:
        raise SystemExit(f"{names(preset)} (digest {here}) is not the base g49{preset} run seed {rec['search_seed']} "
                         f"searched on ({theirs}), and no record on that base has a natural proxy to check it by")
    from climb.runtime.layout import RunPaths
    from climb.runtime.proxy_runs import train_and_score
    from climb.stages.search.common import proxy_task
    c = src["comparison"][f"natural/{seed}"]
    got = train_and_score(proxy_task(run_config(preset, src["search_seed"]), RunPaths(names(preset)),
                                     f"base-check-{seed}", -1, c["weights"], seed))["objective"]
    if abs(got - c["objective"]) > BASE_TOL:
        raise SystemExit(f"{names(preset)} (digest {here}) is not the base seed {rec['search_seed']} searched on "
                         f"({theirs}): natural on seed {seed} gives {got:.9f} here, {c['objective']:.9f} there")
    _checked[here, theirs] = f"rebuilt base, natural on seed {seed} within {abs(got - c['objective']):.1e}"
    done = json.loads(kept.read_text()) if kept.exists() else {}
    done[f"{here} {theirs}"] = _checked[here, theirs]
    write_result(kept, done, indent=1)
    print(f"base check: {_checked[here, theirs]} of the record's ({theirs} -> {here})", flush=True)
    return _checked[here, theirs]


def replay(preset: str, seeds: list[int], rules: list[str], arm: str = "default") -> None:
    """Each rule's pick on each recorded run of `arm`, trained on the comparison seeds in the base
    folder (kept proxy by proxy in benchmarks/results/records/g49<preset>[_<arm>]_replays.json, so
    a killed replay goes on where it stopped)."""
    from climb.runtime.executor import make_executor
    from climb.runtime.layout import RunPaths
    from climb.stages.search.common import proxy_task, run_proxies
    out_dir = REPO / "runs" / f"g49{preset}_replay"
    out_dir.mkdir(parents=True, exist_ok=True)
    kept = replays_file(preset, arm)
    have = json.loads(kept.read_text()) if kept.exists() else {}
    base = RunPaths(ensure_base(preset))
    for seed in seeds:
        rec = json.loads((RECORDS / f"g49{preset}_{arm}_s{seed}.json").read_text())
        todo_rules = [r for r in rules if len(have.get(f"{r}/s{seed}", {}).get("objective", {})) < EVAL_SEEDS]
        if todo_rules:  # nothing to train: no base to check
            same_base(preset, rec)
        for rule in todo_rules:
            name = f"{rule}/s{seed}"
            pick = replay_pick(preset, rec, rule, arm)
            entry = {**pick, "search_seed": seed, "rule": rule, "objective": dict(have.get(name, {}).get("objective", {}))}
            same = max(abs(a - b) for a, b in zip(pick["weights"], rec["mixtures"]["weights"])) < 1e-12
            if same:  # the run's own pick: its comparison proxies are the record's
                entry["objective"] = {str(s): rec["comparison"][f"climb/{s}"]["objective"]
                                      for s in rec["comparison_seeds"]}
            else:
                cfg = run_config(preset, seed, rule, arm)
                todo = [s for s in rec["comparison_seeds"] if str(s) not in entry["objective"]]
                tag = rule if arm == "default" else f"{arm}-{rule}"
                tasks = [proxy_task(cfg, base, f"replay-{tag}-s{seed}-{s}", -1, pick["weights"], s) for s in todo]

                def got(i, r, entry=entry, todo=todo, name=name):  # kept proxy by proxy: a kill loses one
                    entry["objective"][str(todo[i])] = r["objective"]
                    _keep_replay(kept, name, entry)
                with make_executor(cfg.executor, 1) as ex:
                    run_proxies(cfg, ex, tasks, f"replay {name}", got)
            if "cluster_held_out_share" in rec:
                entry["held_out_share"] = float(sum(w * c for w, c in zip(pick["weights"],
                                                                          rec["cluster_held_out_share"])))
            entry["same_as_run"] = same
            _keep_replay(kept, name, entry)
            print(f"{name}: {sum(entry['objective'].values()) / len(entry['objective']):.4f}"
                  f"{' (the run pick)' if same else ''}", flush=True)


def more_file(preset: str, arm: str) -> Path:
    """Where an arm's picks trained on further comparison seeds are kept (`more_seeds`)."""
    return RECORDS / f"g49{preset}_{arm}_more.json"


def more_seeds(preset: str, seeds: list[int], rule: str, arm: str, comparison: list[int]) -> None:
    """The pick `rule` makes on each recorded run of `arm` ("seen": the run's own pick, as recorded)
    trained on comparison seeds its judgement did not read, so a pick found by looking at the first
    ten is judged on data that did not select it (kept proxy by proxy in g49<preset>_<arm>_more.json,
    entries "<rule>/s<seed>"; a killed run goes on where it stopped)."""
    from climb.runtime.executor import make_executor
    from climb.runtime.layout import RunPaths
    from climb.stages.search.common import proxy_task, run_proxies
    kept = more_file(preset, arm)
    have = json.loads(kept.read_text()) if kept.exists() else {}
    base = RunPaths(ensure_base(preset))
    for seed in seeds:
        rec = json.loads((RECORDS / f"g49{preset}_{arm}_s{seed}.json").read_text())
        name = f"{rule}/s{seed}"
        done = dict(have.get(name, {}).get("objective", {}))
        todo = [c for c in comparison if str(c) not in done]
        if not todo:
            continue
        same_base(preset, rec)
        weights = rec["mixtures"]["weights"] if rule == "seen" else replay_pick(preset, rec, rule, arm)["weights"]
        replayed = json.loads(replays_file(preset, arm).read_text()).get(name) if replays_file(preset, arm).exists() \
            else None
        if replayed and max(abs(a - b) for a, b in zip(weights, replayed["weights"])) > 1e-9:
            raise SystemExit(f"{name}: the pick made again differs from the replayed one; not the same pick")
        entry = {"weights": weights, "search_seed": seed, "rule": rule, "objective": done}
        cfg = run_config(preset, seed, rule, arm)
        tasks = [proxy_task(cfg, base, f"more-{arm}-{rule}-s{seed}-{c}", -1, weights, c) for c in todo]

        def got(i, r, entry=entry, todo=todo, name=name):
            entry["objective"][str(todo[i])] = r["objective"]
            _keep_replay(kept, name, entry)
        with make_executor(cfg.executor, 1) as ex:
            run_proxies(cfg, ex, tasks, f"more seeds {arm} {name}", got)
        print(f"{arm} {name}: {sum(entry['objective'].values()) / len(entry['objective']):.4f} on "
              f"{len(entry['objective'])} further seeds", flush=True)


def judge_more(preset: str, seeds: list[int], rule: str, arm: str, comparison: list[int], out: str | None,
               sd_limit: float = 0.0025, margin: float = 0.002) -> dict:
    """Rule 032dd95's bench steps 3 and 4 on the further comparison seeds alone: the picks' sd between
    search seeds with the comparison's noise out (`between_sd`), and, where the default search's own
    picks are trained on the same seeds, the paired difference by search seed."""
    import numpy as np

    from climb.optimize.quality import paired_comparison
    cs = [str(c) for c in comparison]

    def table(a: str, r: str):
        f = more_file(preset, a)
        have = json.loads(f.read_text()) if f.exists() else {}
        rows = {s: [have[f"{r}/s{s}"]["objective"][c] for c in cs] for s in seeds
                if all(c in have.get(f"{r}/s{s}", {}).get("objective", {}) for c in cs)}
        return rows
    ours, theirs = table(arm, rule), table("default", "seen")
    if len(ours) < len(seeds):
        raise SystemExit(f"{arm} {rule} on {preset}: seeds {sorted(ours)} of {seeds} have all {len(cs)} further "
                         "comparison seeds; nothing judged")
    goal = json.loads((RECORDS / f"g49{preset}_{arm}_s{seeds[0]}.json").read_text())["goal"]
    bsd = between_sd([ours[s] for s in seeds])
    obj = {"preset": preset, "arm": arm, "rule": rule, "seeds": seeds, "comparison_seeds": comparison,
           "found": {str(s): float(np.mean(ours[s])) for s in seeds}, "between_sd": bsd,
           "checks": {"sd": bsd["estimate"] <= sd_limit}}
    if len(theirs) == len(seeds):
        d = paired_comparison([float(np.mean(ours[s])) for s in seeds], [float(np.mean(theirs[s])) for s in seeds],
                              goal)
        obj["default_found"] = {str(s): float(np.mean(theirs[s])) for s in seeds}
        obj["minus_default"] = {"diff": d["diff"], "ci95": d["ci95"]}
        obj["checks"]["paired_upper"] = d["ci95"] is not None and d["ci95"][1] < margin
    obj["passes"] = all(obj["checks"].values()) and "paired_upper" in obj["checks"]
    print(json.dumps({k: v for k, v in obj.items() if k not in ("found", "default_found")}, indent=1))
    if out:
        write_result(out, obj)
    return obj


def tl_mean4_gate(step: int) -> int:
    """Rule 032dd95's steps run in order, each only if the one before passed: 0 where `step` may
    run, 3 where a step before it failed (nothing to run), SystemExit while one is not yet judged."""
    import contextlib
    import io
    quiet = contextlib.redirect_stdout(io.StringIO())
    with quiet:
        for preset in ("tech", "sport"):  # steps 1 and 2
            obj = judge(preset, list(range(20, 30)), "target-last", None, "measured-mean4")
            if len(obj["seeds"]) < 10:
                raise SystemExit(f"TL-mean4 on {preset}: {len(obj['seeds'])} of 10 seeds replayed; not judged yet")
            if not obj["passes"]:
                return 3
        if step <= 3:
            return 0
        if not judge_more("bench", R_STAR_SEEDS, "measured-mean4", "target-last", list(range(10017, 10047)),
                          None)["checks"]["sd"]:  # step 3
            return 3
    return 0


def _baselines(preset: str) -> dict:
    """uniform and natural on the comparison seeds, from the run that trained them."""
    for f in sorted(RECORDS.glob(f"g49{preset}_default_s*.json")):
        rec = json.loads(f.read_text())
        b = {n: {str(s): rec["comparison"][f"{n}/{s}"]["objective"] for s in rec["comparison_seeds"]}
             for n in ("uniform", "natural") if f"{n}/{rec['comparison_seeds'][0]}" in rec["comparison"]}
        if b:
            return b
    return {}


def spread(records: list[dict]) -> dict:
    """What finished default runs alone say (no replay needed): the sd of the found objective over
    search seeds, the measurement's share of it (the run x comparison-seed residual of the climb
    mixture's proxies: every run uses the same comparison seeds, so a seed's common effect cancels),
    and the winner's curse (the found mixture's comparison mean minus its own search measurement:
    a pick that chased a lucky proxy measures worse when trained again)."""
    import numpy as np
    cs = records[0]["comparison_seeds"]
    V = np.array([[r["comparison"][f"climb/{c}"]["objective"] for c in cs] for r in records])
    S, E = V.shape
    meas_sd = between_sd(V)["noise"]
    F = V.mean(1)
    best = np.array([r["mixtures"]["best_seen"]["objective"] for r in records])
    share = [r["held_out_share"]["climb"] for r in records if "held_out_share" in r]
    return {"runs": S, "comparison_seeds": E, "found_sd": float(F.std(ddof=1)),
            "found_range": [float(F.min()), float(F.max())], "measurement_sd": meas_sd,
            "measurement_share_of_variance": meas_sd ** 2 / float(F.var(ddof=1)),
            "best_seen_sd": float(best.std(ddof=1)), "curse_mean": float((F - best).mean()),
            "curse_sd": float((F - best).std(ddof=1)), "corr_best_seen_found": float(np.corrcoef(best, F)[0, 1]),
            "held_out_share": [float(min(share)), float(max(share))] if share else None,
            "pick_sd": [(r["quality"].get("steadiness") or {}).get("pick_sd") for r in records]}


def _interaction(V):
    """A mixture x comparison-seed table's residual: each mixture's level and each seed's common
    effect taken out (the noise that does not cancel between mixtures sharing a seed)."""
    return V - V.mean(1, keepdims=True) - V.mean(0, keepdims=True) + V.mean()


def between_sd(V) -> dict:
    """The sd of the found mixtures' own objective across search seeds, the comparison's noise taken
    out: a seed x comparison-seed table's variance components (every run shares the comparison
    seeds, so their common effect cancels). `estimate` is sqrt(var(row means) - residual / E), 0
    where the noise explains it all; `lower95` bounds it from below (the row means' variance at its
    chi-square lower bound, less the noise's point estimate); `noise` is the sd a row mean carries."""
    import numpy as np
    from scipy.stats import chi2
    V = np.asarray(V, float)
    S, E = V.shape
    res = _interaction(V)
    noise_var = float((res ** 2).sum() / ((S - 1) * (E - 1)) / E)
    var_means = float(V.mean(1).var(ddof=1))
    lower = (S - 1) * var_means / float(chi2.ppf(0.975, S - 1)) - noise_var
    return {"estimate": float(np.sqrt(max(var_means - noise_var, 0.0))),
            "lower95": float(np.sqrt(max(lower, 0.0))), "noise": float(np.sqrt(noise_var)),
            "raw": float(np.sqrt(var_means)), "comparison_seeds": E}


def term_noise(tables: dict, coefs: dict) -> dict:
    """Which of the objective's terms carries its seed noise. `tables[term][m, e]`: term's value
    for mixture m on comparison seed e (every mixture on the same seeds); `coefs[term]`: its
    coefficient in the objective (a linear combination). Each table's mixture x seed residual (the
    seed's common effect and the mixture's own level taken out) is the noise that does not cancel
    between mixtures sharing a seed; a term's `share` is coef * cov(its residual, the objective's)
    / var(the objective's), so the shares sum to 1. `signal_sd` is the sd of the mixtures' means."""
    import numpy as np
    res, out = {}, {}
    tables = {t: np.asarray(V, float) for t, V in tables.items()}
    for t, V in tables.items():
        res[t] = _interaction(V)
    obj = sum(coefs[t] * res[t] for t in tables)
    S, E = obj.shape
    dof = (S - 1) * (E - 1)
    var_obj = float((obj ** 2).sum() / dof)
    for t, V in tables.items():
        out[t] = {"coef": coefs[t], "noise_sd": float(np.sqrt((res[t] ** 2).sum() / dof)),
                  "share": float(coefs[t] * (res[t] * obj).sum() / dof / var_obj),
                  "signal_sd": float(V.mean(1).std(ddof=1))}
    names = list(tables)
    corr = {f"{a} ~ {b}": float(np.corrcoef(res[a].ravel(), res[b].ravel())[0, 1])
            for i, a in enumerate(names) for b in names[i + 1:]}
    return {"mixtures": S, "comparison_seeds": E, "objective_noise_sd": float(np.sqrt(var_obj)),
            "terms": out, "residual_corr": corr}


def term_noise_preset(preset: str, out: str | None) -> dict:
    """`term_noise` on every mixture a preset's records trained on all ten comparison seeds (each
    run's found mixture, and uniform and natural once)."""
    from climb.config import load_config
    from climb.config.objective import coefficients
    cfg = load_config(REPO / PRESETS[preset]["config"])
    terms = list(cfg.target.objective)
    coefs = dict(coefficients(cfg.target) or [(t, 1.0 / len(terms)) for t in terms])
    tables, names, seeds = {t: [] for t in terms}, [], None
    for f in sorted(RECORDS.glob(f"g49{preset}_*_s*.json")):
        rec = json.loads(f.read_text())
        seeds = seeds or rec["comparison_seeds"]
        if rec["comparison_seeds"] != seeds:
            continue
        for n in ("climb", "uniform", "natural"):
            if not all(f"{n}/{c}" in rec["comparison"] for c in seeds) or (n != "climb" and n in names):
                continue
            names.append(n if n != "climb" else f.stem)
            for t in terms:
                tables[t].append([rec["comparison"][f"{n}/{c}"]["metrics"][t] for c in seeds])
    obj = {"preset": preset, "mixtures_read": names, **term_noise(tables, coefs)}
    print(json.dumps({k: v for k, v in obj.items() if k != "mixtures_read"}, indent=1))
    if out:
        write_result(out, obj)
    return obj


def decompose(preset: str, seeds: list[int], rules: list[str], out: str | None) -> dict:
    """The seed-to-seed spread of the found objective: the measurement's own noise (split halves of
    the comparison seeds), the pick (the rules' spread on one trajectory) and the region (the
    trajectory's mean over rules), as a seed x rule table's variance components."""
    import numpy as np

    from climb.optimize.quality import paired_comparison
    reps = json.loads((RECORDS / f"g49{preset}_replays.json").read_text())
    recs = {s: json.loads((RECORDS / f"g49{preset}_default_s{s}.json").read_text()) for s in seeds}
    seeds = [s for s in seeds if all(f"{r}/s{s}" in reps and len(reps[f"{r}/s{s}"]["objective"]) == EVAL_SEEDS
                                     for r in rules)]
    cs = [str(c) for c in recs[seeds[0]]["comparison_seeds"]]
    V = np.array([[[reps[f"{r}/s{s}"]["objective"][c] for c in cs] for r in rules] for s in seeds])  # seed, rule, eval
    F = V.mean(2)
    half = V[:, :, : len(cs) // 2].mean(2) - V[:, :, len(cs) // 2:].mean(2)
    meas_var = float(np.var(half, axis=0, ddof=1).mean() / 4)  # the error of a mean of all eval seeds
    base = _baselines(preset)
    per_rule = {}
    for j, r in enumerate(rules):
        row = {"sd": float(np.std(F[:, j], ddof=1)), "mean": float(F[:, j].mean()),
               "range": [float(F[:, j].min()), float(F[:, j].max())],
               "found": {str(s): float(F[i, j]) for i, s in enumerate(seeds)},
               "steadiness_pick_sd": {str(s): (reps[f"{r}/s{s}"].get("steadiness") or {}).get("pick_sd")
                                      for s in seeds}}
        if "held_out_share" in reps[f"{r}/s{seeds[0]}"]:
            sh = [reps[f"{r}/s{s}"]["held_out_share"] for s in seeds]
            row["held_out_share"] = [round(min(sh), 3), round(max(sh), 3)]
        if j:
            row["minus_" + rules[0]] = paired_comparison(F[:, j], F[:, 0], recs[seeds[0]]["goal"])
        for n, b in base.items():
            worst = []
            for i, s in enumerate(seeds):
                c = paired_comparison(V[i, j], [b[x] for x in cs], recs[seeds[0]]["goal"])
                worst.append(c["ci95"][1])
            row[f"worst_upper_vs_{n}"] = float(max(worst))
        per_rule[r] = row
    # Two-way table without replication: seed (region), rule, and their interaction (the pick's luck).
    g = F.mean()
    seed_eff, rule_eff = F.mean(1) - g, F.mean(0) - g
    inter = F - g - seed_eff[:, None] - rule_eff[None, :]
    n_s, n_r = F.shape
    ms_seed = n_r * float((seed_eff ** 2).sum()) / (n_s - 1)
    ms_inter = float((inter ** 2).sum()) / ((n_s - 1) * (n_r - 1)) if n_r > 1 else float("nan")
    out_obj = {"preset": preset, "seeds": seeds, "rules": rules, "eval_seeds": len(cs), "per_rule": per_rule,
               "variance": {"measurement": meas_var,
                            "pick (rule x seed interaction, less measurement)": max(ms_inter - meas_var, 0.0),
                            "region (seed, over rules, less its share of the rest)":
                                max((ms_seed - ms_inter) / n_r, 0.0),
                            "seen total": float(np.var(F[:, 0], ddof=1))}}
    print(json.dumps({k: v for k, v in out_obj.items() if k != "per_rule"}, indent=1))
    for r, row in per_rule.items():
        print(f"{r:20s} sd {row['sd']:.4f} mean {row['mean']:.4f} share {row.get('held_out_share')}"
              + (f" minus {rules[0]} {row['minus_' + rules[0]]['diff']:+.4f} {row['minus_' + rules[0]]['ci95']}"
                 if r != rules[0] else ""))
    if out:
        write_result(out, out_obj)
    return out_obj


def judge(preset: str, seeds: list[int], arm: str, out: str | None, rule: str = "seen") -> dict:
    """An arm against the default under the rule (docs/benchmarks/steady-answer.md, "The next
    measurement"): per seed its found objective, held-out share, steadiness and verdicts; overall
    the sd, the paired difference from the default by seed, the compute fraction, and whether it
    passes. `rule` other than "seen": the arm's trajectories with that final rule replayed on them
    (`replay --arm A --rules R` first); the search, so its compute, is the arm's."""
    import numpy as np

    from climb.optimize.quality import paired_comparison
    limits = {"tech": (0.006, 0.003), "bench": (0.0025, 0.002), "sport": (None, 0.005)}[preset]
    base = _baselines(preset)
    replays = json.loads(replays_file(preset, arm).read_text()) if rule != "seen" else {}
    rows, ours, theirs, cu, cd, own, mats = [], [], [], [], [], [], []
    for s in seeds:
        a, d = (RECORDS / f"g49{preset}_{arm}_s{s}.json"), (RECORDS / f"g49{preset}_default_s{s}.json")
        if not (a.exists() and d.exists()):
            continue
        ra, rd = json.loads(a.read_text()), json.loads(d.read_text())
        cs = [str(c) for c in ra["comparison_seeds"]]
        vals = [ra["comparison"][f"climb/{c}"]["objective"] for c in cs]
        share, steady = ra.get("held_out_share", {}).get("climb"), (ra["quality"].get("steadiness") or {}).get("pick_sd")
        if rule != "seen":
            entry = replays.get(f"{rule}/s{s}")
            if entry is None or len(entry["objective"]) < len(cs):
                continue
            own.append(float(np.mean(vals)))
            vals = [entry["objective"][c] for c in cs]
            share, steady = entry.get("held_out_share"), (entry.get("steadiness") or {}).get("pick_sd")
        verdicts = {n: paired_comparison(vals, [b[c] for c in cs], ra["goal"]) for n, b in base.items()}
        rows.append({"seed": s, "found": float(np.mean(vals)), "default": rd["score"],
                     "held_out_share": share, "steadiness": steady,
                     "verdicts": {n: {"diff": v["diff"], "ci95": v["ci95"], "verdict": v["verdict"]}
                                  for n, v in verdicts.items()}})
        ours.append(rows[-1]["found"])
        mats.append(vals)
        theirs.append(rd["score"])
        cu.append(ra["search_compute"]["token_params"])
        cd.append(rd["search_compute"]["token_params"])
    if len(rows) < 2:
        raise SystemExit(f"{arm} on {preset}: {len(rows)} seed(s) with both records; nothing to judge")
    sd = float(np.std(ours, ddof=1))
    goal = json.loads((RECORDS / f"g49{preset}_{arm}_s{rows[0]['seed']}.json").read_text())["goal"]
    diff = paired_comparison(ours, theirs, goal)
    shares = [r["held_out_share"] for r in rows if r["held_out_share"] is not None]
    better = all(v["verdict"] == "better" for r in rows for v in r["verdicts"].values())
    fraction = float(np.sum(cu) / np.sum(cd))
    need = {"tech": 10, "bench": 8, "sport": 5}[preset]
    checks = {"seeds": len(rows) >= need, "sd": limits[0] is None or sd <= limits[0],
              "paired_upper": diff["ci95"] is not None and diff["ci95"][1] < limits[1],
              "share": not shares or min(shares) >= 0.6, "beats_baselines": better, "compute": fraction <= 1.1}
    obj = {"preset": preset, "arm": arm, "rule": rule, "seeds": [r["seed"] for r in rows], "per_seed": rows,
           "sd": sd, "minus_default": diff["diff"], "ci95": diff["ci95"], "compute_fraction": fraction,
           "default_sd": float(np.std(theirs, ddof=1)), "checks": checks, "passes": all(checks.values()),
           "between_sd": between_sd(mats)}
    if own:  # the same trajectories with the arm's own pick, for what the rule changed
        mine = paired_comparison(ours, own, goal)
        obj["minus_arm_seen"] = {"diff": mine["diff"], "ci95": mine["ci95"], "sd_seen": float(np.std(own, ddof=1))}
    print(json.dumps({k: v for k, v in obj.items() if k != "per_seed"}, indent=1))
    if out:
        write_result(out, obj)
    return obj


# Rule 5bc1c02's R*: of the two picks replayed on target-last's eight bench runs, the one that holds
# there by 844a56c (upper end of replayed - own < 0); of two that hold, the lower mean.
R_STAR_FROM = ("measured-denoised", "measured-mean4")
R_STAR_SEEDS = list(range(20, 28))


def r_star(quiet: bool = True) -> str | None:
    """R* as rule 5bc1c02 names it, read from the bench replays; None where neither rule holds.
    Refuses (SystemExit) while either rule lacks one of its eight seeds."""
    import contextlib
    import io
    held = {}
    for rule in R_STAR_FROM:
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            try:
                obj = judge("bench", R_STAR_SEEDS, "target-last", None, rule)
            except SystemExit:
                obj = {"seeds": []}
        if obj["seeds"] != R_STAR_SEEDS:
            raise SystemExit(f"R*: {rule} has its replays on bench seeds {obj['seeds']}, not all of {R_STAR_SEEDS}; "
                             "nothing is named before both are judged")
        m = obj["minus_arm_seen"]
        if m["ci95"][1] < 0:
            held[rule] = m["diff"]
    return min(held, key=held.get) if held else None


def _swarm(rec: dict):
    """A record's finished proxies: their weights and objectives as arrays."""
    import numpy as np
    ok = [r for r in rec["swarm"] if r["status"] == "ok"]
    return np.array([r["weights"] for r in ok]), np.array([r["objective"] for r in ok])


def pooled(preset: str, seeds: list[int], arms: list[str], rules: list[str], out: str | None) -> dict:
    """What every recorded run's proxies say together: a ridge line in the weights (penalty by
    cross-validation) fitted to the swarms of all the other runs (every arm given, same base), used
    to forecast each run's found mixture, the picks `rules` would make on its trajectory, and the
    best of its own measured mixtures by that line. A diagnostic of where the spread comes from
    (the pick among measured mixtures, or the region they cover), read from the records alone; a
    forecast, not a measurement: the replays' comparison proxies decide."""
    import numpy as np
    from sklearn.linear_model import RidgeCV

    recs = {(a, s): json.loads(f.read_text()) for a in arms for s in seeds
            if (f := RECORDS / f"g49{preset}_{a}_s{s}.json").exists()}
    rows = []
    for key, rec in recs.items():
        others = [_swarm(r) for k, r in recs.items() if k != key]
        line = RidgeCV(alphas=np.logspace(-5, 2, 15)).fit(np.vstack([x for x, _ in others]),
                                                          np.concatenate([y for _, y in others]))
        X, y = _swarm(rec)
        at = lambda w: float(line.predict(np.asarray(w, float)[None])[0])  # noqa: E731
        row = {"arm": key[0], "seed": key[1], "found": rec["score"], "own": at(rec["mixtures"]["weights"]),
               "best_measured_by_line": float(line.predict(X).min() if rec["goal"] == "minimize"
                                              else line.predict(X).max()),
               "swarm_residual_sd": float(np.std(line.predict(X) - y, ddof=1))}
        row.update({r: at(replay_pick(preset, rec, r, key[0])["weights"]) for r in rules})
        rows.append(row)
        print(f"{key[0]} s{key[1]}: found {row['found']:.4f}, forecast own {row['own']:.4f}, "
              + ", ".join(f"{r} {row[r]:.4f}" for r in rules)
              + f", best measured by the line {row['best_measured_by_line']:.4f}", flush=True)
    found, own = np.array([r["found"] for r in rows]), np.array([r["own"] for r in rows])
    summary = {"corr_found_forecast": float(np.corrcoef(found, own)[0, 1]),
               "swarm_residual_sd": float(np.sqrt(np.mean([r["swarm_residual_sd"] ** 2 for r in rows])))}
    for a in arms:
        mine = [r for r in rows if r["arm"] == a]
        summary[a] = {n: {"mean": float(np.mean([r[n] for r in mine])), "sd": float(np.std([r[n] for r in mine], ddof=1))}
                      for n in ["found", "own", *rules, "best_measured_by_line"]}
    obj = {"preset": preset, "arms": arms, "seeds": seeds, "rules": rules, "per_run": rows, **summary}
    print(json.dumps({k: v for k, v in obj.items() if k != "per_run"}, indent=1))
    if out:
        write_result(out, obj)
    return obj


def line_searches(preset: str, seeds: list[int], arms: list[str], noises: list[float], runs: int = 12,
                  out: str | None = None, picks: tuple[str, ...] = ("seen", "measured-predicted"),
                  iterations: list[int] | None = None, truth_arms: list[str] | None = None) -> dict:
    """Searches simulated on the line every recorded run's proxies fit together (`pooled`): the truth
    a ridge line fitted to all the recorded swarms of `arms`, each simulated search drawing its own
    pool as a run does and measuring with proxy noise of each sd in `noises` (the bench's own is
    about 0.014). The sd of the picks' true values over `runs` simulated seeds says how steady a
    search of this size could be if proxies were that quiet; a screen, not a measurement. `picks`:
    `search.final` values, each optionally `:predictor` (`predicted:linear`: the search steered and
    the pick made by that predictor, `search.predictor`). The truth is a line, so a linear
    predictor is favoured here by construction: a screen for what to measure, nothing more.
    `iterations`: another shape than the arm's (e.g. half as many mixtures, each measured on two
    seeds: the arm's noise / sqrt(2) given in `noises`). `truth_arms`: the arms whose records the
    line is fitted to (default `arms`), so that searches of one arm are simulated on the same truth
    as the others'."""
    import numpy as np
    from dataclasses import replace as dc_replace
    from sklearn.linear_model import RidgeCV

    from climb.optimize.strategy import from_search_config, simulate
    from climb.stages.search.common import candidate_pool
    recs = [json.loads(f.read_text()) for a in (truth_arms or arms) for s in seeds
            if (f := RECORDS / f"g49{preset}_{a}_s{s}.json").exists()]
    X = np.vstack([_swarm(rec)[0] for rec in recs])
    y = np.concatenate([_swarm(rec)[1] for rec in recs])
    line = RidgeCV(alphas=np.logspace(-5, 2, 15)).fit(X, y)
    goal = recs[0]["goal"]
    table = {}
    for arm in arms:
        cfg = run_config(preset, seeds[0], arm=arm)
        space = _space(preset, cfg)
        its = iterations or cfg.search.iterations
        for noise in noises:
            for name in picks:
                final, _, predictor = name.partition(":")
                strategy = dc_replace(from_search_config(cfg.search), final=final,
                                      predictor=predictor or cfg.search.predictor)
                vals = []
                for j in range(runs):
                    P = candidate_pool(cfg, space, 1000, 100 + j)
                    f = line.predict(P)
                    vals.append(float(f[simulate(P, f, goal, its, strategy, seed=j, noise=noise)["pick"]]))
                table[f"{arm}/{noise:g}/{name}"] = {"mean": float(np.mean(vals)), "sd": float(np.std(vals, ddof=1))}
                print(f"{arm:12s} noise {noise:<7g} {name:26s} mean {np.mean(vals):.4f} sd {np.std(vals, ddof=1):.4f}",
                      flush=True)
    obj = {"preset": preset, "arms": arms, "seeds": seeds, "runs": runs, "records": len(recs), "proxies": int(len(y)),
           "iterations": iterations,
           "line_coef": line.coef_.tolist(), "table": table}
    if out:
        write_result(out, obj)
    return obj


def waiting(read, minutes: float, poll: float = 120.0):
    """`read()`, tried again every `poll` seconds for up to `minutes` while it refuses (SystemExit:
    what it reads is not all there yet); the last refusal is raised."""
    import time
    t_end = time.time() + 60 * minutes
    while True:
        try:
            return read()
        except SystemExit as e:
            if time.time() > t_end:
                raise
            print(f"{e}; waiting", flush=True)
            time.sleep(poll)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verb", choices=["train", "replay", "decompose", "spread", "judge", "figure",
                                         "simulated", "pooled", "line-searches", "term-noise", "more-seeds",
                                         "judge-more", "gate"])
    ap.add_argument("--step", type=int, default=3, help="gate: rule 032dd95's step (3 or 4) to run or not")
    ap.add_argument("--comparison-seeds", type=int, nargs="+", default=list(range(10017, 10047)),
                    help="more-seeds / judge-more: the further comparison seeds (default 10017-10046)")
    ap.add_argument("--arm", choices=list(ARMS), default="default", help="train / replay / judge / figure: which search")
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=["default", "target-last"],
                    help="pooled, line-searches: the arms whose runs are read together")
    ap.add_argument("--noises", type=float, nargs="+", default=[0.0137, 0.0068, 0.0034, 0.0],
                    help="line-searches: the proxy noise sds to simulate")
    ap.add_argument("--iterations", type=int, nargs="+", default=None,
                    help="line-searches: search.iterations instead of each arm's own")
    ap.add_argument("--truth-arms", nargs="+", choices=list(ARMS), default=None,
                    help="line-searches: the arms whose records the line is fitted to (default: --arms)")
    ap.add_argument("--runs", type=int, default=12, help="line-searches: simulated searches per cell")
    ap.add_argument("--picks", nargs="+", default=["seen", "measured-predicted"],
                    help="line-searches: search.final values, each optionally :predictor (e.g. predicted:linear)")
    ap.add_argument("--records", default="g49{preset}_default_s{seed}",
                    help="spread: the record names, e.g. g32tech_default_s{seed} for issue 32's runs")
    ap.add_argument("--preset", choices=list(PRESETS), default="tech")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(20, 30)))
    ap.add_argument("--rules", nargs="+", default=["seen", "measured-predicted", "predicted", "predicted-mean16"],
                    choices=list(RULES) + ["R*"],
                    help="replay: the final rules; R* is rule 5bc1c02's, read from the bench replays (nothing "
                         "is replayed where neither of its candidates held)")
    ap.add_argument("--rule", choices=list(RULES), default="seen",
                    help="judge: the final rule replayed on the arm's runs (replay --arm A --rules R first)")
    ap.add_argument("--truth", choices=["sample", "mean", "neighbours", "trend", "predicted"], default="sample",
                    help="simulated: search the GP's samples, its posterior mean, the measured neighbours' average (alone, around a ridge trend), or the run's predictor clipped to the measured range")
    ap.add_argument("--wait", type=float, default=0,
                    help="replay --rules R*, gate: minutes to wait for the measurements they read to finish")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    if a.verb == "train":
        train(a.preset, a.seeds, a.arm)
    elif a.verb == "judge":
        judge(a.preset, a.seeds, a.arm, a.json, a.rule)
    elif a.verb == "more-seeds":
        more_seeds(a.preset, a.seeds, a.rule, a.arm, a.comparison_seeds)
    elif a.verb == "gate":
        rc = waiting(lambda: tl_mean4_gate(a.step), a.wait)  # the steps before may be training in the other lane
        print(f"TL-mean4 step {a.step}: {'runs' if rc == 0 else 'not run, a step before it failed'}", flush=True)
        raise SystemExit(rc)
    elif a.verb == "judge-more":
        judge_more(a.preset, a.seeds, a.rule, a.arm, a.comparison_seeds, a.json)
    elif a.verb == "figure":
        figure(a.preset, a.seeds, a.arm, a.json)
    elif a.verb == "line-searches":
        line_searches(a.preset, a.seeds, a.arms, a.noises, runs=a.runs, out=a.json, picks=tuple(a.picks),
                      iterations=a.iterations, truth_arms=a.truth_arms)
    elif a.verb == "pooled":
        pooled(a.preset, a.seeds, a.arms, a.rules, a.json)
    elif a.verb == "simulated":
        simulated(a.preset, a.seeds, a.arm, out=a.json, truth=a.truth)
    elif a.verb == "spread":
        recs = [json.loads(f.read_text()) for f in (RECORDS / (a.records.format(preset=a.preset, seed=s) + ".json")
                                                     for s in a.seeds) if f.exists()]
        obj = spread(recs)
        print(json.dumps(obj, indent=1))
        if a.json:
            write_result(a.json, obj)
    elif a.verb == "term-noise":
        term_noise_preset(a.preset, a.json)
    elif a.verb == "replay":
        rules = a.rules
        if "R*" in rules:
            star = waiting(r_star, a.wait)  # the bench replays may still be training in the other lane
            print(f"R* (rule 5bc1c02): {star or 'none; neither candidate held on the bench, nothing to replay'}",
                  flush=True)
            rules = [r for r in rules if r != "R*"] + ([star] if star else [])
        if rules:  # nothing to replay builds no base
            replay(a.preset, a.seeds, rules, a.arm)
    else:
        decompose(a.preset, a.seeds, a.rules, a.json)


if __name__ == "__main__":
    main()
