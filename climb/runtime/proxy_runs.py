"""One proxy run: (mixture, config, seed) -> metrics record.

The built-in trainer trains a small GPT (`proxies/`) on sequences drawn from the
per-cluster token stores by the mixture weights, then scores it on the target:
bits per byte on held-out text and/or `acc`, `acc_norm`, `gold_loss_per_byte`
on task files. `objective` is the mean of the metrics named in
`target.objective`; the goal (minimize / maximize) travels with it.

A user with their own trainer sets `proxy.command`; climb writes the mixture to
`{weights}` (JSON: {"weights": [...], "clusters": [...], "seed": n}) and reads the
metrics record the command writes to `{out}` (JSON: {"metrics": {...}}). The
command runs in its own process group, which is killed when it passes
`proxy.timeout_s` and when climb itself is interrupted (Ctrl-C, SIGTERM).

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

import json
import logging
import math
import os
import shlex
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from climb.config import ProxyConfig, TargetConfig
from climb.io.files import InputError, fingerprint, is_url, read_documents, resolve_corpus_files
from climb.io.mixture import check_weights
from climb.runtime.device import resolve_device

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
    # Also save the trained model's weights here (a state dict), e.g. to merge later.
    save_model: str = ""


def load_target(target_cfg: TargetConfig, run_dir: Path) -> dict:
    """Target texts and task items, cached per process (Dask workers reuse them)."""
    what = [target_cfg.texts, target_cfg.text_column, sorted(target_cfg.tasks.items()), target_cfg.task_limit]
    key = ("target", json.dumps(what), str(run_dir),
           tuple(_stamp(f) for f in resolve_corpus_files(target_cfg.texts, run_dir)) if target_cfg.texts else ())
    if key not in _CACHE:
        texts: list[str] = []
        if target_cfg.texts:
            for f in resolve_corpus_files(target_cfg.texts, run_dir):
                for b in read_documents(f, target_cfg.text_column, ""):
                    texts += b.texts
        tasks = {}
        for name, path in target_cfg.tasks.items():
            items = _task_items(name, path.replace("{run}", str(run_dir)))
            tasks[name] = items[: target_cfg.task_limit] if target_cfg.task_limit else items
        if not texts and not tasks:
            raise InputError("the target is empty: set target.texts (held-out text) and/or target.tasks")
        _CACHE[key] = {"texts": texts, "tasks": tasks}
    return _CACHE[key]


def _task_items(name: str, path: str) -> list[dict]:
    from proxies.evaluate import load_tasks, parse_tasks
    if not is_url(path):
        p = Path(path)
        if not p.exists():
            raise InputError(f"target task file {p} not found; fix target.tasks.{name}")
        return load_tasks(p)
    import io

    from climb.io.remote import errors, info, open_input
    try:
        info(path)
    except InputError as e:
        raise InputError(f"{e}; fix target.tasks.{name}") from None
    with open_input(path) as fh, errors(path):
        return parse_tasks(io.TextIOWrapper(fh, encoding="utf-8"), path)


def objective(metrics: dict, target_cfg: TargetConfig) -> float:
    missing = [m for m in target_cfg.objective if m not in metrics]
    if missing:
        raise InputError(f"target.objective names {missing}, but the proxy reported {sorted(metrics)}")
    return float(np.mean([metrics[m] for m in target_cfg.objective]))


def evaluate(model, tokenizer, target_cfg: TargetConfig, run_dir: Path, device: str,
             bf16: bool | None = None) -> dict:
    """The target's metrics; `bf16`: score under bf16 autocast (None: on CUDA only)."""
    from proxies.evaluate import bits_per_byte, evaluate_task
    target = load_target(target_cfg, run_dir)
    metrics: dict[str, float] = {}
    if target["texts"]:
        metrics["bpb"] = float(bits_per_byte(model, tokenizer, target["texts"], device=device, bf16=bf16))
    for name, items in target["tasks"].items():
        res = evaluate_task(model, tokenizer, items, device=device, bf16=bf16)
        for k in ("acc", "acc_norm", "gold_loss_per_byte"):
            metrics[f"{name}/{k}"] = float(res[k])
    return metrics


def evaluate_task_metrics(model, tokenizer, task: ProxyTask, device: str) -> dict:
    """The target's metrics, and the held-out ones (`task.heldout`, a TargetConfig) as heldout/<name>.

    On CUDA a model is scored in the precision it trained in (bf16 autocast only where
    its training used it); on a CPU in fp32 whatever the training precision.
    """
    bf16 = False
    if device.startswith("cuda"):
        import torch

        from proxies.train import uses_bf16
        proxy_cfg: ProxyConfig = task.proxy
        bf16 = uses_bf16(torch.device(device), proxy_cfg.precision, proxy_cfg.n_embd)
    metrics = evaluate(model, tokenizer, task.target, Path(task.run_dir), device, bf16)
    if task.heldout is not None:
        held = evaluate(model, tokenizer, task.heldout, Path(task.run_dir), device, bf16)
        metrics.update({f"heldout/{k}": v for k, v in held.items()})
    return metrics


