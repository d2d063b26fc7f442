"""The corpus-update measurement's driver: which files and settings each preset's sequence uses."""
import importlib


def _fresh():
    import benchmarks.corpus_updates as cu
    return importlib.reload(cu)  # `use` rebinds module globals: start from the demo's


def test_the_bench_sequence_reads_the_shared_parts_in_place_and_starts_from_the_bench_preset_run():
    cu = _fresh()
    try:
        cu.use("bench")
        sets = cu.version_sets(4)
        assert "cluster.refit=true" in sets
        assert any(s.startswith("proxy.tokenizer=") and "g49bench_base" in s for s in sets)  # v1's tokenizer
        paths = next(s for s in sets if s.startswith("corpus.paths="))
        assert paths.count("part-0000") == 4 and "shared/data/corpus/part-00000.parquet" in paths
        assert "g52bench/data/shards/code.parquet" in paths
        assert not any(s.startswith("target.texts=") for s in sets)  # the preset's own task target
        assert "part-00001" not in next(s for s in cu.version_sets(5) if s.startswith("corpus.paths="))
        assert cu.run_dir("full", 1, 20).name == "g49bench_default_s20"  # v1 is the bench preset's own run
        assert cu.record_file("full", 1, 20).name == "g49bench_default_s20.json"
        assert cu.record_file("reused", 2, 20).name == "g52bench_reused_v2_s20.json"
        assert cu.base(2).name == "base_v2" and cu.base(2).parent.name == "g52bench"
        assert cu.MARGIN == 0.005 and cu.REUSED == []  # the library's reuse defaults
        assert cu.BASELINE_SEED == 20  # chains side by side: one seed's trains each version's baselines
    finally:
        _fresh()


def test_the_demo_sequence_keeps_each_arms_setting_explicit():
    cu = _fresh()
    assert cu.MARGIN == 0.01 and cu.PREFIX == "g52"
    assert cu.REUSED == ["search.reuse_sharpen=0"]  # as the `reused` sequence was measured
    assert cu.BASELINE_SEED is None  # whichever full search of a version came first
    assert cu.ARMS["reused-sharp-alone"][1] == ["search.reuse_sharpen=4"]
    assert any(s.startswith("target.texts=") and "tech_heldout" in s for s in cu.version_sets(2))


def _chain_world(tmp_path, monkeypatch, found):
    """The demo chain's driver with searches faked: `found[(arm, v, seed)]` is what a search of that
    run finds; a record holds what the run found when it first ran."""
    import json

    cu = _fresh()
    monkeypatch.setattr(cu, "G", tmp_path / "g52")
    monkeypatch.setattr(cu, "RECORDS", tmp_path / "records")
    (tmp_path / "records").mkdir()
    monkeypatch.setattr(cu, "prepare", lambda: None)
    monkeypatch.setattr(cu, "_kept", lambda v, s: None)
    searched = []

    def search(arm, v, seed, sets):
        run = cu.run_dir(arm, v, seed)
        (run / "search").mkdir(parents=True, exist_ok=True)
        (run / "search" / "mixture.json").write_text(json.dumps({"weights": found[arm, v, seed]}))
        (run / "search" / "manifest.json").write_text("{}")
        searched.append((arm, v, seed, [x for x in sets if x.startswith("search.reuse=")]))
        return run

    def keep(arm, v, seed, run):
        f = cu.record_file(arm, v, seed)
        if not f.exists():
            f.write_text(json.dumps({"mixtures": json.loads((run / "search" / "mixture.json").read_text())}))
    monkeypatch.setattr(cu, "_search", search)
    monkeypatch.setattr(cu, "_keep", keep)
    return cu, searched


def test_a_chain_goes_on_from_its_records_on_a_machine_without_its_run_folders(tmp_path, monkeypatch):
    import shutil
    found = {(a, v, 0): [v / 10, 1 - v / 10] for a in ("full", "reused") for v in range(1, 6)}
    cu, searched = _chain_world(tmp_path, monkeypatch, found)
    try:
        cu.train([0], [1, 2])  # u1, u2: full and reused on v2, v3
        assert [(a, v) for a, v, _, _ in searched] == [("full", 1), ("full", 2), ("reused", 2), ("full", 3),
                                                        ("reused", 3)]
        shutil.rmtree(tmp_path / "g52")  # a new machine: the records are kept, the run folders are not
        searched.clear()
        cu.train([0], [1, 2, 3])
        # nothing with a record trains again but the chain's earlier runs that u3's reused search names,
        # each run again from the start of the chain (v3's reused names v2's, which names v1's full)
        assert [(a, v) for a, v, _, _ in searched] == [("full", 4), ("full", 1), ("reused", 2), ("reused", 3),
                                                        ("reused", 4)]
        assert searched[-1][3] == [f'search.reuse="{cu.run_dir("reused", 3, 0)}"']
        shutil.rmtree(tmp_path / "g52")
        searched.clear()
        found["reused", 2, 0] = [0.5, 0.5]  # run again, the earlier search finds another mixture
        import pytest
        with pytest.raises(SystemExit, match="another mixture than its record"):
            cu.train([0], [1, 2, 3, 4])
        assert ("reused", 5) not in [(a, v) for a, v, _, _ in searched]  # refused before training on it
    finally:
        _fresh()
