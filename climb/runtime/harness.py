"""Targets from the LM Evaluation Harness (`target.lm_eval`; PyPI `lm-eval`, the `harness` extra).

Any task the harness can load is a target: a name it ships (`arc_easy`, `mmlu`, ...) or a
task YAML of your own over local files (`target.lm_eval = ["pipelines/tasks/piqa.yaml"]`:
its folder joins the harness's include path, the task is the one it names). A relative
local path in such a YAML (`dataset_kwargs.data_files`, `data_dir`, a `dataset_path`
folder) is read from the YAML's own folder, so the YAML works from any current folder
(one found only from the current folder, where the harness itself looks, is kept as it
is: `local_paths`). The built-in
proxies are wrapped as a harness `LM` (`ProxyLM`): `loglikelihood` scores each
(context, continuation) as the harness's own models do (proxies.evaluate.encode_pairs),
`loglikelihood_rolling` a whole text in disjoint windows, one token of context each (the
harness's `get_rolling_token_windows`); tasks that generate text are refused. Each task
gives `<task>/<metric>` for the harness's metrics (`acc`, `acc_norm`, `bits_per_byte`,
...; a filter other than `none` is kept as `<metric>,<filter>`), and, for the
log-likelihood tasks, `<task>/gold_loss_per_byte`: the gold continuation's loss in nats
per UTF-8 byte, read from the harness's own per-document log-likelihoods (the smooth
signal small proxies need; `task_limit` caps the documents of each task).

Nothing is downloaded: tasks are loaded with the Hub offline, once per process, and a
task the harness cannot load from what is here (a name it does not know, a dataset on the
Hub) fails before any stage runs, with one line (`check`).

An external trainer's checkpoint in Hugging Face format is scored the same way, with the
harness's own `hf` model, so a `proxy.command` can end with::

    python -m climb.runtime.harness --hf CHECKPOINT --config run.toml --out {out}
"""
from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np

from climb.config import TargetConfig
from climb.io.files import InputError, is_url

log = logging.getLogger(__name__)
_CACHE: dict = {}
SKIP = ("alias", "name", "sample_len", "sample_count", " ")


def task_specs(target_cfg: TargetConfig) -> tuple[list[str], list[str]]:
    """(task names, include folders) of `target.lm_eval`: a YAML file stands for the task it
    names, its folder joining the include path (with `target.lm_eval_include`)."""
    names, include = [], [str(Path(p).resolve()) for p in target_cfg.lm_eval_include]
    for entry in target_cfg.lm_eval:
        p = Path(entry)
        if p.suffix in (".yaml", ".yml"):
            if not p.is_file():
                where = "" if p.is_absolute() else f" (a relative path is read from the current folder, {Path.cwd()})"
                raise InputError(f"target.lm_eval: task file {p} not found{where}")
            name = _yaml_task(p)
            include.append(str(p.resolve().parent))
            names.append(name)
        else:
            names.append(entry)
    return names, sorted(set(include))


