"""Settings only the data can refute are refused before the first stage that could waste work
on them (climb/runtime/preflight.py): one line naming the setting, the file and the fix, exit 2.

The target and corpus checks read a few records, so they answer in well under 2 s on a
100,000-document JSON Lines corpus; the token budget is checked once the token store's
counts exist, before the search trains a proxy.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from climb import pipeline  # noqa: F401  (imported here, so a timed call pays no import)
from climb.cli import main
from climb.config import STAGES, load_config
from climb.io.errors import InputError
from climb.runtime import preflight
from climb.runtime.layout import RunPaths
from scripted_run import prepare

DOCS = 100_000


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """A config file over a 100,000-document JSON Lines corpus and a held-out file, as a user writes them."""
    d = tmp_path_factory.mktemp("own")
    with open(d / "big.jsonl", "w") as fh:
        fh.writelines(f'{{"id": "d{i}", "text": "word{i % 97} alpha beta gamma"}}\n' for i in range(DOCS))
    (d / "heldout.jsonl").write_text("".join(json.dumps({"id": f"h{i}", "text": f"held out {i}"}) + "\n"
                                             for i in range(30)))
    (d / "bad_task.jsonl").write_text(json.dumps({"query": "q", "choices": "not a list", "gold": 0}) + "\n")
    (d / "own.toml").write_text(f"""name = "own"
