"""Stage 5 (optional), validate: does the mixture transfer to a larger model?

Reads: `<run>/search/` (the found mixture, baselines and swarm) and `<run>/tokenize/`.
Writes: `<run>/validate/`: `plan.json`, `results.jsonl`, `summary.json`.

The search judges mixtures with small proxies. This stage trains a larger model
(`[validate]`: the proxy's width, depth and tokens multiplied, or any [proxy]
field set outright) and asks two questions of it:

1. Is the found mixture still better? The larger model is trained on the found
   mixture and on each baseline (uniform, natural, one-shot) with the same
   `validate.seeds` fresh seeds, and every difference is reported with its
   paired 95% interval and a verdict, on the search's target and on held-out
   evaluations the search never saw (`validate.texts`, `validate.tasks`).
2. Do mixtures keep their rank? It also trains the larger model on
   `validate.rank_mixtures` of the search's mixtures, chosen evenly over the
   range of their proxy scores, and reports the Spearman between proxy score
   and larger-model score (RegMix's rank-invariance claim, on your data).

The plan (which mixtures, which seeds) is saved first, and every model's record
is appended to `validate/results.jsonl` as it arrives, so a killed stage resumes
model by model. `validate/summary.json` holds the verdicts and the rank Spearman;
the report shows them under "Does it transfer?".

    climb validate --config pipelines/demo.toml --run runs/demo
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np

from climb.config import RunConfig, TargetConfig, digest, without
from climb.config.checks import check_validation_trains, validation_model
from climb.config.objective import describe
from climb.io.files import InputError, read_json, write_json
from climb.optimize.predictor import goal_sign
from climb.optimize.quality import fmt_comparison, paired_comparison, rank_transfer
from climb.runtime import results as results_log
from climb.runtime.device import proxy_processes
from climb.runtime.stage import execute, upstream_key
from climb.runtime.layout import RunPaths

log = logging.getLogger(__name__)


def read_results(paths: RunPaths) -> list[dict]:
    """Every complete record of the validation models, the last one per (mixture id, seed)."""
    return results_log.load(paths.validate.results)


def key(cfg: RunConfig, paths: RunPaths, legacy: bool = False) -> str:
    """The stage key: the search (the token store it read with it), the validation model, the
    target and [validate]; and the store's cap where it keeps less of a cluster than the built-in
    validation model reads (tokenized without validate.enabled: climb.stages.tokenize.short_of),
    so that the stage runs again once the store holds what it reads. `legacy`: without that cap,
    as older run folders keyed it."""
    from climb.stages.tokenize import short_of
    model = validation_model(cfg)
    searched = upstream_key(paths, "search")
    # Whether `climb run` validates, a time limit, the retry rule, the curves recorded: how it runs, not
    # what it measures.
    short = [] if legacy or model.command else short_of(paths, model.read_cap())
    return digest(searched, without(model, "timeout_s", "curve_points", "curve_evals"), cfg.target,
                  without(cfg.validate, "enabled"), *short)


def heldout_target(cfg: RunConfig) -> TargetConfig | None:
    v = cfg.validate
    if not v.texts and not v.tasks:
        return None
    return TargetConfig(texts=v.texts, text_column=v.text_column, tasks=dict(v.tasks), task_limit=v.task_limit,
                        objective=(), goal=cfg.target.goal)


def metric_goal(name: str, target_goal: str) -> str:
    """The direction of a reported metric: the target's for its objective; losses fall, accuracies rise."""
    if name == "objective":
        return target_goal
    leaf = name.rsplit("/", 1)[-1]
    return "maximize" if leaf in ("acc", "acc_norm") else "minimize"


def baselines(cfg: RunConfig) -> list[str]:
    return list(cfg.validate.baselines or cfg.search.baselines)


def choose_rank_mixtures(records: list[dict], n: int, goal: str) -> list[dict]:
    """`n` successful search records spread evenly (by rank) over the range of their proxy
    scores, best to worst. A mixture measured twice counts once, by its first record."""
    seen, unique = set(), []
    for r in sorted((r for r in records if r["status"] == "ok"), key=lambda r: r["mixture_id"]):
        key = tuple(np.round(r["weights"], 9))
        if key not in seen:
            seen.add(key)
            unique.append(r)
    unique.sort(key=lambda r: (goal_sign(goal) * r["objective"], r["mixture_id"]))
    if n <= 0 or not unique:
        return []
    if n >= len(unique):
        return unique
    idx = np.unique(np.round(np.linspace(0, len(unique) - 1, n)).astype(int))
    return [unique[i] for i in idx]


