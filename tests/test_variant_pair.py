"""benchmarks/variant_pair.py: two variants' found mixtures, paired by search seed."""
from __future__ import annotations

import json

import pytest

from benchmarks.variant_pair import compare


def _run(root, name, search_seed, scores, eval_seeds=(10007, 10008, 10009)):
    """A finished run as the script reads it: its config and the search manifest's comparison table."""
    run = root / name
    (run / "search").mkdir(parents=True)
    (run / "config.toml").write_text(f'[search]\nseed = {search_seed}\neval_seed = {eval_seeds[0]}\n'
                                     f'eval_seeds = {len(eval_seeds)}\n[target]\ngoal = "minimize"\n')
    table = {"climb": sum(scores) / len(scores), "uniform": 9.0}  # other mixtures are not read
    (run / "search" / "manifest.json").write_text(json.dumps({"stats": {"comparison": table}}))
    return run


def test_pairs_by_search_seed_and_tests_non_inferiority(tmp_path):
    a = [_run(tmp_path, f"a{s}", s, [2.0 + 0.01 * s] * 3) for s in range(4)]
    b = [_run(tmp_path, f"b{s}", s, [2.0 + 0.01 * s + d] * 3) for s, d in enumerate([0.02, 0.03, 0.01, 0.02])]
    out = compare(a, b, margin=0.01)
    assert out["diff_by_seed"] == pytest.approx([-0.02, -0.03, -0.01, -0.02])
    assert out["comparison"]["verdict"] == "better" and out["a_no_worse_than_b"]
    # The other way round B is worse by 0.02 on average: not within a margin of 0.01.
    back = compare(b, a, margin=0.01)
    assert back["comparison"]["verdict"] == "worse" and not back["a_no_worse_than_b"]
    assert compare(b, a, margin=0.05)["a_no_worse_than_b"]
    assert out["compute_fraction"] is None  # these runs hold no proxy records


def test_compute_fraction_is_the_searches_proxy_compute_a_over_b(tmp_path):
    def records(run, n, params):
        lines = [json.dumps({"mixture_id": f"it0-{i:03d}", "iteration": 0, "seed": 0, "weights": [1.0],
                             "status": "ok", "objective": 2.0, "tokens": 1000, "params": params, "seconds": 1.0})
                 for i in range(n)]
        (run / "search" / "results.jsonl").write_text("\n".join(lines) + "\n")
        comp = {f"climb/{s}": {"status": "ok", "objective": 2.0, "tokens": 1000, "params": params}
                for s in (1, 2, 3)}  # the comparison is not the search's compute
        (run / "search" / "comparison.json").write_text(json.dumps(comp))
    a = [_run(tmp_path, f"a{s}", s, [2.0] * 3) for s in range(2)]
    b = [_run(tmp_path, f"b{s}", s, [2.0] * 3) for s in range(2)]
    for r in a:
        records(r, 14, 500)
    for r in b:
        records(r, 28, 500)
    assert compare(a, b, margin=0.01)["compute_fraction"] == pytest.approx(0.5)


def test_refuses_runs_that_are_not_pairs(tmp_path):
    a = [_run(tmp_path, "a0", 0, [2.0] * 3), _run(tmp_path, "a1", 1, [2.0] * 3)]
    b = [_run(tmp_path, "b0", 0, [2.0] * 3), _run(tmp_path, "b2", 2, [2.0] * 3)]
    with pytest.raises(SystemExit, match="not a pair"):
        compare(a, b, margin=0.01)
    with pytest.raises(SystemExit, match="one pair per search seed"):
        compare(a, b[:1], margin=0.01)
    c = [_run(tmp_path, "c0", 0, [2.0] * 2, eval_seeds=(1, 2)), _run(tmp_path, "c1", 1, [2.0] * 3)]
    with pytest.raises(SystemExit, match="comparison seeds"):
        compare(a, c, margin=0.01)


def _with_comparison(run, climb, baselines=None, natural=(0.5, 0.5)):
    """Give a run its comparison proxies (climb's and, optionally, the baselines') and mixtures."""
    seeds = (10007, 10008, 10009)
    comp = {f"climb/{s}": {"mixture_id": f"final-climb-{s}", "objective": v} for s, v in zip(seeds, climb)}
    for name, vals in (baselines or {}).items():
        comp.update({f"{name}/{s}": {"mixture_id": f"final-{name}-{s}", "objective": v} for s, v in zip(seeds, vals)})
    (run / "search" / "comparison.json").write_text(json.dumps(comp))
    (run / "search" / "mixture.json").write_text(json.dumps({"natural": list(natural), "uniform": [0.5, 0.5]}))


