"""Checks made before the first stage that could waste work on a setting.

A setting that only the data can refute (a column name, a path, a metric name, a token
budget the corpus cannot fill) is checked here, as early as its inputs exist: the corpus
and the target before any stage (after the inputs climb builds itself, such as the demo
corpus), the token budget once the token store's counts exist and before the search
trains anything. A check reads a few records of a file (`climb.io.files.peek`), never
the corpus. Each broken rule raises an `InputError` naming the setting, the file and the
fix, which `climb` turns into one line and exit code 2.

    from climb.runtime import preflight
    preflight.check(cfg, paths, ("embed", "cluster", "tokenize", "search"))  # before the stages
    preflight.before("search", cfg, paths)                                   # before each stage

The corpus: in each of its first `FILES` files, the first `SAMPLE` records must have the
`corpus.text_column` field, and at least one of them the `corpus.id_column` field (none
is refused; some but not all is a warning: the others get ids `<file stem>:<row>`, so a
file's ids would be of two kinds).

The target, where a search or validation will run: its files match (`target.texts`),
their records have `target.text_column`, the task files exist and parse (`target.tasks`;
with a validation, `validate.texts`, `text_column` and `tasks` alike), the harness's
include folders exist (`target.lm_eval_include`), and every term of `target.objective` is a metric the proxies report: for the built-in
trainer the names follow from the target (`bpb`, `<task>/acc|acc_norm|gold_loss_per_byte`,
the harness tasks' `<task>/<metric>`, `train_loss`); for `proxy.lookup` they are the
metrics file's columns; an external `proxy.command` reports what it reports, so its
names are checked at its first proxy (climb.runtime.targets.objective). Where the target
is read by an external trainer only, what cannot be read here is a warning.
"""
from __future__ import annotations

import itertools
import logging
import math
from pathlib import Path

from climb.config import RunConfig
from climb.io.errors import InputError
from climb.io.files import check_shard_names, is_url, peek, resolve_corpus_files

log = logging.getLogger(__name__)
SAMPLE = 200  # records read of each file a check looks into
FILES = 4  # files of the corpus (and of the target texts) looked into
TASK_ITEMS = 20  # items of each target task file parsed
BUILTIN_TASK_METRICS = ("acc", "acc_norm", "gold_loss_per_byte")


def check(cfg: RunConfig, paths, stages) -> None:
    """Every check whose inputs exist before the first of `stages` runs."""
    check_corpus(cfg, paths.root)
    check_devices(cfg, stages)
    if "tokenize" in stages and cfg.proxy.tokenizer and not is_url(cfg.proxy.tokenizer) \
            and not Path(cfg.proxy.tokenizer).is_file():
        raise InputError(f"proxy.tokenizer: {cfg.proxy.tokenizer} is not a file; set proxy.tokenizer to a "
                         "tokenizer.json, or to \"\" to train one on the corpus")
    if "search" in stages or "validate" in stages or ("tokenize" in stages and cfg.target.decontaminate):
        check_target(cfg, paths.root, validates="validate" in stages)
    if "search" in stages:
        check_bound_sources(cfg, paths.root)


def before(stage: str, cfg: RunConfig, paths) -> None:
    """The checks due just before `stage` runs, on what the stages before it wrote, and before it
    touches its own earlier outputs: before the cluster stage, the documents against cluster.k;
    before the search, the token budget and the minimum weight against the clusters (the search's
    own checks, its bounds and an earlier run it reuses, follow in climb.pipeline._before)."""
    if stage == "cluster":
        check_k(cfg, paths)
    if stage == "search":
        check_budget(cfg, paths)
        check_min_weight(cfg, paths)


def check_devices(cfg: RunConfig, stages) -> None:
    """A CUDA device named in embed.device, proxy.device or validate.device needs a GPU here."""
    from climb.config.checks import validation_model
    named = [(s, d) for s, d, used in (("embed.device", cfg.embed.device, "embed" in stages),
                                       ("proxy.device", cfg.proxy.device, "search" in stages),
                                       ("validate.model.device" if "device" in cfg.validate.model else "proxy.device",
                                        validation_model(cfg).device, "validate" in stages))
             if used and isinstance(d, str) and d.startswith("cuda")]
    if not named:
        return
    import torch
    if not torch.cuda.is_available():
        s, d = named[0]
        raise InputError(f"{s} = {d!r}, but this machine has no CUDA device; set {s} to \"auto\" or \"cpu\"")