[corpus]
paths = ["{d}/big.jsonl"]
[target]
texts = ["{d}/heldout.jsonl"]
""")
    return d


def _cli(own: Path, run: Path, capsys, *settings: str) -> tuple[int, str, float]:
    """(exit code, the one line on stderr, seconds) of `climb run` with these settings."""
    args = ["run", "--config", str(own / "own.toml"), "--run", str(run)]
    for s in settings:
        args += ["--set", s]
    t0 = time.perf_counter()
    code = main(args)
    seconds = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(" ")]
    assert "Traceback" not in err
    return code, lines[-1], seconds


def _no_stage_ran(run: Path) -> None:
    assert not [s for s in STAGES if (run / s).exists()]  # no stage folder, so no manifest either


@pytest.mark.parametrize("setting, wanted", [
    ("target.text_column=content", ["heldout.jsonl: none of its 30 records has a 'content' field "
                                    "(target.text_column)", "['id', 'text']", "set target.text_column",
                                    "--set target.text_column=text"]),
    ('target.texts=["{own}/heldout_reuter.jsonl"]', ["target.texts: no file matches", "heldout_reuter.jsonl",
                                                     "fix target.texts"]),
    ('target.objective=["bpp"]', ["target.objective names ['bpp']", "reports ['bpb', 'train_loss']",
                                  "fix target.objective"]),
    ('target.tasks={{piqa="{own}/nope.jsonl"}}', ["target task file", "nope.jsonl not found",
                                                  "fix target.tasks.piqa"]),
    ('target.tasks={{t="{own}/bad_task.jsonl"}}', ["bad_task.jsonl:1", "'choices' must be", "fix target.tasks.t"]),
    ('target.objective=["t/acc"]', ["target.objective names ['t/acc']", "fix target.objective"]),
    ("target.texts=[]", ["the target is empty", "target.texts"]),
    ("corpus.text_column=body", ["big.jsonl: none of its first 200 records has a 'body' field (corpus.text_column)",
                                 "set corpus.text_column"]),
    ("corpus.id_column=url", ["big.jsonl: 0 of its first 200 records have a 'url' field (corpus.id_column)",
                              "['id', 'text']", "set corpus.id_column", 'or to "" to make ids']),
])
def test_a_typo_is_refused_before_any_stage_and_fast(own, tmp_path, capsys, setting, wanted):
    run = tmp_path / "run"
    code, line, seconds = _cli(own, run, capsys, setting.format(own=own))
    assert code == 2 and line.startswith("climb: error: ")
    for w in wanted:
        assert w in line, line
    _no_stage_ran(run)
    assert seconds < 2.0, f"{seconds:.2f} s on a {DOCS:,}-document corpus"


def test_the_target_path_with_the_run_folder_is_named_as_written(tmp_path):
    cfg = load_config(None, ['target.texts=["{run}/data/target/h.jsonl"]'])
    with pytest.raises(InputError, match=r"no file matches '\{run\}/data/target/h.jsonl' \(.*/run/data/target/h"):
        preflight.check_target(cfg, tmp_path / "run")
    (tmp_path / "run" / "data" / "target").mkdir(parents=True)
    (tmp_path / "run" / "data" / "target" / "h.jsonl").write_text('{"text": "a held-out text"}\n')
    preflight.check_target(cfg, tmp_path / "run")  # built before the stages, as the demo's is: fine
    held = load_config(None, ['target.texts=["{run}/data/target/h.jsonl"]', 'validate.texts=["{run}/held.jsonl"]',
                              'validate.text_column="body"'])
    preflight.check_target(held, tmp_path / "run")  # only a validation reads validate.texts
    with pytest.raises(InputError, match=r"validate.texts: no file matches '\{run\}/held.jsonl'"):
        preflight.check_target(held, tmp_path / "run", validates=True)
    (tmp_path / "run" / "held.jsonl").write_text('{"text": "another held-out text"}\n')
    with pytest.raises(InputError, match=r"held.jsonl: its one record has no 'body' field "
                                         r"\(validate.text_column\)"):
        preflight.check_target(held, tmp_path / "run", validates=True)


def test_some_ids_missing_is_a_warning_with_the_count(tmp_path, caplog):
    lines = [json.dumps({"id": f"a{i}", "text": "x y"} if i % 4 else {"text": "x y"}) for i in range(400)]
    (tmp_path / "c.jsonl").write_text("\n".join(lines) + "\n")
    cfg = load_config(None, [f'corpus.paths=["{tmp_path}/c.jsonl"]'])
    with caplog.at_level(logging.WARNING, logger="climb.runtime.preflight"):
        preflight.check_corpus(cfg, tmp_path)
    assert "c.jsonl: 150 of its first 200 records have a 'id' field (corpus.id_column)" in caplog.text
    assert "<file stem>:<row>" in caplog.text


def test_a_parquet_corpus_is_refused_alike(tmp_path):
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["one", "two"]}), tmp_path / "c.parquet")
    cfg = load_config(None, [f'corpus.paths=["{tmp_path}/c.parquet"]', 'corpus.id_column="url"'])
    with pytest.raises(InputError, match=r"c.parquet: 0 of its 2 records have a 'url' field \(corpus.id_column\)"):
        preflight.check_corpus(cfg, tmp_path)


def test_an_external_trainers_target_is_only_warned_about(tmp_path, caplog):
    """An external trainer may read a target this machine does not hold: a warning, as before."""
    cfg = load_config(None, ['proxy.command="train {weights} {out}"', 'target.texts=["nowhere.jsonl"]',
                             'target.objective=["loss"]'])
    with caplog.at_level(logging.WARNING, logger="climb.runtime.preflight"):
        preflight.check_target(cfg, tmp_path)
    assert "target.texts: no file matches 'nowhere.jsonl'" in caplog.text
    decontaminating = load_config(None, ['proxy.command="train {weights} {out}"', 'target.texts=["nowhere.jsonl"]',
                                         "target.decontaminate=true"])
    with pytest.raises(InputError, match="target.texts: no file matches"):  # then climb reads it itself
        preflight.check_target(decontaminating, tmp_path)


def test_a_lookups_objective_is_one_of_its_columns(tmp_path):
    (tmp_path / "m.csv").write_text("index,loss,acc\n0,1.0,0.5\n")
    lookup = [f'proxy.lookup="{tmp_path}/m.csv"', f'proxy.lookup_weights="{tmp_path}/w.csv"']
    preflight.check_target(load_config(None, [*lookup, 'target.objective=["loss"]']), tmp_path)
    with pytest.raises(InputError, match=r"names \['lost'\], but proxy.lookup's metrics file .*m.csv has the "
                                         r"metric columns \['acc', 'loss'\]; fix target.objective "
                                         r"\(e.g. --set target.objective='\[\"acc\"\]'\)"):
        preflight.check_target(load_config(None, [*lookup, 'target.objective=["lost"]']), tmp_path)


def test_harness_metric_names_are_known_before_any_stage(tmp_path):
    pytest.importorskip("lm_eval")
    from climb.runtime import harness
    items = [{"query": "Question: which?\n", "choices": ["this one", "that one"], "gold": 0}] * 3
    (tmp_path / "mc.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
    (tmp_path / "mc_local.yaml").write_text(f"""task: mc_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / 'mc.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{gold}}}}"
