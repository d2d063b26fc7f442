"""Sources (corpus.source_column, or the corpus files): their names, each one's share of each cluster's
tokens (search/sources.json), and the mixture shown by source in mixture.json, summary.json, the
report and the export."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from climb import pipeline
from climb.config import load_config
from climb.config.schema import key_data
from climb.io.errors import InputError
from climb.io.files import read_documents
from climb.io.sources import MISSING, corpus_source_names, file_sources
from scripted_run import prepare
from conftest import vocab_docs

KIND = {"sea": "books", "code": "github", "food": "web"}


def _cfg(tmp_path, *extra: str):
    return load_config(None, [f'corpus.paths=["{tmp_path}/corpus/*"]', *extra])


def _write(tmp_path, name: str, rows: dict) -> None:
    (tmp_path / "corpus").mkdir(exist_ok=True)
    if name.endswith(".parquet"):
        pq.write_table(pa.table(rows), tmp_path / "corpus" / name)
        return
    keys = list(rows)
    with open(tmp_path / "corpus" / name, "w") as fh:
        for vals in zip(*rows.values()):
            fh.write(json.dumps(dict(zip(keys, vals))) + "\n")


def test_source_names_from_a_column_and_from_file_names(tmp_path):
    _write(tmp_path, "a.parquet", {"id": ["1", "2", "3"], "text": ["x y", "y z", "z x"],
                                   "source": ["web", "code", None]})
    _write(tmp_path, "b.jsonl", {"id": ["4", "5"], "text": ["p q", "q r"], "source": ["books", "web"]})
    cfg = _cfg(tmp_path, 'corpus.source_column="source"')
    files = sorted((tmp_path / "corpus").iterdir())
    assert corpus_source_names(cfg, files) == sorted(["books", "code", "web", MISSING])
    assert corpus_source_names(_cfg(tmp_path), files) == ["a", "b"]


def test_a_missing_source_column_is_refused_naming_the_file_and_the_setting(tmp_path):
    from climb.runtime import preflight
    _write(tmp_path, "a.parquet", {"id": ["1"], "text": ["x y"], "origin": ["web"]})
    cfg = _cfg(tmp_path, 'corpus.source_column="source"')
    for call in (lambda: corpus_source_names(cfg, [tmp_path / "corpus" / "a.parquet"]),
                 lambda: preflight.check_corpus(cfg, tmp_path)):
        with pytest.raises(InputError, match=r"a\.parquet.*'source'.*corpus\.source_column"):
            call()
    (tmp_path / "corpus" / "a.parquet").unlink()
    _write(tmp_path, "b.jsonl", {"id": ["1"], "text": ["x y"], "origin": ["web"]})
    with pytest.raises(InputError, match=r"b\.jsonl.*'source'.*corpus\.source_column"):
        corpus_source_names(cfg, [tmp_path / "corpus" / "b.jsonl"])


def test_each_documents_source_lines_up_with_the_documents_read(tmp_path):
    """Empty documents are skipped by every stage: a Parquet file with some is read for its documents,
    not row by row, and every row's source still counts as a name."""
    text = ["a b", "  ", "c d", "", "e f", "g h"]
    source = ["web", "gone", "code", "web", "books", "code"]
    _write(tmp_path, "a.parquet", {"id": list("123456"), "text": text, "source": source})
    cfg = _cfg(tmp_path, 'corpus.source_column="source"')
    path = tmp_path / "corpus" / "a.parquet"
    docs = sum(len(b.ids) for b in read_documents(path, "text", "id"))
    names, codes = file_sources(path, cfg.corpus, docs)
    assert names == ["books", "code", "gone", "web"]
    assert [names[c] for c in codes] == ["web", "code", "books", "code"]
    # Every row a document: the column alone, row by row.
    _write(tmp_path, "a.parquet", {"id": list("123"), "text": ["a b", "c d", "e f"], "source": [1, 2, 1]})
    names, codes = file_sources(path, cfg.corpus, 3)
    assert names == ["1", "2"] and codes.tolist() == [0, 1, 0]


def _docs() -> list[dict]:
    """The scripted run's documents with a source each (mostly one per vocabulary, a quarter from
    "web", a few with none), some empty and some exact duplicates (dropped: dedup.drop)."""
    docs = vocab_docs(40)
    for j, d in enumerate(docs):
        d["source"] = KIND[d["label"]] if j % 4 else "web"
    docs[5]["source"] = docs[6]["source"] = None
    docs += [dict(d, id=f"{d['id']}-again") for d in docs[:6]]
    docs += [{"id": f"empty-{j}", "text": " ", "label": "sea", "source": "empty-only"} for j in range(3)]
    return docs


