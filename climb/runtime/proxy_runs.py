"""One proxy run: (mixture, config, seed) -> metrics record.

The built-in trainer trains a small GPT (`proxies/`) on sequences drawn from the
per-cluster token stores by the mixture weights, then scores it on the target:
bits per byte on held-out text and/or `acc`, `acc_norm`, `gold_loss_per_byte`
on task files. `objective` is the mean of the metrics named in
`target.objective`; the goal (minimize / maximize) travels with it.

A user with their own trainer sets `proxy.command` (climb/runtime/external.py: what
the command is given and what it writes); a measured swarm can stand in for training
(`proxy.lookup`, climb/runtime/lookup.py). The target's loading and scoring are in
climb/runtime/targets.py.

The built-in trainer runs in this process and checks `proxy.timeout_s` at every
training step instead: a child process per proxy would pay a fresh torch import
(seconds on a CPU) and a fresh CUDA context each time, and could not stack
proxies into one model; our own loop cannot block outside a step, where an
external trainer can. A failed proxy (an error, a timeout, a NaN or null
metric) becomes a failure record with one log line; a resumed search trains it
again (`search.retry_failed`).

Task arguments are paths and small configs, so the same function runs
in-process or on a Dask worker.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from climb.config import ProxyConfig, TargetConfig
from climb.io.files import InputError
from climb.io.mixture import check_weights
from climb.runtime.device import resolve_device
from climb.runtime.external import external_extra, run_command, run_external  # noqa: F401 (re-exported)
from climb.runtime.targets import (coef_path, evaluate_task_metrics, expert_terms, load_target,  # noqa: F401
                                   objective, save_logprobs, stamp)

log = logging.getLogger(__name__)
_CACHE: dict = {}


@dataclass(frozen=True)
class ProxyTask:
    """What one proxy run needs; plain data, so it runs in-process or on a Dask worker."""
    mixture_id: str
    iteration: int
    weights: tuple[float, ...]
    seed: int
    tokens_dir: str  # the tokenize stage's folder: token store and tokenizer
    run_dir: str  # `{run}` in target paths
    proxy: ProxyConfig
    target: TargetConfig
    heldout: TargetConfig | None = None  # evaluations scored beside the target, as heldout/<metric>
    # Built-in trainer only. stop_at > 0: pause after that many steps, save the run's state
    # to `checkpoint` and score the target there (a rung of successive halving). stop_at = 0
    # with a `checkpoint` that exists: continue that paused run to the end.
    stop_at: int = 0
    checkpoint: str = ""
    # Keep the target texts' per-token log-probabilities here (.npy), for expert features.
    logprobs: str = ""
    # Built-in trainer only: continue this shared base (a run paused on another mixture,
    # proxies.train) on the task's mixture instead of training from scratch. The record
    # counts the steps after the base's; its windows come from streams of their own
    # (seed + CONTINUE_SEED), not those the base drew from.
    base: str = ""
    # The base's steps (what an external trainer is told to continue from).
    base_steps: int = 0
    # Also save the trained model's weights here (a state dict), e.g. to merge later.
    save_model: str = ""
    # Built-in trainer: each cluster's first tokens its windows come from (proxies.sampler's
    # read_cap): the run's [proxy] read cap, also for experts and a base, which train fewer of its
    # steps, so every run of one seed walks a cluster alike; 0: this task's proxy's own.
    read_cap: int = 0


def _resources(tokens_dir: Path):
    """The token store and tokenizer of a tokenize stage's folder, cached per process."""
    from climb.runtime.layout import TokenizeOutputs
    from proxies.tokenizer import load_tokenizer
    from proxies.tokens import TokenStore
    out = TokenizeOutputs(tokens_dir)
    # Keyed by the files' identity too: a long-lived worker must not serve a store
    # that a changed config has since rebuilt in the same folder.
    key = ("store", str(tokens_dir), stamp(out.store / "index.json"), stamp(out.tokenizer))
    if key not in _CACHE:
        _CACHE[key] = (TokenStore(out.store), load_tokenizer(out.tokenizer))
    return _CACHE[key]


def tokenizer_of(tokens_dir) -> object:
    """The proxies' tokenizer of a tokenize stage's folder (cached per process)."""
    return _resources(Path(tokens_dir))[1]