def check_k(cfg: RunConfig, paths) -> None:
    """cluster.k against the documents the embed stage wrote (their count is in its manifest)."""
    if not paths.manifest("embed").exists():
        return
    docs = int(paths.stats("embed").get("docs", 0))
    if docs and docs < cfg.cluster.k:
        raise InputError(f"{docs} documents but cluster.k={cfg.cluster.k}: need at least as many documents as "
                         f"clusters; lower it (--set cluster.k={max(2, docs // 10)}) or add documents")


def check_min_weight(cfg: RunConfig, paths) -> None:
    """search.min_weight times the clusters must leave room for a mixture (weights sum to 1)."""
    if not paths.cluster.summary.exists() or not cfg.search.min_weight:
        return
    k = paths.n_clusters()
    if cfg.search.min_weight * k > 1 + 1e-9:
        raise InputError(f"search.min_weight = {cfg.search.min_weight:g} for each of {k} clusters sums to "
                         f"{cfg.search.min_weight * k:.3g} > 1: no mixture fits; set search.min_weight to at "
                         f"most {1 / k:.4g} (1 / clusters), or 0")


def check_bound_sources(cfg: RunConfig, run_dir: Path) -> None:
    """Each "source:<name>" of search.bounds names one of the corpus's sources. Whether the clusters'
    caps and sources can meet the bounds is checked once the clusters' tokens are known, before the
    search (climb.stages.search.common.check_bounds)."""
    from climb.config.checks import parse_bound
    wanted = [name for kind, name, _, _ in (parse_bound(k, v) for k, v in cfg.search.bounds.items())
              if kind == "source"]
    if not wanted:
        return
    known = source_names(cfg, run_dir)
    if known is None:
        return
    if not known:
        raise InputError(f"search.bounds: source:{wanted[0]} bounds a corpus source, but the corpus has no "
                         "sources; name them in the corpus config or bound clusters instead")
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise InputError(f"search.bounds: source:{unknown[0]}: the corpus has no source {unknown[0]!r}; its "
                         f"sources are {', '.join(known)}")


def source_names(cfg: RunConfig, run_dir: Path) -> list[str] | None:
    """The corpus's source names (climb.io.sources.corpus_source_names)."""
    from climb.io.sources import corpus_source_names
    return list(corpus_source_names(cfg, resolve_corpus_files(cfg.corpus.paths, run_dir, cfg.corpus.max_shards)))


