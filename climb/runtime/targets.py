"""The target a proxy is scored on: loading it, and scoring a model on it.

The target is held-out text (bits per byte, `bpb`) and/or task files (`<task>/acc`,
`<task>/acc_norm`, `<task>/gold_loss_per_byte`); `objective` is the mean of the metrics
`target.objective` names, or their weighted aggregate under `target.weights` and
`target.goals` (climb.config.objective). Texts and task items are read once per process
(Dask workers reuse them). For expert features, `objective_logprobs` keeps the log-probability of every
token the objective scores, with its weight in the objective.
"""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np

from climb.config import ProxyConfig, TargetConfig
from climb.config.objective import coefficients
from climb.io.files import InputError, fingerprint, is_url, read_documents, resolve_corpus_files

log = logging.getLogger(__name__)
_CACHE: dict = {}


def load_target(target_cfg: TargetConfig, run_dir: Path) -> dict:
    """Target texts and task items, cached per process (Dask workers reuse them)."""
    what = [target_cfg.texts, target_cfg.text_column, sorted(target_cfg.tasks.items()), target_cfg.task_limit]
    key = ("target", json.dumps(what), str(run_dir),
           tuple(stamp(f) for f in resolve_corpus_files(target_cfg.texts, run_dir)) if target_cfg.texts else ())
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
        if not texts and not tasks and not target_cfg.lm_eval:
            raise InputError("the target is empty: set target.texts (held-out text), target.tasks and/or "
                             "target.lm_eval")
        _CACHE[key] = {"texts": texts, "tasks": tasks}
    return _CACHE[key]


def target_pieces(target: dict) -> list[str]:
    """The target's documents as text: held-out texts, and every task item's query and gold
    continuation (a cloze item's context and continuation)."""
    pieces = list(target["texts"])
    for items in target["tasks"].values():
        for it in items:
            if "choices" in it:
                pieces.append(it["query"] + " " + it["choices"][it["gold"]])
            else:
                pieces.append(it["context"] + it["continuation"])
    return pieces


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


def target_files(target_cfg: TargetConfig, run_dir, cache=None) -> list:
    """The target's texts and task files by what they hold (climb.io.digests), for stage keys;
    names that match no file are left to the proxies to report (an external trainer may not
    read them at all)."""
    from climb.io.digests import content_fingerprint
    files = []
    for pattern in target_cfg.texts:
        try:
            files += list(resolve_corpus_files([pattern], Path(run_dir)))
        except InputError:
            continue
    files += [p.replace("{run}", str(run_dir)) for _, p in sorted(target_cfg.tasks.items())]
    return content_fingerprint([f for f in files if is_url(f) or Path(f).exists()], cache)


def objective(metrics: dict, target_cfg: TargetConfig) -> float:
    missing = [m for m in target_cfg.objective if m not in metrics]
    if missing:
        raise InputError(f"target.objective names {missing}, but the proxy reported {sorted(metrics)}; set "
                         "target.objective to metrics it reports")
    coefs = coefficients(target_cfg)
    if coefs is None:  # the plain mean, as before target.weights and target.goals existed
        return float(np.mean([metrics[m] for m in target_cfg.objective]))
    return float(sum(c * metrics[m] for m, c in coefs))


def evaluate(model, tokenizer, target_cfg: TargetConfig, run_dir: Path, device: str,
             bf16: bool | None = None, target: dict | None = None) -> dict:
    """The target's metrics; `bf16`: score under bf16 autocast (None: on CUDA only); `target`:
    a loaded target (or part of one) to score instead of loading target_cfg's."""
    from proxies.evaluate import bits_per_byte, evaluate_task
    target = target if target is not None else load_target(target_cfg, run_dir)
    metrics: dict[str, float] = {}
    if target["texts"]:
        metrics["bpb"] = float(bits_per_byte(model, tokenizer, target["texts"], device=device, bf16=bf16))
    for name, items in target["tasks"].items():
        res = evaluate_task(model, tokenizer, items, device=device, bf16=bf16)
        for k in ("acc", "acc_norm", "gold_loss_per_byte"):
            metrics[f"{name}/{k}"] = float(res[k])
    if target_cfg.lm_eval:
        from climb.runtime.harness import score_proxy
        metrics.update(score_proxy(model, tokenizer, target_cfg, device, bf16))
    return metrics