def _deadline(proxy_cfg: ProxyConfig, n: int = 1) -> float | None:
    return time.monotonic() + n * proxy_cfg.timeout_s if proxy_cfg.timeout_s > 0 else None


def train_and_score(task: ProxyTask) -> dict:
    """Run one proxy: train it (or run proxy.command, or look it up) and score it; one record."""
    t0 = time.time()
    proxy_cfg: ProxyConfig = task.proxy
    rec = _record(task, lambda: _lookup(task) if proxy_cfg.lookup else run_external(task) if proxy_cfg.command
                  else _builtin(task, _deadline(proxy_cfg)))
    rec["seconds"] = round(time.time() - t0, 3)
    return rec


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _record(task: ProxyTask, run) -> dict:
    """The result record of one proxy; run() -> (metrics, tokens). A failed proxy is
    recorded, not fatal (the search goes on without it); bad input still raises."""
    rec = {"mixture_id": task.mixture_id, "iteration": task.iteration, "seed": task.seed,
           "weights": [float(w) for w in task.weights]}
    metrics: dict = {}
    try:
        metrics, tokens, *more = run()  # more: the trainer's {"params", "curve"}, where it reports them
        rec.update({k: v for k, v in (more[0] if more else {}).items() if v is not None})
        bad = sorted(k for k, v in metrics.items() if not _finite(v))
        if bad:
            raise ValueError(f"metric(s) {bad} are NaN, infinite or null (training diverged?)")
        rec.update(metrics=metrics, objective=objective(metrics, task.target), tokens=tokens, status="ok")
        if not np.isfinite(rec["objective"]):
            raise ValueError("non-finite objective (training diverged?)")
    except InputError:
        raise
    except Exception as e:
        from climb.runtime.results import one_line
        log.warning("proxy %s failed: %s: %s", task.mixture_id, type(e).__name__, one_line(e))
        log.debug("proxy %s failed", task.mixture_id, exc_info=True)
        # What metrics there were are kept (non-finite ones are written as null).
        rec.update(metrics=metrics, objective=None, tokens=0, status="failed", error=f"{type(e).__name__}: {e}")
    return rec


def stack_size(proxy_cfg: ProxyConfig) -> int:
    """How many proxies the built-in trainer trains as one stacked model (1: one at a time)."""
    if proxy_cfg.command or proxy_cfg.lookup or proxy_cfg.swarm == "single":
        return 1
    device = resolve_device(proxy_cfg.device)
    if proxy_cfg.swarm == "auto" and not device.startswith("cuda"):
        # On a CPU each proxy's matmuls already keep the cores busy, and stacking
        # measured no faster than one proxy after another (see BENCHMARKS.md, Stage speed).
        return 1
    return proxy_cfg.swarm_size or (64 if device.startswith("cuda") else 8)


def train_and_score_group(tasks: list[ProxyTask]) -> list[dict]:
    """Run several proxies (same proxy config) as one stacked model; one record per task.

    If the stacked run itself fails (out of memory, say), the proxies are run one by
    one instead, so a group never loses more than a single proxy would.
    """
    if len(tasks) == 1:
        return [train_and_score(tasks[0])]
    t0 = time.time()
    try:
        trained = _builtin_stacked(tasks)
    except InputError:
        raise
    except Exception as e:
        from proxies.train import TrainingTimeout
        if isinstance(e, TrainingTimeout):  # one by one would only time out again, n times over
            return [_record(t, _raiser(e)) for t in tasks]
        log.warning("training %d proxies as one stacked model failed (%s: %s); training them one by one",
                    len(tasks), type(e).__name__, e)
        return [train_and_score(t) for t in tasks]
    per = round((time.time() - t0) / len(tasks), 3)
    out = []
    for task, got in zip(tasks, trained):
        t1 = time.time()
        rec = _record(task, got)
        rec["seconds"] = round(per + time.time() - t1, 3)
        rec["stacked"] = len(tasks)
        out.append(rec)
    return out


def _raiser(e: Exception):
    def run():
        raise e
    return run


def proxy_configs(proxy_cfg: ProxyConfig, tok):
    """The built-in trainer's GPTConfig and TrainConfig for these settings and tokenizer."""
    return proxy_cfg.model_config(tok.vocab_size), proxy_cfg.train_config(log_every=10**9)