# ----------------------------------------------------------------- the corpus
def check_corpus(cfg: RunConfig, run_dir: Path) -> None:
    corpus = cfg.corpus
    files = resolve_corpus_files(corpus.paths, run_dir, corpus.max_shards)
    twice = sorted({str(f) for f in files if files.count(f) > 1})
    if twice:
        raise InputError(f"corpus.paths: {twice[0]} is matched by more than one of its patterns; "
                         "list each file once")
    check_shard_names(files)
    empty = []
    for f in files[:FILES]:
        fields, rows, values = peek(f, [corpus.text_column] + ([corpus.id_column] if corpus.id_column else []),
                                    SAMPLE)
        if not rows:
            empty.append(f)  # the stages count what they read and say when nothing is left
            continue
        if corpus.text_column not in values:
            raise InputError(f"{f}: {_none_have(rows, corpus.text_column, 'corpus.text_column', fields)}; "
                             f"set corpus.text_column to the field holding the text"
                             f"{_example('corpus.text_column', fields)}")
        texts = [v for v in values[corpus.text_column] if v is not None]
        if texts and not any(isinstance(v, str) for v in texts):
            raise InputError(f"{f}: the {corpus.text_column!r} field (corpus.text_column) of {_records(rows)} "
                             f"holds {type(texts[0]).__name__} values, not text; set corpus.text_column to the "
                             f"field holding the text{_example('corpus.text_column', fields)}")
        if corpus.source_column and corpus.source_column not in fields:
            raise InputError(f"{f}: {_none_have(rows, corpus.source_column, 'corpus.source_column', fields)}; set "
                             "corpus.source_column to the field naming each document's source, or to \"\" to use "
                             "the corpus files as sources")
        if not corpus.id_column:
            continue
        have = sum(v is not None for v in values.get(corpus.id_column, ()))
        if not have:
            none = (_none_have(rows, corpus.id_column, "corpus.id_column", fields) if rows == 1 else
                    f"0 of {_records(rows)} have a {corpus.id_column!r} field (corpus.id_column); it has "
                    f"{_fields(fields)}")
            raise InputError(f"{f}: {none}; set corpus.id_column to the field "
                             f"holding a stable document id, or to \"\" to make ids <file stem>:<row>")
        if have < rows:
            log.warning("%s: %d of %s have a %r field (corpus.id_column); the others get ids "
                        "<file stem>:<row>", f, have, _records(rows), corpus.id_column)
    if empty and len(empty) == len(files):
        raise InputError(f"the corpus has no records: {', '.join(map(str, empty))} "
                         f"{'is' if len(empty) == 1 else 'are'} empty; check corpus.paths")
    for f in empty:
        log.warning("%s: no records; it adds nothing to the corpus (corpus.paths)", f)


# ----------------------------------------------------------------- the target
def reads_target_here(cfg: RunConfig, validates: bool = False) -> bool:
    """Whether this process reads the target: the built-in trainer scores it, target.decontaminate
    takes it out of the token store, or a validation with the built-in trainer scores it."""
    from climb.config.checks import validation_model
    builtin = not cfg.proxy.command and not cfg.proxy.lookup
    return builtin or cfg.target.decontaminate or (validates and not validation_model(cfg).command
                                                   and not cfg.proxy.lookup)


def check_target(cfg: RunConfig, run_dir: Path, validates: bool = False) -> None:
    t = cfg.target
    here = reads_target_here(cfg, validates)
    _check_texts("target", t.texts, t.text_column, run_dir, here)
    _check_tasks("target", t.tasks, run_dir, here)
    if validates:  # the held-out evaluations of the validate stage, scored by the built-in trainer
        v = cfg.validate
        _check_texts("validate", v.texts, v.text_column, run_dir, True)
        _check_tasks("validate", v.tasks, run_dir, True)
    if t.lm_eval:
        for folder in t.lm_eval_include:
            if not Path(folder).is_dir():
                raise InputError(f"target.lm_eval_include: {folder} is not a folder; fix target.lm_eval_include "
                                 "(folders of task YAMLs for the harness)")
    if not cfg.proxy.command and not cfg.proxy.lookup:
        if not t.texts and not t.tasks and not t.lm_eval:
            raise InputError("the target is empty: set target.texts (held-out text), target.tasks and/or "
                             "target.lm_eval")
        _check_objective(t, builtin_metrics(t), "the built-in proxy trainer reports", " for this target")
    elif cfg.proxy.lookup and not is_url(cfg.proxy.lookup):
        columns = _csv_columns(cfg.proxy.lookup)
        if columns is not None:
            _check_objective(t, columns - {cfg.proxy.lookup_key}, f"proxy.lookup's metrics file "
                             f"{cfg.proxy.lookup} has the metric columns")