def _yaml_task(path: Path) -> str:
    import yaml
    try:
        doc = yaml.safe_load(path.read_text())
    except Exception as e:  # the harness's YAML may carry !function tags: read the name line instead
        for line in path.read_text().splitlines():
            if line.startswith("task:"):
                return line.split(":", 1)[1].strip().strip("'\"")
        raise InputError(f"target.lm_eval: {path} is not a task YAML ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("task"), str):
        raise InputError(f"target.lm_eval: {path} names no task (a `task:` line)")
    return doc["task"]


def _yaml_config(path: Path) -> dict | None:
    """A task YAML's whole config as the harness reads it (its includes merged, `!function`
    tags resolved); None where this version of the harness has no loader climb knows."""
    try:
        from lm_eval.tasks._yaml_loader import load_yaml
    except ImportError:
        try:
            from lm_eval.utils import load_yaml_config
        except ImportError:
            return None
        return load_yaml_config(str(path), mode="full")
    return load_yaml(path, resolve_func=True)


def _from(folder: Path, value):
    """A path (or glob) relative to `folder` made absolute. URLs and absolute paths stay, and so
    does a path found only from the current folder, where the harness itself looks."""
    if not isinstance(value, str) or not value or is_url(value) or Path(value).expanduser().is_absolute():
        return value
    there = str(folder / value)
    if glob.glob(there, recursive=True) or not glob.glob(value, recursive=True):
        return there
    return value


def local_paths(config: dict, folder: Path) -> dict:
    """A task config with its relative local data paths read from `folder` (the YAML's):
    `dataset_kwargs.data_dir`, else `dataset_kwargs.data_files` (which `datasets` reads
    from `data_dir` where one is set), and a `dataset_path` that names a local folder or file
    (`./mine`, `data/mine`), not a builder such as `json`."""
    out = dict(config)
    kwargs = dict(out.get("dataset_kwargs") or {})
    if kwargs.get("data_dir"):
        kwargs["data_dir"] = _from(folder, kwargs["data_dir"])
    elif "data_files" in kwargs:
        files = kwargs["data_files"]
        if isinstance(files, dict):
            kwargs["data_files"] = {split: [_from(folder, f) for f in v] if isinstance(v, list) else _from(folder, v)
                                    for split, v in files.items()}
        elif isinstance(files, list):
            kwargs["data_files"] = [_from(folder, f) for f in files]
        else:
            kwargs["data_files"] = _from(folder, files)
    if kwargs:
        out["dataset_kwargs"] = kwargs
    path = out.get("dataset_path")
    if isinstance(path, str) and ("/" in path or path.startswith(".")) and (folder / path).exists():
        out["dataset_path"] = _from(folder, path)
    return out


def _spec(name: str, path: Path) -> str | dict:
    """How the harness is to load the task a YAML names: by its name where the YAML names no
    relative local data path, else as its whole config with those paths made absolute."""
    config = _yaml_config(path)
    if config is None:
        return name
    resolved = local_paths(config, path.resolve().parent)
    return name if resolved == config else resolved


def _offline() -> None:
    for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(k, "1")
    logging.getLogger("lm_eval").setLevel(logging.ERROR)


def load_tasks(target_cfg: TargetConfig) -> dict:
    """The harness's task dict for `target.lm_eval`, cached per process; InputError in one line
    where a task cannot be loaded from what is here."""
    names, include = task_specs(target_cfg)
    yamls = {n: Path(e) for n, e in zip(names, target_cfg.lm_eval) if Path(e).suffix in (".yaml", ".yml")}
    key = (tuple(names), tuple(include), tuple(str(p.resolve()) for p in yamls.values()),
           os.getcwd() if yamls else "")
    if key in _CACHE:
        return _CACHE[key]
    _offline()
    try:
        from lm_eval.tasks import TaskManager, get_task_dict
    except ImportError as e:
        raise InputError(f"target.lm_eval needs the LM Evaluation Harness ({e}); pip install 'climb[harness]' "
                         "(lm-eval)") from None
    manager = TaskManager(include_path=include or None, verbosity="ERROR")
    unknown = [n for n in names if n not in manager.all_tasks]
    if unknown:
        raise InputError(f"target.lm_eval: the harness knows no task {unknown[0]!r}; give one it ships or a task "
                         f"YAML file (include folders: {include or 'none'})")
    try:
        tasks = get_task_dict([_spec(n, yamls[n]) if n in yamls else n for n in names], manager)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"target.lm_eval: cannot load {', '.join(names)} from what is on this machine (nothing is "
                         f"downloaded at run time): {type(e).__name__}: {first}") from None
    for name, task in _leaves(tasks):
        if task.get_config("output_type") == "generate_until":
            raise InputError(f"target.lm_eval: {name} generates text, which a proxy does not score; choose "
                             "multiple-choice, log-likelihood or perplexity tasks")
    _CACHE[key] = tasks
    return tasks


def _leaves(tasks: dict):
    for k, v in tasks.items():
        if isinstance(v, dict):
            yield from _leaves(v)
        else:
            yield (k if isinstance(k, str) else getattr(k, "group_name", str(k))), v


def check(target_cfg: TargetConfig) -> None:
    """Fail before any stage runs where `target.lm_eval` cannot be loaded or scored."""
    if target_cfg.lm_eval:
        load_tasks(target_cfg)


