"""Each stage's key holds what its outputs depend on, and nothing more: on one finished small run,
every field of [validate], [export], [track] and [executor], and the [proxy] and [search] fields
that change how proxies run, is changed one at a time, and each stage's key is compared with the
run's. A stage the field must leave alone keeps its key; the stage it is for gets another one, so
the walk fails both ways. Where a field moves an earlier stage (validate.enabled sizes the token
store for the validation model), that stage is run again in a copy and the later keys are taken
there. The config has no [report] section: the report keys on the search, the validate stage
and the run's name, and a change of the name reruns the report alone.

Then what `make demo` followed by `make validate` does, small: the store grows in place (the
tokenizer kept, every proxy's tokens the same), the search is skipped, the validation models
train; a run without validation afterwards redoes nothing. And a run folder as an older climb
left it (a token store that passed on its cap, a validation keyed without the store's cap,
embeddings keyed on the "tuned" student's settings) is upgraded without redoing a stage.

The proxies and the validation model are the built-in trainer's, a few steps of small models
(an external trainer reads its own data, so the store's cap would not follow the validation model).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from climb.config import RunConfig, digest, load_config
from climb.runtime.stage import finish, state_file
from climb.runtime.layout import RunPaths
from climb.stages import cluster, embed, export, report, search, tokenize, validate

STAGES = ("embed", "cluster", "tokenize", "search", "validate", "export")
KEYS = {"embed": embed.key, "cluster": cluster.key, "tokenize": tokenize.key, "search": search.key,
        "validate": validate.key, "export": export.key}
PROXY_READS = 2 * 4 * 17  # proxy.steps x batch_size x (seq_len + 1)
VALIDATION_READS = 2 * PROXY_READS  # validate.tokens (2) times the steps

# A changed value for the fields a rule cannot make one for (strings, lists, tables). A field added
# to a walked section without one here fails the walk until it has one.
CHANGED = {
    ("validate", "model"): {"command": "", "n_embd": 32, "n_head": 2, "n_layer": 1, "lr": 1e-3},
    ("validate", "baselines"): ("natural",),
    ("validate", "texts"): ("heldout.parquet",),
    ("validate", "text_column"): "body",
    ("validate", "tasks"): {"piqa": "piqa.jsonl"},
    ("export", "tokenizer"): "bytes",
    ("export", "long_docs"): "skip",
    ("export", "destination"): "{run}/elsewhere",
    ("export", "format"): "both",
    ("export", "eod"): "</s>",
    ("track", "backend"): "mlflow",
    ("track", "uri"): "sqlite:///elsewhere.db",
    ("track", "experiment"): "another",
    ("executor", "kind"): "dask",
    ("executor", "dask_address"): "tcp://127.0.0.1:8786",
    ("executor", "dask_dashboard"): ":8787",
    ("executor", "dask_memory_limit"): "2GiB",
}
# How a stage may run differently without measuring anything else (its key leaves them out).
HOW_PROXIES_RUN = (("proxy", "timeout_s"), ("proxy", "curve_points"), ("proxy", "curve_evals"),
                   ("search", "retry_failed"))


def changed(section: str, name: str, value):
    if (section, name) in CHANGED:
        return CHANGED[(section, name)]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return 2 * value + 1
    if isinstance(value, float):
        return 2 * value + 0.5
    raise AssertionError(f"no changed value for {section}.{name} = {value!r}: add one to CHANGED")


def with_field(cfg: RunConfig, section: str, name: str, value) -> RunConfig:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})


def walked(cfg: RunConfig, *sections: str):
    """(section, field, the config with that field changed) for every field of the sections."""
    for section in sections:
        for f in dataclasses.fields(getattr(cfg, section)):
            value = changed(section, f.name, getattr(getattr(cfg, section), f.name))
            yield section, f.name, with_field(cfg, section, f.name, value)


def keys(cfg: RunConfig, paths: RunPaths) -> dict[str, str]:
    return {s: KEYS[s](cfg, paths) for s in STAGES}


def copy_run(paths: RunPaths, to: Path) -> RunPaths:
    shutil.copytree(paths.root, to)
    return RunPaths(to)


def keys_after_earlier_stages(cfg: RunConfig, paths: RunPaths, before: dict, tmp: Path) -> tuple[dict, dict]:
    """The stages' keys under `cfg`, with the token store made again (in a copy) where its key
    moved; and which stages ran again for it."""
    got = keys(cfg, paths)
    if got["tokenize"] == before["tokenize"]:
        return got, {}
    moved = copy_run(paths, tmp / f"copy-{len(list(tmp.iterdir()))}")
    stats = tokenize.run(cfg, moved)
    return keys(cfg, moved), {"tokenize": stats, "search": search.run(cfg, moved), "paths": moved}


def _skipped(stats: dict) -> bool:
    return bool(stats.get("skipped_stage"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """(cfg, paths, {stage: key}) of a small run finished without validation: embed, cluster,
    tokenize, search, export and report."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from conftest import FakeModel, vocab_docs, write_parquet_shards
    tmp = tmp_path_factory.mktemp("walk")
    docs = vocab_docs(60)
    write_parquet_shards(tmp / "corpus", docs, 2)
    # the target holds documents of the corpus: the search's contamination scan finds them
    pq.write_table(pa.table({"text": [d["text"] for d in docs[::4]]}), tmp / "target.parquet")
    cfg = load_config(None, [
        f'corpus.paths=["{tmp}/corpus/*.parquet"]', "cluster.k=4", "cluster.niter=10",
        "proxy.vocab_size=320", "proxy.seq_len=16", "proxy.tokenizer_docs=100", "proxy.steps=2",
        "proxy.batch_size=4", "proxy.warmup_steps=1", "proxy.n_embd=16", "proxy.n_head=2", "proxy.n_layer=1",
        'target.objective=["bpb"]', 'target.goal="minimize"', f'target.texts=["{tmp}/target.parquet"]',
        "search.iterations=[4, 2]", "search.pool_size=2000", "search.min_weight=0.0", "search.epoch_cap=100.0",
        "search.replicates=0", "search.eval_seeds=2", "executor.processes=1",
        "validate.rank_mixtures=0", 'validate.baselines=["uniform"]'])
    paths = RunPaths(tmp / "run")
    mp = pytest.MonkeyPatch()
    mp.setattr(embed, "load_model", lambda c: FakeModel())
    try:
        embed.run(cfg, paths)
    finally:
        mp.undo()
    cluster.run(cfg, paths)
    tokenize.run(cfg, paths)
    search.run(cfg, paths)
    export.run(cfg, paths)
    report.run(cfg, paths)
    assert paths.stats("tokenize")["cap"] == PROXY_READS
    assert max(tokenize.cluster_tokens(paths)) > VALIDATION_READS  # the cap cuts, for both sizes
    return cfg, paths, keys(cfg, paths)


