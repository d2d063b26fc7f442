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