def plan(cfg: RunConfig, paths: RunPaths) -> dict:
    """The mixtures and seeds to train (saved on first use, so a resumed stage trains the same)."""
    plan_file = paths.validate.plan
    if plan_file.exists():
        return read_json(plan_file)
    from climb.stages.search import read_results as search_results
    v = cfg.validate
    mix = read_json(paths.search.mixture)
    # The search's comparison: each compared mixture's mean over its paired seeds.
    proxy_means = paths.stats("search").get("comparison", {})
    compared = {"climb": mix["weights"], "uniform": mix["uniform"], "natural": mix["natural"]}
    if paths.search.one_shot_mixture.exists():
        compared["one-shot"] = read_json(paths.search.one_shot_mixture)["weights"]
    names = ["climb"] + baselines(cfg)
    missing = [n for n in names if n not in compared]
    if missing:
        raise InputError(f"validate: the search did not compute the {missing} baseline(s); add them to "
                         "search.baselines (and run `climb search` again) or to validate.baselines")
    seeds = [v.seed + i for i in range(v.seeds)]
    mixtures = [{"name": n, "role": "compared", "weights": list(map(float, compared[n])),
                 "proxy_score": proxy_means.get(n), "seeds": seeds} for n in names]
    for r in choose_rank_mixtures([r for r in search_results(paths) if r["iteration"] >= 0], v.rank_mixtures,
                                  cfg.target.goal):
        same = next((m for m in mixtures if np.abs(np.subtract(m["weights"], r["weights"])).sum() < 1e-9), None)
        entry = {"name": f"rank-{r['mixture_id']}", "role": "rank", "weights": list(map(float, r["weights"])),
                 "proxy_score": r["objective"], "seeds": seeds[: v.rank_seeds]}
        if same is not None:  # e.g. the found mixture is the best one seen: its runs serve the rank check
            entry.update(same_as=same["name"], seeds=[])
        mixtures.append(entry)
    out = {"seeds": seeds, "mixtures": mixtures}
    write_json(plan_file, out)
    return out


def run(cfg: RunConfig, paths: RunPaths) -> dict:
    check_validation_trains(cfg)
    model = validation_model(cfg)
    # The results log is repaired in place; results under another config are moved aside.
    k, older = key(cfg, paths), key(cfg, paths, legacy=True)
    return execute(paths, "validate", k, lambda folder, ex: _validate(cfg, paths, model, ex),
                   executor=cfg.executor, processes=proxy_processes(model, cfg.executor),
                   keep=("results.jsonl",), keep_on_change=True, legacy_key=older if older != k else None)


def _validate(cfg: RunConfig, paths: RunPaths, model, ex) -> dict:
    from climb.stages.search import proxy_task, run_proxies
    heldout = heldout_target(cfg)
    results_log.repair(paths.validate.results)
    p = plan(cfg, paths)
    have = {(r["mixture_id"], r["seed"]): r for r in read_results(paths)}
    todo = [(m, s) for m in p["mixtures"] for s in m["seeds"]
            if results_log.retry(have.get((m["name"], s)), cfg.search.retry_failed)]
    total = sum(len(m["seeds"]) for m in p["mixtures"])
    log.info("validate: %d models of %d layers x %d wide, %d steps x %d x %d tokens (%d already done)",
             total, model.n_layer, model.n_embd, model.steps, model.batch_size, model.seq_len, total - len(todo))
    _check_store_cap(paths, model)
    run_cfg = dataclasses.replace(cfg, proxy=model)
    tasks = [proxy_task(run_cfg, paths, m["name"], -3, m["weights"], s, heldout) for m, s in todo]
    run_proxies(run_cfg, ex, tasks, "validation models", lambda i, rec: results_log.append(paths.validate.results, rec))
    records = read_results(paths)
    results_log.require_successes(records, 1, "validation models")
    summary = summarize(cfg, paths, p, records, model)
    write_json(paths.validate.summary, summary)
    for line in summary_lines(summary):
        log.info("%s", line)
    return {"models": total, "trained": len(tasks), "failed": sum(r["status"] != "ok" for r in records),
            "verdicts": {n: c["verdict"] for n, c in summary["target"]["comparison"].items()},
            "rank_spearman": summary["rank"]["spearman"]}


def _score(records: dict, name: str, seed: int, metric: str):
    r = records.get((name, seed))
    if r is None or r["status"] != "ok":
        return None
    return r["objective"] if metric == "objective" else r["metrics"].get(metric)