# A continuation's sampler seed is its proxy's plus this, so that with one seed the windows it
# draws from a cluster are not the ones its base drew first (common streams are seeded per cluster).
CONTINUE_SEED = 2**32


def _sampler(store, weights, proxy_cfg: ProxyConfig, seed: int, device: str, where: str, base: dict | None = None,
             read_cap: int = 0):
    """The task's sampler; continuing a base, one that starts after the base's batches."""
    from proxies.sampler import MixtureSampler, SwitchSampler
    w = check_weights(weights, store.n_clusters, where, tol=None)
    # Windows from each cluster's first read_cap tokens only (all a run can draw): the same batches
    # from a store capped there (tokenize.cap), capped higher, or not capped.
    s = MixtureSampler(store, w, proxy_cfg.seq_len, proxy_cfg.batch_size, seed=seed + (CONTINUE_SEED if base else 0),
                       device=device, exact=proxy_cfg.exact_batches, common=proxy_cfg.common_streams,
                       read_cap=read_cap or proxy_cfg.read_cap())
    return s if base is None else SwitchSampler(None, s, int(base["step"]))  # one micro-batch a step


def load_base(path: str) -> dict:
    """A shared base's state (proxies.train's paused state), cached per process by the file's identity."""
    import torch
    key = ("base", path, stamp(Path(path)))
    if key not in _CACHE:
        for k in [k for k in _CACHE if k[:2] == ("base", path)]:  # a retrained base replaces the old one
            del _CACHE[k]
        _CACHE[key] = torch.load(path, map_location="cpu", weights_only=True)
    return _CACHE[key]


def own_tokens(stats: dict) -> int:
    """The tokens a run trained on itself: all of them, or those after the base it continued."""
    steps = max(1, stats["steps"])
    return int(stats["tokens"]) * (steps - stats.get("continued_from", 0)) // steps


def _builtin_stacked(tasks: list[ProxyTask]) -> list:
    """Train the group's proxies together; returns one evaluator per task that evaluates its proxy."""
    from proxies.stacked import train_stacked
    proxy_cfg: ProxyConfig = tasks[0].proxy
    if any(t.proxy != proxy_cfg or t.tokens_dir != tasks[0].tokens_dir for t in tasks):
        raise ValueError("a stacked group needs one proxy config and one token store")
    if len({t.base for t in tasks}) > 1:
        raise ValueError("a stacked group continues one base or none")
    device = resolve_device(proxy_cfg.device)
    store, tok = _resources(Path(tasks[0].tokens_dir))
    base = load_base(tasks[0].base) if tasks[0].base else None
    samplers = []
    for t in tasks:
        samplers.append(_sampler(store, t.weights, proxy_cfg, t.seed, device, f"proxy {t.mixture_id}", base,
                                 t.read_cap))
    mcfg, tcfg = proxy_configs(proxy_cfg, tok)
    # A stacked model of n proxies may take as long as n proxies one after another.
    trained = train_stacked(mcfg, tcfg, samplers, seeds=[t.seed for t in tasks], device=device,
                            deadline=_deadline(proxy_cfg, len(tasks)), base=base)
    log.info("%d proxies trained as one stacked model: %.0f tok/s in all", len(tasks),
             len(tasks) * trained[0][1]["tokens_per_s"])

    def evaluator(task: ProxyTask, model, stats: dict):
        def run() -> tuple[dict, int, dict]:
            metrics = evaluate_task_metrics(model, tok, task, device)
            metrics["train_loss"] = float(stats["final_loss"])
            if task.save_model:
                _save_state(Path(task.save_model), model.state_dict())
            return metrics, own_tokens(stats), _extra(proxy_cfg, stats, {}, metrics)
        return run
    return [evaluator(t, m, st) for t, (m, st) in zip(tasks, trained)]


