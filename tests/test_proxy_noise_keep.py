"""The proxy-noise screen keeps each finished proxy, so that a stopped screen goes on where it stopped."""
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

from benchmarks import proxy_noise


def _tasks(n):
    return [SimpleNamespace(mixture_id=f"m{i}", weights=(0.25 * (i % 4), 1 - 0.25 * (i % 4)), seed=1000 + i)
            for i in range(n)]


def test_a_restarted_screen_trains_only_what_it_had_not_finished(tmp_path, monkeypatch):
    trained = []

    def fake_run(t):
        trained.append(t.mixture_id)
        return {"status": "failed" if t.mixture_id == "m3" else "ok", "objective": float(t.seed)}

    monkeypatch.setattr(proxy_noise, "_run", fake_run)
    keep, tasks = tmp_path / "kept.jsonl", _tasks(5)
    with ThreadPoolExecutor(2) as pool:
        first = proxy_noise.run_kept(pool, tasks, "base", {"lr": 0.003}, "runs/x", keep, proxy_noise.load_kept(keep))
    assert [r["objective"] for r in first] == [1000.0, 1001.0, 1002.0, 1003.0, 1004.0]
    assert sorted(trained) == ["m0", "m1", "m2", "m3", "m4"]
    with keep.open("a") as f:
        f.write('{"key": "torn')  # a stop in the middle of a line
    trained.clear()
    with ThreadPoolExecutor(2) as pool:
        again = proxy_noise.run_kept(pool, tasks, "base", {"lr": 0.003}, "runs/x", keep, proxy_noise.load_kept(keep))
    assert trained == ["m3"]  # the failed one is trained again, the finished ones are not
    assert [r["objective"] for r in again] == [r["objective"] for r in first]
    # Another variant (or the same mixture with other overrides) is another proxy.
    trained.clear()
    with ThreadPoolExecutor(2) as pool:
        proxy_noise.run_kept(pool, tasks[:2], "quiet", {"lr": 0.002}, "runs/x", keep, proxy_noise.load_kept(keep))
    assert sorted(trained) == ["m0", "m1"]