metric_list:
  - metric: acc
""")
    harness._CACHE.clear()
    task = [f'target.lm_eval=["{tmp_path}/mc_local.yaml"]', 'target.goal="maximize"']
    for good, goal in (("mc_local/acc", "maximize"), ("mc_local/gold_loss_per_byte", "minimize")):
        preflight.check_target(load_config(None, [*task, f'target.objective=["{good}"]', f'target.goal="{goal}"']),
                               tmp_path)
    with pytest.raises(InputError, match=r"names \['mc_local/acc_norm'\], but the built-in proxy trainer reports "
                                         r"\['mc_local/acc', 'mc_local/gold_loss_per_byte', 'train_loss'\]"):
        preflight.check_target(load_config(None, [*task, 'target.objective=["mc_local/acc_norm"]']), tmp_path)


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz", "c.parquet"])
def test_peek_reads_the_first_records_local_or_remote(tmp_path, name):
    import fsspec

    from climb.io.files import peek
    docs = [{"id": f"d{i}", "text": f"text {i}"} if i % 2 else {"text": f"text {i}"} for i in range(500)]
    local = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(pa.table({"id": [d.get("id") for d in docs], "text": [d["text"] for d in docs]}), local)
    else:
        import gzip
        raw = "".join(json.dumps(d) + "\n" for d in docs).encode()
        local.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    url = f"memory://peek-{tmp_path.name}/{name}"
    fsspec.filesystem("memory").pipe(url, local.read_bytes())
    for where in (local, url):
        fields, rows, values = peek(where, ["text", "id", "url"], 200)
        assert fields == ["text", "id"] or fields == ["id", "text"]
        assert rows == 200 and set(values) == {"text", "id"}
        assert values["text"][:2] == ["text 0", "text 1"] and sum(v is not None for v in values["id"]) == 100


# ----------------------------------------------------------------- the token budget
def _store(root: Path, tokens: list[int]) -> RunPaths:
    paths = RunPaths(root)
    store = paths.tokenize.store
    store.mkdir(parents=True)
    (store / "index.json").write_text(json.dumps({"dtype": "uint16", "n_clusters": len(tokens), "tokens": tokens,
                                                  "bytes": [4 * t for t in tokens]}))
    return paths


@pytest.mark.parametrize("budget, cap", [(8_800, 4.0), (8_801, 4.0), (0, 0.5), (0, 1.0), (2_000, 1.0), (2_600, 1.0)])
def test_the_budget_check_refuses_what_the_search_cannot_sample(tmp_path, budget, cap):
    """Exactly the budgets for which the search's caps leave no mixture (climb.stages.search.common)."""
    from climb.optimize.candidates import sample_candidates
    from climb.stages.search.common import mixture_space
    tokens = [1_000, 1_200, 50, 50]  # the last two hold less than one proxy sequence (seq_len 128)
    paths = _store(tmp_path, tokens)
    cfg = load_config(None, [f"export.token_budget={budget}", f"search.epoch_cap={cap}"])
    space = mixture_space(cfg, np.array(tokens))
    try:
        sample_candidates(space["natural"], 8, np.random.default_rng(0), max_weight=space["max_weight"])
        fits = True
    except ValueError as e:
        assert "no mixture fits" in str(e)
        fits = False
    if fits:
        preflight.check_budget(cfg, paths)
        return
    with pytest.raises(InputError) as e:
        preflight.check_budget(cfg, paths)
    msg = str(e.value)
    assert "export.token_budget = " in msg and f"search.epoch_cap = {cap:g}" in msg
    assert "its 2 clusters large enough for a proxy hold 2,200 tokens" in msg
    assert f"at most {int(cap * 2_200):,} tokens" in msg