def _check_texts(section: str, patterns, column: str, run_dir: Path, here: bool) -> None:
    """`<section>.texts` match files whose first records have `<section>.text_column`."""
    for pattern in patterns:
        try:
            files = resolve_corpus_files([pattern], run_dir)
        except InputError as e:
            if "no corpus files match" not in str(e):  # a file there, of a kind climb does not read
                _refuse(here, f"{section}.texts: {e}")
                continue
            _refuse(here, f"{section}.texts: no file matches {_written(pattern, run_dir)}; fix {section}.texts "
                          "(held-out text: JSON Lines or Parquet files, globs of them or URLs, e.g. --set "
                          f"{section}.texts='[\"data/heldout.jsonl\"]')")
            continue
        for f in files[:FILES]:
            try:
                fields, rows, values = peek(f, [column], SAMPLE)
            except InputError as e:
                _refuse(here, f"{e} (a file of {section}.texts)")
                continue
            if not rows:
                _refuse(here, f"{f}: no records; fix {section}.texts (held-out text, one document per record)")
            elif column not in values:
                setting = f"{section}.text_column"
                _refuse(here, f"{f}: {_none_have(rows, column, setting, fields)}; set {setting} to the field "
                              f"holding the held-out text{_example(setting, fields)}")


def _check_tasks(section: str, tasks: dict, run_dir: Path, here: bool) -> None:
    """Each of `<section>.tasks` exists and its first items parse."""
    from proxies.evaluate import parse_tasks
    for name, path in sorted(tasks.items()):
        path, where = path.replace("{run}", str(run_dir)), f"{section}.tasks.{name}"
        try:
            lines = _first_items(path)
        except (FileNotFoundError, InputError):
            _refuse(here, f"{section} task file {path} not found; fix {where}")
            continue
        except OSError as e:
            _refuse(here, f"{section} task file {path}: cannot read ({e.strerror or e}); fix {where}")
            continue
        try:
            parse_tasks(lines, path)
        except ValueError as e:
            _refuse(here, f"{e}; fix {where} (JSON Lines: {{\"query\", \"choices\", \"gold\"}} or "
                          "{\"context\", \"continuation\"} items)")


def _first_items(path: str) -> list[str]:
    """The lines of a task file up to its TASK_ITEMS-th non-blank one."""
    import io
    if is_url(path):
        from climb.io.remote import errors, info, open_input
        info(path)
        with open_input(path) as fh, errors(path):
            return _head(io.TextIOWrapper(fh, encoding="utf-8"))
    if not Path(path).is_file():
        raise FileNotFoundError(path)
    with open(path, encoding="utf-8") as fh:
        return _head(fh)


def _head(lines) -> list[str]:
    out, items = [], 0
    for line in lines:
        out.append(line)
        items += bool(line.strip())
        if items >= TASK_ITEMS:
            break
    return out


def builtin_metrics(t) -> set[str] | None:
    """The metric names the built-in trainer reports for target `t`; a harness task's `<task>/`
    names are added where the harness says which metrics the task has."""
    names = {"train_loss"} | ({"bpb"} if t.texts else set())
    names |= {f"{task}/{m}" for task in t.tasks for m in BUILTIN_TASK_METRICS}
    if t.lm_eval:
        names |= harness_metrics(t)
    return names


def harness_metrics(t) -> set[str]:
    """`<task>/<metric>` (with `,<filter>` for a filter other than none) and
    `<task>/gold_loss_per_byte` of each of target.lm_eval's tasks; a group's, or a task whose
    metrics the harness does not list, as `<name>/*` (any metric)."""
    from climb.runtime.harness import _leaves, load_tasks
    tasks = load_tasks(t)
    names: set[str] = set()
    for key in tasks:
        if isinstance(tasks[key], dict):
            names.add(f"{key if isinstance(key, str) else getattr(key, 'group_name', key)}/*")
    for name, task in _leaves(tasks):
        try:
            metrics = list(task.aggregation())
            filters = [f.name for f in getattr(task, "_filters", [])] or ["none"]
            rolling = task.get_config("output_type") == "loglikelihood_rolling"
        except Exception:  # noqa: BLE001  (another harness version: leave the task's names open)
            names.add(f"{name}/*")
            continue
        names |= {f"{name}/{m}" + ("" if f == "none" else f",{f}") for m in metrics for f in filters}
        if not rolling:
            names.add(f"{name}/gold_loss_per_byte")
    return names