def test_a_run_without_baselines_is_judged_against_its_pairs_own(tmp_path):
    a = [_run(tmp_path, f"a{s}", s, [2.0] * 3) for s in range(2)]
    b = [_run(tmp_path, f"b{s}", s, [2.0] * 3) for s in range(2)]
    base = {"uniform": [2.5, 2.52, 2.49], "natural": [2.0, 2.02, 2.01]}
    for r in a:
        _with_comparison(r, [2.0, 2.01, 2.0])
    for r in b:
        _with_comparison(r, [2.1, 2.1, 2.1], base)
    out = compare(a, b, margin=0.01, baselines_from_b=True)
    v = out["a"][0]["baselines"]
    assert v["uniform"]["verdict"] == "better" and v["uniform"]["diff"] == pytest.approx(-0.5, abs=1e-9)
    assert v["natural"]["verdict"] == "not resolved"
    assert out["b"][0]["baselines"]["uniform"]["diff"] == pytest.approx(2.1 - sum(base["uniform"]) / 3)  # B against its own
    # Without the flag A has no baselines of its own to be judged against.
    assert compare(a, b, margin=0.01)["a"][0]["baselines"] == {}
    # Another clustering has other uniform / natural mixtures: B's proxies do not stand for A's.
    _with_comparison(a[1], [2.0, 2.01, 2.0], natural=(0.4, 0.6))
    with pytest.raises(SystemExit, match="different natural mixtures"):
        compare(a, b, margin=0.01, baselines_from_b=True)