def test_validate_settings_rerun_no_search_nor_export(finished, tmp_path):
    cfg, paths, before = finished
    for section, name, cfg2 in walked(cfg, "validate"):
        where = f"{section}.{name}"
        got, reran = keys_after_earlier_stages(cfg2, paths, before, tmp_path)
        for s in ("embed", "cluster", "search", "export"):
            assert got[s] == before[s], f"{where} changes the {s} key"
        if name == "enabled":
            # the store grows to what the validation model reads: its own key moves, its proxies'
            # tokens do not, so the search is skipped (and the validation, which read a store sized
            # for the proxies, runs again on the whole of what it reads)
            assert reran and reran["tokenize"]["cap"] == VALIDATION_READS and _skipped(reran["search"])
        else:
            assert not reran, f"{where} changes the tokenize key"
        assert got["validate"] != before["validate"], f"{where} does not change the validate key"
        assert _skipped(report.run(cfg2, reran.get("paths", paths))), f"{where} reruns the report"


def test_export_settings_rerun_only_the_export(finished):
    cfg, paths, before = finished
    for section, name, cfg2 in walked(cfg, "export"):
        where = f"{section}.{name}"
        got = keys(cfg2, paths)
        for s in ("embed", "cluster", "tokenize", "validate"):
            assert got[s] == before[s], f"{where} changes the {s} key"
        # the budget sets the epoch caps the search obeys
        assert (got["search"] != before["search"]) == (name == "token_budget"), f"{where} and the search key"
        assert got["export"] != before["export"], f"{where} does not change the export key"
        assert _skipped(report.run(cfg2, paths)), f"{where} reruns the report"