def test_a_small_corpus_stops_after_tokenize_naming_the_settings(tmp_path, monkeypatch, capsys):
    _, paths, config_file, _ = prepare(tmp_path, monkeypatch)  # embedded and clustered; epoch cap 100
    code = main(["search", "--config", str(config_file), "--run", str(paths.root),
                 "--set", "export.token_budget=100000000"])
    line = [x for x in capsys.readouterr().err.splitlines() if x.strip()][-1]
    from proxies.tokens import TokenStore
    total = int(TokenStore(paths.tokenize.store).tokens.sum())
    assert code == 2, line
    assert line.startswith("climb: error: export.token_budget = 100,000,000 does not fit this corpus under "
                           "search.epoch_cap = 100")
    assert f"hold {total:,} tokens" in line and f"set export.token_budget to at most {100 * total:,}" in line
    assert "raise search.epoch_cap to at least" in line
    assert paths.manifest("tokenize").exists() and not (paths.root / "search").exists()


def test_an_external_trainers_unknown_metric_stops_the_first_proxy(tmp_path, monkeypatch):
    """proxy.command reports what it reports: the name is checked on its first record."""
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, 'target.objective=["lost"]')
    with pytest.raises(InputError, match=r"target.objective names \['lost'\], but the proxy reported \['loss'\]; "
                                         "set target.objective to metrics it reports"):
        pipeline.run_stage("search", cfg, paths.root)
    assert not paths.search.mixture.exists()


def test_a_target_file_of_another_kind_is_named_as_such(tmp_path):
    (tmp_path / "held.txt").write_text("plain text, not JSON Lines\n")
    cfg = load_config(None, [f'target.texts=["{tmp_path}/held.txt"]'])
    with pytest.raises(InputError, match=r"target.texts: .*held.txt: unsupported file type; use Parquet, JSON Lines"):
        preflight.check_target(cfg, tmp_path)


def test_a_file_matched_twice_and_two_files_of_one_name_are_told_apart(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d in ("a", "b"):
        (tmp_path / d / "part.jsonl").write_text('{"id": "x", "text": "some words"}\n')
    twice = load_config(None, [f'corpus.paths=["{tmp_path}/a/*.jsonl", "{tmp_path}/a/part.jsonl"]'])
    with pytest.raises(InputError, match=r"a/part.jsonl is matched by more than one of its patterns"):
        preflight.check_corpus(twice, tmp_path)
    two = load_config(None, [f'corpus.paths=["{tmp_path}/a/*.jsonl", "{tmp_path}/b/*.jsonl"]'])
    with pytest.raises(InputError, match=r"share the shard name\(s\) \['part'\] \(e.g. part.parquet in two folders\)"):
        preflight.check_corpus(two, tmp_path)


def test_a_text_column_of_numbers_is_refused(tmp_path):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"id": f"a{i}", "text": i, "body": "words"}) + "\n"
                                              for i in range(5)))
    cfg = load_config(None, [f'corpus.paths=["{tmp_path}/c.jsonl"]'])
    with pytest.raises(InputError, match=r"c.jsonl: the 'text' field \(corpus.text_column\) of its 5 records holds "
                                         r"int values, not text"):
        preflight.check_corpus(cfg, tmp_path)