def test_cheaper_search_bench_runs_share_one_base_copied_with_its_mtimes(tmp_path, monkeypatch):
    """--preset bench: embed, cluster and tokenize once in the base folder; every run is a copy
    of it (modification times kept, so its manifests hold) on which only the search runs."""
    import os
    from benchmarks import cheaper_search as cs
    calls = []

    def fake_climb(args, log_path):
        calls.append(args)
        run = args[args.index("--run") + 1]
        stage = "tokenize" if args[0] == "tokenize" else "search"
        (tmp_path / run / stage).mkdir(parents=True, exist_ok=True)
        (tmp_path / run / stage / "manifest.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cs, "_climb", fake_climb)
    preset = cs.PRESETS["bench"]
    cs.train(tmp_path / "runs" / "d10", 10, preset["default_sets"], baselines=True, preset=preset)
    base_manifest = tmp_path / preset["base"] / "tokenize" / "manifest.json"
    os.utime(base_manifest, ns=(1, 123456789))
    cs.train(tmp_path / "runs" / "e10", 10, cs.ARMS["E"], baselines=False, preset=preset)
    cs.train(tmp_path / "runs" / "e10", 10, cs.ARMS["E"], baselines=False, preset=preset)  # finished: nothing runs
    assert [c[0] for c in calls] == ["tokenize", "search", "search"]
    assert (tmp_path / "runs" / "e10" / "tokenize" / "manifest.json").stat().st_mtime_ns == 123456789
    d, e = calls[1], calls[2]
    assert "search.seed=10" in d and 'search.baselines=["uniform","natural"]' in d and "corpus.max_shards=2" in d
    assert "search.seed=10" in e and "search.experts=0.25" in e and "search.baselines=[]" in e
    assert d[d.index("--config") + 1] == "pipelines/bench.toml"


def test_a_run_is_judged_the_same_from_its_record_and_a_record_of_another_base_is_refused(tmp_path):
    from benchmarks.variant_pair import record
    a = [_run(tmp_path, f"a{s}", s, [2.0] * 3) for s in range(2)]
    b = [_run(tmp_path, f"b{s}", s, [2.0 + 0.01 * s] * 3) for s in range(2)]
    base = {"uniform": [2.5, 2.52, 2.49], "natural": [2.0, 2.02, 2.01]}
    for r in a + b:
        _with_comparison(r, [2.0, 2.01, 2.0], base if r in b else None)
        for f, data in (("cluster/centroids.npy", b"c"), ("cluster/cluster_centroids.npy", b"k"),
                        ("tokenize/tokenizer.json", b"{}")):
            (r / f).parent.mkdir(exist_ok=True)
            (r / f).write_bytes(data)
    from_folders = compare(a, b, margin=0.01, baselines_run=b[0])
    recs = [json.loads(json.dumps(record(r))) for r in a + b]  # as kept on disk
    from_records = compare(recs[:2], recs[2:], margin=0.01, baselines_run=recs[2])
    assert from_records == from_folders
    assert from_records["a"][1]["baselines"]["uniform"]["verdict"] == "better"
    assert recs[0]["base"] == recs[2]["base"] is not None
    # The baselines were trained on another base (another machine's embedding digits): not this run's.
    (b[0] / "cluster" / "centroids.npy").write_bytes(b"other")
    with pytest.raises(SystemExit, match="different bases"):
        compare(a, b, margin=0.01, baselines_run=b[0])
    # Given the holders of both bases, each run is judged against its own base's.
    b1 = compare(a, b, margin=0.01, baselines_run=[b[0], b[1]])
    assert b1["a"][0]["baselines"]["uniform"]["verdict"] == "better"


def test_cheaper_search_goes_on_from_its_records_when_the_run_folders_are_gone(tmp_path, monkeypatch):
    """A later session (the runs/ folder gone) trains only the seeds not recorded, and trains the
    shared baselines again only where its base came out otherwise."""
    import shutil
    from benchmarks import cheaper_search as cs
    calls, base_bytes = [], {"v": b"c"}

    def fake_climb(args, log_path):
        run = tmp_path / args[args.index("--run") + 1]
        calls.append((args[0], run.name, "search.baselines=[]" not in args))
        if args[0] == "tokenize":
            for f, data in (("cluster/centroids.npy", base_bytes["v"]), ("cluster/cluster_centroids.npy", b"k"),
                            ("tokenize/tokenizer.json", b"{}"), ("tokenize/manifest.json", b"{}")):
                (run / f).parent.mkdir(parents=True, exist_ok=True)
                (run / f).write_bytes(data)
            return
        seed = int(next(a for a in args if a.startswith("search.seed=")).split("=")[1])
        (run / "config.toml").write_text(f'[search]\nseed = {seed}\neval_seed = 10007\neval_seeds = 3\n'
                                         '[target]\ngoal = "minimize"\n')
        score = 2.0 + 0.001 * seed + (0.0 if "search.base=0.55" in args else 0.002)
        (run / "search").mkdir(exist_ok=True)
        (run / "search" / "manifest.json").write_text(json.dumps({"stats": {"comparison": {"climb": score}}}))
        base = {"uniform": [2.5, 2.52, 2.49], "natural": [2.3, 2.32, 2.31]} if calls[-1][2] else None
        _with_comparison(run, [score] * 3, base)
        n = 14 if "search.base=0.55" in args else 32
        (run / "search" / "results.jsonl").write_text("".join(json.dumps(
            {"mixture_id": f"it0-{i:03d}", "iteration": 0, "seed": 0, "weights": [0.5, 0.5], "status": "ok",
             "objective": score, "tokens": 1000, "params": 10, "seconds": 1.0}) + "\n" for i in range(n)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cs, "_climb", fake_climb)
    argv = ["--preset", "bench", "--runs", "runs/g", "--arms", "B", "--share-baselines", "--order", "seeds",
            "--train", "--records", "rec", "--json", "out.json"]
    cs.main(argv + ["--seeds", "20", "21"])
    assert [(c[0], c[1]) for c in calls] == [("tokenize", "cbench_base"), ("search", "g_default_s20"),
                                             ("search", "g_B_s20"), ("search", "g_default_s21"), ("search", "g_B_s21")]
    assert [c[2] for c in calls[1:]] == [True, False, False, False]  # one run trains the baselines
    first = json.loads((tmp_path / "out_B.json").read_text())
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == [
        "g_B_s20.json", "g_B_s21.json", "g_default_s20.json", "g_default_s21.json"]
    # A new session: no run folders; the same base comes out; one more seed.
    shutil.rmtree(tmp_path / "runs")
    calls.clear()
    cs.main(argv + ["--seeds", "20", "21", "22"])
    assert [(c[1], c[2]) for c in calls] == [("cbench_base", True), ("g_default_s22", False), ("g_B_s22", False)]
    again = json.loads((tmp_path / "out_B.json").read_text())
    assert again["seeds"] == [20, 21, 22] and again["bpb"][:2] == first["bpb"]
    assert again["criteria"]["b_beats_baselines"] and again["compute_fraction"] == pytest.approx(14 / 32)
    # Another session whose base differs: its first default run trains the baselines again.
    shutil.rmtree(tmp_path / "runs")
    calls.clear()
    base_bytes["v"] = b"other digits"
    cs.main(argv + ["--seeds", "20", "21", "22", "23"])
    assert [(c[1], c[2]) for c in calls] == [("cbench_base", True), ("g_default_s23", True), ("g_B_s23", False)]
    last = json.loads((tmp_path / "out_B.json").read_text())
    assert last["seeds"] == [20, 21, 22, 23] and last["baselines_runs"] == ["runs/g_default_s20", "runs/g_default_s23"]
    # Judging alone, from the records only.
    shutil.rmtree(tmp_path / "runs")
    cs.main([a for a in argv if a != "--train"] + ["--seeds", "20", "21", "22", "23"])
    assert json.loads((tmp_path / "out_B.json").read_text()) == last
    # The bench's criterion (d) is judged at its own margin, 0.0075, unless told otherwise.
    assert last["margin"] == 0.0075
    cs.main([a for a in argv if a != "--train"] + ["--seeds", "20", "21", "22", "23", "--margin", "0.01"])
    assert json.loads((tmp_path / "out_B.json").read_text())["margin"] == 0.01
    with pytest.raises(SystemExit, match="neither finished nor recorded"):
        cs.main([a for a in argv if a != "--train"] + ["--seeds", "20", "24"])