def summarize(cfg: RunConfig, paths: RunPaths, p: dict, records: list[dict], model) -> dict:
    """Means, paired verdicts (target and held-out metrics) and the rank statistic."""
    recs = {(r["mixture_id"], r["seed"]): r for r in records}
    seeds = p["seeds"]
    compared = [m for m in p["mixtures"] if m["role"] == "compared"]
    held = sorted({k for r in records if r["status"] == "ok" for k in r["metrics"]
                   if k.startswith("heldout/") and not k.endswith("/n")
                   and k.rsplit("/", 1)[-1] in ("bpb", "acc", "gold_loss_per_byte")})

    def block(metric: str) -> dict:
        goal = metric_goal(metric, cfg.target.goal)
        table = {m["name"]: [_score(recs, m["name"], s, metric) for s in seeds] for m in compared}
        means = {n: (float(np.mean([x for x in v if x is not None])) if any(x is not None for x in v) else None)
                 for n, v in table.items()}
        nan = lambda v: [np.nan if x is None else x for x in v]  # noqa: E731
        comp = {n: paired_comparison(nan(table["climb"]), nan(v), goal) for n, v in table.items() if n != "climb"}
        values = {x for v in table.values() for x in v if x is not None}
        # One value for every model (an accuracy all score 0 on): no comparison says anything.
        constant = values.pop() if len(values) == 1 and metric != "objective" else None
        return {"goal": goal, "means": means, "comparison": comp, "constant": constant}

    target = block("objective")
    target["name"] = describe(cfg.target)
    points = []
    for m in p["mixtures"]:
        src = m.get("same_as", m["name"])
        src_seeds = m["seeds"] or seeds[: cfg.validate.rank_seeds]
        vals = [_score(recs, src, s, "objective") for s in src_seeds]
        vals = [x for x in vals if x is not None]
        points.append({"name": m["name"], "role": m["role"], "proxy": m["proxy_score"],
                       "validation": float(np.mean(vals)) if vals else None})

    def rank(sel):
        pts = [q for q in sel if q["proxy"] is not None and q["validation"] is not None]
        return rank_transfer([q["proxy"] for q in pts], [q["validation"] for q in pts])
    rank_pts = [q for q in points if q["role"] == "rank"]
    out_rank = {**rank(rank_pts), "all_mixtures": rank(points)}
    params = _param_count(model, paths)
    return {"model": {"n_layer": model.n_layer, "n_head": model.n_head, "n_embd": model.n_embd,
                      "steps": model.steps, "batch_size": model.batch_size, "seq_len": model.seq_len,
                      "lr": model.lr, "tokens": model.steps * model.batch_size * model.seq_len,
                      "parameters": params, "command": model.command or None},
            "proxy": {"n_layer": cfg.proxy.n_layer, "n_embd": cfg.proxy.n_embd,
                      "tokens": cfg.proxy.steps * cfg.proxy.batch_size * cfg.proxy.seq_len,
                      "parameters": _param_count(cfg.proxy, paths)},
            "seeds": seeds, "target": target, "heldout": {m: block(m) for m in held},
            "rank": out_rank, "points": points}


def _check_store_cap(paths: RunPaths, model) -> None:
    """Warn where the token store keeps less of a cluster than the validation model reads: a store
    tokenized without validate.enabled is capped for the proxies (tokenize.cap = "auto")."""
    index = read_json(paths.tokenize.store / "index.json")
    cap = int(index.get("cap", 0))
    cut = sum(t > cap for t in index["tokens"])
    if cap and cut and not model.command and model.read_cap() > cap:
        log.warning("validate: the token store keeps at most %d tokens of a cluster (tokenize.cap; %d clusters are "
                    "larger), fewer than the %d the validation model reads (steps x batch_size x (seq_len + 1)); "
                    "it trains on those, repeating them more than an uncapped store would. Set validate.enabled = "
                    "true (or a larger tokenize.cap) before tokenizing to size the store for it", cap, cut,
                    model.read_cap())


def _param_count(proxy_cfg, paths: RunPaths) -> int | None:
    """Parameters of the built-in model at these settings (None for an external trainer)."""
    if proxy_cfg.command:
        return None
    import torch

    from climb.runtime.proxy_runs import proxy_configs
    from proxies.model import GPT
    from proxies.tokenizer import load_tokenizer
    tok = paths.tokenize.tokenizer
    if not tok.exists():
        return None
    mcfg, _ = proxy_configs(proxy_cfg, load_tokenizer(tok))
    with torch.device("meta"):
        return int(sum(p.numel() for p in GPT(mcfg).parameters()))


def summary_lines(s: dict) -> list[str]:
    t = s["target"]
    lines = [f"validation model ({s['model']['n_layer']} layers x {s['model']['n_embd']}, "
             f"{s['model']['tokens']:,} tokens, {len(s['seeds'])} paired seeds), {t['name']} ({t['goal']}): "
             + ", ".join(f"{n} {v:.4f}" for n, v in t["means"].items() if v is not None)]
    lines += [f"  climb vs {n}: {fmt_comparison(n, c)}" for n, c in t["comparison"].items()]
    for metric, b in s["heldout"].items():
        if b.get("constant") is not None:
            lines.append(f"  held-out {metric[len('heldout/'):]}: {b['constant']:g} for every model (uninformative "
                         "at this scale)")
            continue
        lines += [f"  held-out {metric[len('heldout/'):]} ({b['goal']}), climb vs {n}: {fmt_comparison(n, c)}"
                  for n, c in b["comparison"].items()]
    r = s["rank"]
    if r["spearman"] is not None:
        ci = f" [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}]" if r["ci95"] else ""
        lines.append(f"  rank transfer: Spearman(proxy score, validation score) = {r['spearman']:+.2f}{ci} over "
                     f"{r['n']} search mixtures")
    return lines