def evaluate_task_metrics(model, tokenizer, task, device: str) -> dict:
    """The target's metrics for a ProxyTask, and the held-out ones (`task.heldout`, a
    TargetConfig) as heldout/<name>.

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


def stamp(path: Path | str) -> tuple:
    """A file's identity for the caches (a URL's fingerprint): a changed file is read again."""
    if is_url(path):
        return tuple(fingerprint([path])[0])
    st = path.stat()
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def expert_terms(target_cfg: TargetConfig) -> list[str]:
    """The objective's terms an expert can score (each bpb or <task>/gold_loss_per_byte), or
    raise InputError naming the one it cannot."""
    bad = [m for m in target_cfg.objective if m != "bpb" and not (
        m.endswith("/gold_loss_per_byte") and m.rsplit("/", 1)[0] in target_cfg.tasks)]
    if bad:
        raise InputError(f"search.experts scores an objective of bits per byte and gold losses per byte of "
                         f"target.tasks; {bad} is neither (an accuracy cannot be read from token probabilities, "
                         "nor a harness task's tokens be kept)")
    return list(target_cfg.objective)


def objective_logprobs(model, tok, target_cfg: TargetConfig, target: dict,
                       device: str) -> tuple[np.ndarray, np.ndarray]:
    """The log-probability (float32) of every target token the objective scores, and each
    token's weight in the objective: the objective is then -sum(coef * logp), the mean of its
    terms, or their weighted aggregate (climb.config.objective.coefficients) (bpb: the target
    texts' tokens over ln 2 x bytes; a task's gold loss per byte: each item's gold continuation
    over its bytes and the task's items). `target` is what load_target gives, or a part of it."""
    from proxies.evaluate import gold_token_logprobs, token_logprobs
    terms = expert_terms(target_cfg)
    weighted = coefficients(target_cfg)  # None: the plain mean of the terms
    logps, coefs = [], []
    for j, term in enumerate(terms):
        scale = 1.0 if weighted is None else weighted[j][1]
        if term == "bpb":
            lp, n_bytes = token_logprobs(model, tok, target["texts"], device=device, bf16=False)
            logps.append(lp)
            coefs.append(np.full(len(lp), scale / (math.log(2) * n_bytes)))
            continue
        name = term.rsplit("/", 1)[0]
        if name not in target["tasks"]:
            raise InputError(f"target.objective names {term}, but target.tasks has no {name!r}")
        items = gold_token_logprobs(model, tok, target["tasks"][name], device=device, bf16=False)
        for lp, n_bytes in items:
            logps.append(lp)
            coefs.append(np.full(len(lp), scale / (n_bytes * len(items))))
    coef = np.concatenate(coefs)
    return np.concatenate(logps).astype(np.float32), coef / len(terms) if weighted is None else coef


def save_logprobs(path: Path, model, tok, task, device: str) -> None:
    """A ProxyTask's `objective_logprobs` on its whole target, as {path} (.npy) and the weights
    as {path stem}.coef.npy (coef_path), for expert features."""
    from climb.io.files import write_npy
    logp, coef = objective_logprobs(model, tok, task.target, load_target(task.target, Path(task.run_dir)), device)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_npy(path, logp)
    write_npy(coef_path(path), coef)


def coef_path(logprobs: Path) -> Path:
    """Where the weights of the tokens in an expert's log-probabilities file are kept."""
    return logprobs.with_name(logprobs.stem + ".coef.npy")