@pytest.fixture
def finished(tmp_path, monkeypatch):
    """A small run folder, searched, exported and reported, with corpus.source_column = "source"."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, 'corpus.source_column="source"', "dedup.drop=true",
                               "export.token_budget=6000", docs=_docs(), columns=("source",))
    pipeline.run_stage("export", cfg, paths.root)
    pipeline.run_stage("report", cfg, paths.root)
    return cfg, paths


def test_source_shares_sum_to_the_clusters_tokens_and_show_in_every_view(finished):
    from climb.stages.search.sources import source_shares
    from climb.stages.tokenize import cluster_tokens
    cfg, paths = finished
    assert paths.stats("tokenize").get("dropped_duplicate_tokens")  # duplicates left the store
    shares = json.loads(paths.search.sources.read_text())
    names = shares["names"]
    assert names == sorted(["books", "github", "web", MISSING, "empty-only"])
    tokens, share = np.array(shares["tokens"]), np.array(shares["share"])
    assert tokens.shape == (paths.n_clusters(), len(names))
    assert tokens.sum(axis=1).tolist() == cluster_tokens(paths).tolist()
    assert tokens[:, names.index("empty-only")].sum() == 0 and tokens[:, names.index(MISSING)].sum() > 0
    assert np.allclose(share.sum(axis=1)[tokens.sum(axis=1) > 0], 1.0)
    # By the corpus files instead: other names, the same clusters' tokens.
    files = source_shares(dataclasses.replace(cfg, corpus=dataclasses.replace(cfg.corpus, source_column="")), paths)
    assert files["names"] == paths.shards() and files["column"] == ""
    assert np.array(files["tokens"]).sum(axis=1).tolist() == cluster_tokens(paths).tolist()

    mix = json.loads(paths.search.mixture.read_text())
    by = mix["by_source"]
    assert by["names"] == names
    for name, w in (("climb", mix["weights"]), ("natural", mix["natural"]), ("uniform", mix["uniform"])):
        assert np.allclose(by[name], np.asarray(w) @ share) and abs(sum(by[name]) - 1) < 1e-9
    # The natural mixture by source is each source's share of all the tokens in usable clusters.
    assert np.allclose(by["natural"], tokens.sum(axis=0) / tokens.sum())

    summary = json.loads(paths.report.summary.read_text())
    assert summary["by_source"] == by
    page = paths.report.page.read_text()
    assert "## By source" in page and "| source | natural | found | uniform |" in page
    assert f"| github | {by['natural'][names.index('github')]:.3f} | {by['climb'][names.index('github')]:.3f} |" in page
    assert "| cluster | docs | natural | found | top terms | main sources |" in page

    exported = json.loads(paths.export.mixture.read_text())["by_source"]
    total = json.loads(paths.export.mixture.read_text())["tokens"]
    assert exported["names"] == names and sum(exported["tokens"]) == total
    assert np.allclose(exported["weights"], by["climb"])
    assert abs(sum(exported["realised_weights"]) - 1) < 1e-9
    card = (paths.export.dir / "README.md").read_text()
    assert "### By source" in card and f"| github | {exported['weights'][names.index('github')]:.4f} |" in card


def test_a_run_folder_from_before_sources_still_reports(finished):
    """No sources.json and no by_source in mixture.json (a search made before them): the report works
    the mixture by source out on demand, the same as the search wrote it."""
    from climb.stages.search.summary import search_summary
    cfg, paths = finished
    mix = json.loads(paths.search.mixture.read_text())
    wrote = mix.pop("by_source")
    paths.search.mixture.write_text(json.dumps(mix))
    paths.search.sources.unlink()
    again = search_summary(cfg, paths, 0, paths.n_clusters())["by_source"]
    assert again["names"] == wrote["names"]
    for name in ("climb", "natural", "uniform"):
        assert again[name] == pytest.approx(wrote[name])
    paths.manifest("report").unlink()
    pipeline.run_stage("report", cfg, paths.root)
    assert "## By source" in paths.report.page.read_text()


def test_the_source_column_enters_only_the_search_key_and_only_with_a_source_bound(finished):
    from climb.stages import cluster, embed, search, tokenize
    cfg, paths = finished
    unset = dataclasses.replace(cfg, corpus=dataclasses.replace(cfg.corpus, source_column=""))
    other = dataclasses.replace(cfg, corpus=dataclasses.replace(cfg.corpus, source_column="label"))
    for stage in (embed, cluster, tokenize):
        assert stage.key(cfg, paths) == stage.key(unset, paths) == stage.key(other, paths)
    # Views by source are worked out again from the column: no proxy is trained again for them.
    assert search.key(cfg, paths) == search.key(unset, paths) == search.key(other, paths)

    def bounded(c):
        return dataclasses.replace(c, search=dataclasses.replace(c.search, bounds={"source:x": [0.0, 0.5]}))
    assert len({search.key(bounded(cfg), paths), search.key(bounded(unset), paths),
                search.key(bounded(other), paths)}) == 3
    # Unset, it is not in the key's data at all: a run folder made before it keeps its search key.
    assert "source_column" not in key_data(unset.corpus) and "source_column" in key_data(cfg.corpus)