def _stamp(path: Path | str) -> tuple:
    if is_url(path):
        return tuple(fingerprint([path])[0])
    st = path.stat()
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def _resources(tokens_dir: Path):
    """The token store and tokenizer of a tokenize stage's folder, cached per process."""
    from climb.runtime.stage import TokenizeOutputs
    from proxies.tokenizer import load_tokenizer
    from proxies.tokens import TokenStore
    out = TokenizeOutputs(tokens_dir)
    # Keyed by the files' identity too: a long-lived worker must not serve a store
    # that a changed config has since rebuilt in the same folder.
    key = ("store", str(tokens_dir), _stamp(out.store / "index.json"), _stamp(out.tokenizer))
    if key not in _CACHE:
        _CACHE[key] = (TokenStore(out.store), load_tokenizer(out.tokenizer))
    return _CACHE[key]


def _deadline(proxy_cfg: ProxyConfig, n: int = 1) -> float | None:
    return time.monotonic() + n * proxy_cfg.timeout_s if proxy_cfg.timeout_s > 0 else None


def train_and_score(task: ProxyTask) -> dict:
    """Run one proxy: train it (or run proxy.command, or look it up) and score it; one record."""
    t0 = time.time()
    proxy_cfg: ProxyConfig = task.proxy
    rec = _record(task, lambda: _lookup(task) if proxy_cfg.lookup else _external(task) if proxy_cfg.command
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


def _sampler(store, weights, proxy_cfg: ProxyConfig, seed: int, device: str, where: str, base: dict | None = None):
    """The task's sampler; continuing a base, one that starts after the base's batches."""
    from proxies.sampler import MixtureSampler, SwitchSampler
    w = check_weights(weights, store.n_clusters, where, tol=None)
    s = MixtureSampler(store, w, proxy_cfg.seq_len, proxy_cfg.batch_size, seed=seed + (CONTINUE_SEED if base else 0),
                       device=device, exact=proxy_cfg.exact_batches, common=proxy_cfg.common_streams)
    return s if base is None else SwitchSampler(None, s, int(base["step"]))  # one micro-batch a step


def load_base(path: str) -> dict:
    """A shared base's state (proxies.train's paused state), cached per process by the file's identity."""
    import torch
    key = ("base", path, _stamp(Path(path)))
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
        samplers.append(_sampler(store, t.weights, proxy_cfg, t.seed, device, f"proxy {t.mixture_id}", base))
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
    sampler = _sampler(store, task.weights, proxy_cfg, task.seed, device, f"proxy {task.mixture_id}", base)
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
        _save_logprobs(Path(task.logprobs), model, tok, task, device)
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


def expert_terms(target_cfg: TargetConfig) -> list[str]:
    """The objective's terms an expert can score (each bpb or <task>/gold_loss_per_byte), or
    raise InputError naming the one it cannot."""
    bad = [m for m in target_cfg.objective if m != "bpb" and not m.endswith("/gold_loss_per_byte")]
    if bad:
        raise InputError(f"search.experts scores an objective of bits per byte and gold losses per byte; "
                         f"{bad} is neither (an accuracy cannot be read from token probabilities)")
    return list(target_cfg.objective)


def _save_logprobs(path: Path, model, tok, task: ProxyTask, device: str) -> None:
    """The log-probability (float32) of every target token the objective scores, as {path}
    (.npy), and each token's weight in the objective as {path stem}.coef.npy: the
    objective is then -sum(coef * logp), the mean of its terms (bpb: the target texts'
    tokens over ln 2 x bytes; a task's gold loss per byte: each item's gold continuation
    over its bytes and the task's items)."""
    from climb.io.files import write_npy
    from proxies.evaluate import gold_token_logprobs, token_logprobs
    target = load_target(task.target, Path(task.run_dir))
    terms = expert_terms(task.target)
    logps, coefs = [], []
    for term in terms:
        if term == "bpb":
            lp, n_bytes = token_logprobs(model, tok, target["texts"], device=device, bf16=False)
            logps.append(lp)
            coefs.append(np.full(len(lp), 1.0 / (math.log(2) * n_bytes)))
            continue
        name = term.rsplit("/", 1)[0]
        if name not in target["tasks"]:
            raise InputError(f"target.objective names {term}, but target.tasks has no {name!r}")
        items = gold_token_logprobs(model, tok, target["tasks"][name], device=device, bf16=False)
        for lp, n_bytes in items:
            logps.append(lp)
            coefs.append(np.full(len(lp), 1.0 / (n_bytes * len(items))))
    logp = np.concatenate(logps).astype(np.float32)
    coef = np.concatenate(coefs) / len(terms)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_npy(path, logp)
    write_npy(coef_path(path), coef)


def coef_path(logprobs: Path) -> Path:
    """Where the weights of the tokens in an expert's log-probabilities file are kept."""
    return logprobs.with_name(logprobs.stem + ".coef.npy")


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
    out = {"params": int(stats["num_params"]), "curve": curve if curve["step"] else None}
    if "continued_from" in stats:  # the base's steps, counted once in the base's own record
        out["base_steps"] = int(stats["continued_from"])
    return out


class ProxyTimeout(RuntimeError):
    """An external proxy ran past proxy.timeout_s."""


def _kill_group(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM the command's process group, then SIGKILL whatever is left after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; are any of its children left in the group?
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1 if sig == signal.SIGTERM else 0)


def run_command(cmd: str, timeout_s: float) -> subprocess.CompletedProcess:
    """Run a shell command in a process group of its own; the group is killed on timeout or
    when this process is interrupted, so no trainer outlives the proxy it was started for."""
    proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s if timeout_s > 0 else None)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # a child that left the group still holds the pipes
            pass
        raise ProxyTimeout(f"proxy.command timed out after {timeout_s:g}s (proxy.timeout_s); "
                           "its process group was killed") from None
    except BaseException:  # Ctrl-C, SIGTERM (raised by the CLI's handler), anything else
        _kill_group(proc, grace=1.0)
        raise
    _kill_group(proc, grace=1.0)  # anything it left running in the background
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _metric(v):
    """A metric value as a float; null and non-numbers as NaN (the record then fails)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return float("nan")
    return float(v)


def _lookup(task: ProxyTask) -> tuple[dict, int]:
    from climb.runtime.lookup import lookup_proxy  # a table of measured results stands in for training
    return lookup_proxy(task)


def _external(task: ProxyTask) -> tuple[dict, int]:
    proxy_cfg: ProxyConfig = task.proxy
    with tempfile.TemporaryDirectory(prefix="climb-proxy-") as tmp:
        wfile, out = Path(tmp) / "weights.json", Path(tmp) / "metrics.json"
        wfile.write_text(json.dumps({"weights": task.weights, "seed": task.seed,
                                     "mixture_id": task.mixture_id,
                                     "clusters": list(range(len(task.weights)))}))
        cmd = proxy_cfg.command.format(weights=shlex.quote(str(wfile)), out=shlex.quote(str(out)))
        proc = run_command(cmd, proxy_cfg.timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"proxy.command exited {proc.returncode}: {proc.stderr[-2000:]}")
        if not out.exists():
            raise RuntimeError(f"proxy.command wrote no metrics file to {{out}}; stdout: {proc.stdout[-500:]}")
        try:
            rec = json.loads(out.read_text())
        except ValueError as e:
            raise RuntimeError(f"proxy.command wrote a metrics file that is not JSON ({e})") from None
    metrics = rec.get("metrics", rec) if isinstance(rec, dict) else {}
    if not isinstance(metrics, dict):
        raise RuntimeError(f"proxy.command wrote {type(metrics).__name__} metrics; expected an object")
    # Numbers are metrics; null (a failed evaluation) is kept so that the record fails.
    metrics = {k: _metric(v) for k, v in metrics.items()
               if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))}
    return metrics, int(rec.get("tokens", 0) or 0), _external_extra(rec)


def _external_extra(rec: dict) -> dict:
    """An external trainer's parameter count and curve, where its metrics file gives them
    (`"params": int`, `"curve": {"step": [...], "<metric>": [...], ...}`, lists of one length)."""
    out: dict = {}
    if isinstance(rec.get("params"), int) and not isinstance(rec["params"], bool):
        out["params"] = rec["params"]
    curve = rec.get("curve")
    if isinstance(curve, dict) and isinstance(curve.get("step"), list) and all(
            isinstance(v, list) and len(v) == len(curve["step"]) for v in curve.values()):
        out["curve"] = {k: [_metric(x) if x is not None else None for x in v] if k != "step" else v
                        for k, v in curve.items()}
    else:
        if curve is not None:
            log.warning("proxy.command's curve is not {\"step\": [...], \"<metric>\": [...]} with lists of one "
                        "length; it is left out of the record")
    return out