def test_tracking_and_executor_settings_rerun_nothing(finished):
    cfg, paths, before = finished
    for section, name, cfg2 in walked(cfg, "track", "executor"):
        assert keys(cfg2, paths) == before, f"{section}.{name} changes a stage key"
        assert _skipped(report.run(cfg2, paths)), f"{section}.{name} reruns the report"


def test_how_proxies_run_is_not_what_they_measure(finished):
    cfg, paths, before = finished
    for section, name in HOW_PROXIES_RUN:
        cfg2 = with_field(cfg, section, name, changed(section, name, getattr(getattr(cfg, section), name)))
        assert keys(cfg2, paths) == before, f"{section}.{name} changes a stage key"
    # ... while what they train does: the search and the validation model (which scales [proxy])
    got = keys(with_field(cfg, "proxy", "lr", 2 * cfg.proxy.lr), paths)
    assert [s for s in STAGES if got[s] != before[s]] == ["search", "validate"]


def test_the_name_reruns_only_the_report(finished, tmp_path):
    cfg, paths, before = finished
    renamed = dataclasses.replace(cfg, name="another")
    assert keys(renamed, paths) == before
    copy = copy_run(paths, tmp_path / "renamed")
    assert not _skipped(report.run(renamed, copy))


def test_the_tuned_students_settings_key_only_its_embeddings(finished):
    cfg, paths, before = finished
    tuned = with_field(cfg, "embed", "backend", "tuned")
    for name, value in (("tune_sample", 777), ("student", "linear")):
        assert embed.key(with_field(cfg, "embed", name, value), paths) == before["embed"], name
        assert embed.key(with_field(tuned, "embed", name, value), paths) != embed.key(tuned, paths), name


def _heads(paths: RunPaths, n: int) -> list[np.ndarray]:
    from proxies.tokens import TokenStore
    store = TokenStore(paths.tokenize.store)
    return [np.asarray(store.head(c, n)[0:n]) for c in range(store.n_clusters)]


def test_validation_after_a_run_without_it_trains_only_the_validation(finished, tmp_path):
    """`make demo`, then `make validate`, then `make demo` again, on a small run."""
    cfg, paths, before = finished
    paths = copy_run(paths, tmp_path / "run")
    tokenizer, heads = paths.tokenize.tokenizer.stat().st_mtime_ns, _heads(paths, PROXY_READS)
    stored = paths.stats("tokenize")["stored_tokens"]
    searched = {f.name: f.read_bytes() for f in paths.search.dir.iterdir() if f.is_file()}
    on = with_field(cfg, "validate", "enabled", True)
    ran = {"embed": embed.run(on, paths), "cluster": cluster.run(on, paths), "tokenize": tokenize.run(on, paths),
           "search": search.run(on, paths), "validate": validate.run(on, paths), "export": export.run(on, paths),
           "report": report.run(on, paths)}
    assert [s for s, st in ran.items() if not _skipped(st)] == ["tokenize", "validate", "report"]
    # the store grew in place: the tokenizer kept, each cluster's first proxy tokens the same
    assert ran["tokenize"]["cap"] == VALIDATION_READS and ran["tokenize"]["stored_tokens"] > stored
    assert paths.tokenize.tokenizer.stat().st_mtime_ns == tokenizer
    assert all(np.array_equal(a, b) for a, b in zip(_heads(paths, PROXY_READS), heads))
    assert {f.name: f.read_bytes() for f in paths.search.dir.iterdir() if f.is_file()} == searched
    # ... so a proxy trained on the grown store measures what the search measured
    from climb.runtime.proxy_runs import train_and_score
    from climb.stages.search.common import proxy_task
    rec = search.read_results(paths)[0]
    again = train_and_score(proxy_task(on, paths, rec["mixture_id"], rec["iteration"], rec["weights"], rec["seed"]))
    assert again["objective"] == rec["objective"]
    # the validation models trained: 2 mixtures (the found one and uniform) x 3 seeds
    assert ran["validate"]["trained"] == 6 and len(validate.read_results(paths)) == 6
    # the contamination scan of the grown store finds what the search's found: what the proxies read
    from climb.stages.tokenize.contamination import check
    scanned = paths.search.contamination.read_bytes()
    assert json.loads(scanned)["docs"] > 0
    check(on, paths)
    assert paths.search.contamination.read_bytes() == scanned
    # a run without validation afterwards keeps the store sized for the validation model, and the
    # report keeps its validation
    again = {"tokenize": tokenize.run(cfg, paths), "search": search.run(cfg, paths),
             "export": export.run(cfg, paths), "report": report.run(cfg, paths)}
    assert all(_skipped(st) for st in again.values()), again
    assert validate.key(cfg, paths) == json.loads(paths.manifest("validate").read_text())["key"]