def proxy_lm(model, tokenizer, device: str, bf16: bool | None = False, batch_size: int = 32):
    """A built-in proxy as the harness's `LM`."""
    from lm_eval.api.model import LM

    from proxies.evaluate import encode_pairs, score_token_pairs

    class ProxyLM(LM):
        def loglikelihood(self, requests, disable_tqdm: bool = False):
            pairs = encode_pairs(tokenizer, [r.args for r in requests])
            return score_token_pairs(model, pairs, device=device, batch_size=batch_size, bf16=bf16)

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
            from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
            T = model.config.seq_len
            out = []
            for ids in tokenizer.encode_batch([r.args[0] for r in requests]):
                windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                    token_list=list(ids), prefix_token=tokenizer.eos_id, max_seq_len=T, context_len=1)]
                scores = score_token_pairs(model, [(list(c), list(x)) for c, x in windows], device=device,
                                           batch_size=batch_size, bf16=bf16)
                out.append(float(sum(s[0] for s in scores)))
            return out

        def generate_until(self, requests, disable_tqdm: bool = False):
            raise NotImplementedError("proxies do not generate text; choose log-likelihood tasks")

    return ProxyLM()


def evaluate(lm, target_cfg: TargetConfig) -> dict:
    """`target.lm_eval`'s metrics for a harness LM: {"<task>/<metric>": value}."""
    from lm_eval import evaluator
    tasks = load_tasks(target_cfg)
    res = evaluator.evaluate(lm, tasks, limit=target_cfg.task_limit or None, bootstrap_iters=0, log_samples=True,
                             verbosity="ERROR")
    metrics: dict[str, float] = {}
    for task, row in res["results"].items():
        for k, v in row.items():
            if any(k.startswith(s) for s in SKIP) or "_stderr" in k or not isinstance(v, (int, float)):
                continue
            metric, _, filt = k.partition(",")
            metrics[f"{task}/{metric}" if filt in ("", "none") else f"{task}/{metric},{filt}"] = float(v)
    for task, samples in res.get("samples", {}).items():
        gold = gold_loss_per_byte(samples)
        if gold is not None:
            metrics[f"{task}/gold_loss_per_byte"] = gold
    return metrics


def gold_loss_per_byte(samples: list[dict]) -> float | None:
    """The mean over documents of the gold continuation's loss per UTF-8 byte, from the harness's
    logged samples of a log-likelihood task (None for other kinds)."""
    losses = []
    for s in samples:
        args, resps = s.get("arguments"), s.get("resps")
        if not args or not resps or not all(isinstance(a, (list, tuple)) and len(a) == 2 for a in args):
            return None
        gold = s.get("target")
        if len(args) == 1:  # one continuation: a cloze item, LAMBADA's
            i = 0
        elif isinstance(gold, (int, np.integer)) and 0 <= int(gold) < len(args):
            i = int(gold)
        else:
            return None
        ll = resps[i][0][0] if isinstance(resps[i][0], (list, tuple)) else resps[i][0]
        losses.append(-float(ll) / max(1, len(args[i][1].encode("utf-8"))))
    return float(np.mean(losses)) if losses else None


def score_proxy(model, tokenizer, target_cfg: TargetConfig, device: str, bf16: bool | None = False) -> dict:
    """A built-in proxy's `target.lm_eval` metrics."""
    return evaluate(proxy_lm(model, tokenizer, device, bf16), target_cfg)


def score_hf(checkpoint: str, target_cfg: TargetConfig, device: str = "cpu", batch_size: int = 16) -> dict:
    """A Hugging Face checkpoint's `target.lm_eval` metrics, with the harness's own `hf` model."""
    _offline()
    from lm_eval.models.huggingface import HFLM
    return evaluate(HFLM(pretrained=checkpoint, device=device, batch_size=batch_size), target_cfg)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Score a Hugging Face checkpoint on a config's target.lm_eval tasks "
                                             "and write the metrics record a proxy.command writes to {out}.")
    ap.add_argument("--hf", required=True, help="the checkpoint folder (config.json, weights, tokenizer)")
    ap.add_argument("--config", required=True, help="the run config whose [target] lm_eval tasks to score")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--set", action="append", default=[], help="config overrides, as climb's --set")
    args = ap.parse_args(argv)
    from climb.config import load_config
    cfg = load_config(args.config, args.set)
    try:
        metrics = score_hf(args.hf, cfg.target, args.device)
    except InputError as e:
        print(f"climb.runtime.harness: error: {e}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps({"metrics": metrics}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