def _check_objective(t, known: set[str], reporter: str, where: str = "") -> None:
    bad = [m for m in t.objective if m not in known and f"{m.rsplit('/', 1)[0]}/*" not in known]
    if bad:
        listed = sorted(k for k in known if not k.endswith("/*"))
        groups = sorted(k for k in known if k.endswith("/*"))
        example = next((k for k in ("bpb", *listed) if k in known and k != "train_loss"),
                       listed[0] if listed else "bpb")
        more = f" and {len(listed) - 20} more" if len(listed) > 20 else ""
        raise InputError(f"target.objective names {bad}, but {reporter} {listed[:20]}{more}"
                         f"{' and ' + ', '.join(groups) if groups else ''}{where}; fix target.objective "
                         f"(e.g. --set target.objective='[\"{example}\"]')")


def _csv_columns(path: str) -> set[str] | None:
    """The columns of a CSV file's header (None where it cannot be read: the look-up says why)."""
    import csv
    try:
        with open(path, newline="") as fh:
            return set(next(csv.reader(fh), []))
    except (OSError, UnicodeDecodeError):
        return None


# ----------------------------------------------------------------- the budget
def check_budget(cfg: RunConfig, paths) -> None:
    """export.token_budget must fit the corpus within search.epoch_cap: the search's caps on each
    cluster (climb.stages.search.common.mixture_space) must leave room for one mixture."""
    import numpy as np

    from proxies.tokens import TokenStore
    if not (paths.tokenize.store / "index.json").exists():
        return
    tokens = TokenStore(paths.tokenize.store).tokens.astype(np.int64)
    usable = tokens > cfg.proxy.seq_len + 1
    if not usable.any():
        return  # the search says so itself (proxy.seq_len against the clusters' sizes)
    total = int(tokens[usable].sum())
    budget = cfg.export.token_budget or total
    cap = cfg.search.epoch_cap
    if np.minimum(1.0, cap * tokens[usable] / budget).sum() >= 1 - 1e-9:
        return
    most = int(cap * total)
    what = (f"export.token_budget = {cfg.export.token_budget:,}" if cfg.export.token_budget
            else f"export.token_budget = 0 (for the search: the corpus once, {total:,} tokens)")
    raise InputError(
        f"{what} does not fit this corpus under search.epoch_cap = {cap:g}: its {int(usable.sum())} clusters "
        f"large enough for a proxy hold {total:,} tokens (the proxies' tokens, in which the search caps each "
        f"cluster), and no cluster may be repeated more than {cap:g} times, so a mixture reaches at most "
        f"{most:,} tokens; set export.token_budget to at most {most:,}"
        + (" (or 0: the most the epoch cap allows)" if cap >= 1 else "")
        + f", raise search.epoch_cap to at least {math.ceil(100 * budget / total) / 100:g}, or add documents")


# ----------------------------------------------------------------- wording
def _refuse(here: bool, msg: str) -> None:
    """Refuse where this process reads the input; warn where only an external trainer does."""
    if here:
        raise InputError(msg)
    log.warning("%s (the external trainer reads the target itself, so the run goes on)", msg)


def _written(pattern: str, run_dir: Path) -> str:
    resolved = pattern.replace("{run}", str(run_dir))
    return repr(pattern) + (f" ({resolved})" if resolved != pattern else "")


def _records(rows: int) -> str:
    """The records a check read: a file's first SAMPLE, or all of a shorter one."""
    return f"its first {rows} records" if rows >= SAMPLE else "its one record" if rows == 1 else f"its {rows} records"


def _none_have(rows: int, column: str, setting: str, fields: list[str]) -> str:
    which = f"its one record has no {column!r} field" if rows == 1 else \
        f"none of {_records(rows)} has a {column!r} field"
    return f"{which} ({setting}); it has {_fields(fields)}"


def _fields(fields: list[str]) -> str:
    shown = list(itertools.islice(fields, 20))
    return f"the fields {shown}" + (f" and {len(fields) - 20} more" if len(fields) > 20 else "")


def _example(setting: str, fields: list[str]) -> str:
    guess = next((f for f in ("text", "content", "document", "body") if f in fields), None)
    return f" (e.g. --set {setting}={guess})" if guess else ""