def test_an_older_run_folder_is_upgraded_without_redoing_a_stage(finished, tmp_path, caplog):
    """A run folder as climb left it before the store passed on less than its key: the token store's
    manifest passed on its key (its cap in it), its state's resume key held the cap too, and the
    search and the export keyed on that. Validation turned on grows the store in place and redoes
    nothing after it; a validation that ran on a store sized for the proxies, keyed without the
    store's cap, is accepted, and then runs again once the store holds what it reads."""
    import logging
    cfg, paths, _ = finished
    paths = copy_run(paths, tmp_path / "old")
    m = json.loads(paths.manifest("tokenize").read_text())
    passed = m["hash"] = m["key"]  # what later stages keyed on: the store's key, its cap in it
    paths.manifest("tokenize").write_text(json.dumps(m))
    state = state_file(paths.tokenize.dir)
    old_resume = digest(json.loads(paths.manifest("cluster").read_text())["resume"],
                        *tokenize._settings(cfg, None))  # the parts keyed on the cap
    state.write_text(json.dumps({**json.loads(state.read_text()), "resume": old_resume}))
    for s, key in (("search", search.key), ("export", export.key)):
        m = json.loads(paths.manifest(s).read_text())
        m["hash"] = m["key"] = key(cfg, paths)
        paths.manifest(s).write_text(json.dumps(m))
    # a validation run on this store (`climb validate` without validate.enabled), as an older climb keyed it
    assert validate.key(cfg, paths) != validate.key(cfg, paths, legacy=True)
    finish(paths, "validate", validate.key(cfg, paths, legacy=True), {"models": 0}, time.time())
    older = json.loads(paths.manifest("validate").read_text())
    caplog.set_level(logging.INFO)
    assert _skipped(validate.run(cfg, paths))
    upgraded = json.loads(paths.manifest("validate").read_text())
    assert upgraded["key"] == validate.key(cfg, paths) and upgraded["hash"] == older["hash"]
    assert [r for r in caplog.records if "upgraded this run folder's manifests" in r.getMessage()]
    tokenizer = paths.tokenize.tokenizer.stat().st_mtime_ns
    on = with_field(cfg, "validate", "enabled", True)
    grown = tokenize.run(on, paths)
    assert not _skipped(grown) and grown["cap"] == VALIDATION_READS
    assert paths.tokenize.tokenizer.stat().st_mtime_ns == tokenizer  # resumed, not made anew
    assert json.loads(paths.manifest("tokenize").read_text())["hash"] == passed  # what it passed on before
    assert _skipped(search.run(on, paths)) and _skipped(export.run(on, paths))
    # the validation read less of a cluster than its model reads: now it runs again
    assert validate.key(on, paths) != upgraded["key"]


def test_embeddings_keyed_with_the_tuned_students_settings_are_upgraded(finished, tmp_path):
    """An older climb keyed the embeddings of every backend on embed.tune_sample and embed.student."""
    cfg, paths, _ = finished
    paths = copy_run(paths, tmp_path / "old")
    sampled = with_field(cfg, "embed", "tune_sample", 777)
    m = json.loads(paths.manifest("embed").read_text())
    m["key"] = embed.former_key(sampled, paths, paths.corpus_files(sampled))
    assert m["key"] != embed.key(sampled, paths)
    paths.manifest("embed").write_text(json.dumps(m))
    assert _skipped(embed.run(sampled, paths)) and _skipped(cluster.run(sampled, paths))
    assert json.loads(paths.manifest("embed").read_text())["key"] == embed.key(sampled, paths)