def _builtin(task: ProxyTask, deadline: float | None = None) -> tuple[dict, int, dict]:
    import torch

    from proxies.train import train
    proxy_cfg: ProxyConfig = task.proxy
    device = resolve_device(proxy_cfg.device)
    store, tok = _resources(Path(task.tokens_dir))
    base = load_base(task.base) if task.base else None
    if base is not None and (task.stop_at or task.checkpoint):
        raise ValueError(f"proxy {task.mixture_id}: a continued base cannot also pause at a rung")
    sampler = _sampler(store, task.weights, proxy_cfg, task.seed, device, f"proxy {task.mixture_id}", base,
                       task.read_cap)
    mcfg, tcfg = proxy_configs(proxy_cfg, tok)
    ckpt = Path(task.checkpoint) if task.checkpoint else None
    resume = None
    if ckpt is not None and not task.stop_at and ckpt.exists():
        resume = torch.load(ckpt, map_location="cpu", weights_only=True)
    scored: dict[int, dict] = dict((resume or {}).get("scored", {}))  # step -> the target's metrics there
    evals = eval_steps(tcfg.steps, proxy_cfg.curve_points, proxy_cfg.curve_evals)
    model, stats = train(mcfg, tcfg, sampler, seed=task.seed, device=device, deadline=deadline,
                         on_point=lambda step, m: scored.__setitem__(step, evaluate_task_metrics(m, tok, task, device)),
                         points=evals, stop_at=task.stop_at or None, resume=resume, base=base)
    metrics = evaluate_task_metrics(model, tok, task, device)
    metrics["train_loss"] = float(stats["final_loss"])
    if task.stop_at:
        _save_state(ckpt, {**stats.pop("state"), "scored": scored})
    if task.save_model:
        _save_state(Path(task.save_model), model.state_dict())
    if task.logprobs:
        save_logprobs(Path(task.logprobs), model, tok, task, device)
    log.info("proxy %s%s: objective inputs %s, %.0f tok/s", task.mixture_id,
             f" (paused at step {task.stop_at})" if task.stop_at else "",
             {k: round(v, 4) for k, v in metrics.items()}, stats["tokens_per_s"])
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    if task.stop_at:
        return metrics, int(stats["tokens"]), {"params": int(stats["num_params"]), "curve": None}
    return metrics, own_tokens(stats), _extra(proxy_cfg, stats, scored, metrics)


def _save_state(path: Path | None, state: dict) -> None:
    """A paused run's state (or a model's weights), written whole or not at all."""
    import torch

    from climb.io.files import atomic_path
    if path is None:
        raise ValueError("a proxy paused at a rung needs a checkpoint path")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def eval_steps(steps: int, points: int, evals: int) -> list[int]:
    """The curve points (curve_steps) short of the last at which to score the target: the
    ones nearest to `evals` even fractions of the run."""
    from proxies.train import curve_steps
    pts = curve_steps(steps, points)[:-1]
    if not pts or evals <= 0:
        return []
    return sorted({min(pts, key=lambda p: abs(p - t)) for t in curve_steps(steps, evals + 1)[:-1]})


def _extra(proxy_cfg: ProxyConfig, stats: dict, scored: dict[int, dict], final: dict) -> dict:
    """What a built-in proxy's record keeps besides its metrics: its parameter count, and its
    learning curve (proxies.train.loss_curve) with the target's metrics where they were scored
    during training (null elsewhere) and, at the last point, the final ones."""
    from proxies.train import loss_curve
    tokens_per_step = stats["tokens"] // max(1, stats["steps"])
    curve = loss_curve(stats["losses"], tokens_per_step, proxy_cfg.curve_points)
    if curve["step"] and (scored or proxy_cfg.curve_evals):
        last = curve["step"][-1]
        for name in [m for m in final if m != "train_loss"]:
            curve[name] = [final[name] if s == last else scored.get(s, {}).get(name) for s in curve["step"]]
    out = {"params": int(stats["num_params"]), "curve": curve if curve["step"] else None,
           **trained_in(proxy_cfg)}
    if "continued_from" in stats:  # the base's steps, counted once in the base's own record
        out["base_steps"] = int(stats["continued_from"])
    return out


def trained_in(proxy_cfg: ProxyConfig) -> dict:
    """{"device", "precision"} a built-in proxy trains in here: results of different ones are
    not comparable, and a search that mixes them says so (climb.optimize.quality)."""
    import torch

    from proxies.train import uses_bf16
    device = resolve_device(proxy_cfg.device)
    bf16 = uses_bf16(torch.device(device), proxy_cfg.precision, proxy_cfg.n_embd)
    return {"device": device.split(":")[0], "precision": "bf16" if bf16 else "fp32"}


def _lookup(task: ProxyTask) -> tuple[dict, int]:
    from climb.runtime.lookup import lookup_proxy  # a table of measured results stands in for training
    return lookup_proxy(task)


