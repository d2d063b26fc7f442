"""[track]: a run's proxies and verdicts in MLflow (the real library, a local SQLite store).

A scripted search (tests/scripted_run.py) with tracking on: one parent run, one child
run per proxy record of the run folder (weights as parameters, the record's metrics,
seed / iteration / purpose as tags), the comparison verdicts on the parent. Run again,
it adds nothing; a failed proxy trained again on a resume updates its own child. A
tracker that fails (a bad store, a server that is down, not installed, an error
mid-run) warns once and leaves the run's outputs as an untracked run's. A bad [track]
is refused when the config loads, and climb does not import MLflow unless asked to.
"""
from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys

import pytest

from climb import pipeline
from climb.config import ConfigError, load_config
from climb.runtime import results, track
from climb.runtime.stage import OWN_FILES
from scripted_run import REPO, env, prepare, script

mlflow = pytest.importorskip("mlflow")

FAILS = "it0-001"  # the search proxy the scripted trainer fails on the first run


def _store(paths) -> str:
    return f"sqlite:///{paths.root / 'mlflow.db'}"


def _runs(uri: str, experiment: str = "run") -> list:
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    return client.search_runs([exp.experiment_id], max_results=1000) if exp else []


def _split(runs: list) -> tuple[list, list]:
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return parents, children


def _proxy_records(paths) -> list[tuple[str, dict]]:
    """What the run folder records, read here without climb.runtime.track."""
    recs = [("search", r) for r in results.load(paths.search.results)]
    comparison = json.loads(paths.search.comparison.read_text())
    return recs + [("comparison", r) for r in comparison.values()]


def _outputs(paths) -> dict:
    """What the search wrote, its proxy records without their wall times (manifests and state aside:
    they hold times, and keys that depend on the corpus' folder)."""
    def timeless(obj):
        if isinstance(obj, dict):
            return {k: timeless(v) for k, v in obj.items() if k != "seconds"}
        return [timeless(v) for v in obj] if isinstance(obj, list) else obj
    out = {}
    for p in sorted(paths.search.dir.rglob("*")):
        if not p.is_file() or p.name in OWN_FILES:
            continue
        if p.suffix == ".json":
            out[p.name] = timeless(json.loads(p.read_text()))
        elif p.suffix == ".jsonl":
            out[p.name] = [timeless(json.loads(x)) for x in p.read_text().splitlines()]
        else:
            out[p.name] = p.read_bytes()
    assert {"results.jsonl", "comparison.json", "mixture.json", "quality.json"} <= set(out)
    return out


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A finished search tracked to <run>/mlflow.db, logged every 0.05 s while the search runs
    (and after each stage); the trainer fails one search proxy."""
    tmp = tmp_path_factory.mktemp("tracked")
    with pytest.MonkeyPatch.context() as mp:
        cfg, paths, _, control = prepare(tmp, mp, 'track.backend="mlflow"', "track.interval_s=0.05")
        script(control, "fail", ids=[FAILS])
        pipeline.run_stage("search", cfg, paths.root)
    return cfg, paths, control


@pytest.fixture(scope="module")
def untracked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("untracked")
    with pytest.MonkeyPatch.context() as mp:
        cfg, paths, _, _ = prepare(tmp, mp)
        pipeline.run_stage("search", cfg, paths.root)
    return _outputs(paths)


def test_one_parent_and_one_child_per_proxy(tracked):
    cfg, paths, _ = tracked
    parents, children = _split(_runs(_store(paths)))
    assert len(parents) == 1
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.info.run_name == cfg.name
    assert parent.data.params["search.iterations"] == "[4, 2]"
    expected = _proxy_records(paths)
    assert len(expected) == 6 + 3 * cfg.search.eval_seeds
    assert len(children) == len(expected)
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    by_proxy = {(c.data.tags["purpose"], c.data.tags["mixture_id"], c.data.tags["seed"]): c for c in children}
    assert len(by_proxy) == len(children)
    for purpose, rec in expected:
        child = by_proxy[(purpose, rec["mixture_id"], str(rec["seed"]))]
        assert child.data.params == {f"w_{i}": repr(w) for i, w in enumerate(rec["weights"])}
        assert [float(child.data.params[f"w_{i}"]) for i in range(len(rec["weights"]))] == rec["weights"]
        want = {**rec["metrics"], "objective": rec["objective"], "tokens": rec["tokens"],
                "num_params": rec.get("params")}
        assert child.data.metrics == {k: v for k, v in want.items() if v is not None}
        assert child.data.tags["iteration"] == str(rec["iteration"])
        assert child.data.tags["status"] == rec["status"]
        assert child.info.status == ("FINISHED" if rec["status"] == "ok" else "FAILED")
    failed = by_proxy[("search", FAILS, str(cfg.search.seed))]
    assert failed.info.status == "FAILED" and "objective" not in failed.data.metrics
    assert "out of memory" in failed.data.tags["error"]
    # The comparison of the found mixture with each baseline, with its interval, on the parent.
    quality = json.loads(paths.search.quality.read_text())
    for name in cfg.search.baselines:
        c = quality["comparison"][name]
        assert parent.data.tags[f"compare/vs_{name}/verdict"] == c["verdict"]
        assert parent.data.metrics[f"compare/vs_{name}/diff"] == pytest.approx(c["diff"], abs=1e-12)
        assert [parent.data.metrics[f"compare/vs_{name}/ci95_{e}"] for e in ("low", "high")] == \
            pytest.approx(c["ci95"], abs=1e-12)
    mixture = json.loads(paths.search.mixture.read_text())["weights"]
    assert [parent.data.metrics[f"mixture/w_{i}"] for i in range(len(mixture))] == pytest.approx(mixture)


def test_a_rerun_adds_no_child_and_a_retrained_proxy_updates_its_own(tracked):
    cfg, paths, control = tracked
    before = {r.info.run_id: r for r in _runs(_store(paths))}
    book = paths.track.read_bytes()
    pipeline.run_stage("search", cfg, paths.root)  # everything skipped
    after = _runs(_store(paths))
    assert {r.info.run_id for r in after} == set(before)
    assert paths.track.read_bytes() == book
    parent = _split(after)[0][0]
    assert parent.info.status == "FINISHED"
    client = mlflow.MlflowClient(_store(paths))  # nothing logged again, not even into the same runs
    assert all(len(client.get_metric_history(r.info.run_id, "objective")) == 1 for r in after
               if "objective" in r.data.metrics and r.data.tags.get("mixture_id") != FAILS)
    assert len(client.get_metric_history(parent.info.run_id, "compare/vs_uniform/diff")) == 1
    # A search resumed (its manifest gone) trains the failed proxy again: the new record
    # lands in that proxy's child run.
    paths.manifest("search").unlink()
    script(control, "ok")
    pipeline.run_stage("search", cfg, paths.root)
    parents, children = _split(_runs(_store(paths)))
    assert [p.info.run_id for p in parents] == [parent.info.run_id]
    keys = [(c.data.tags["purpose"], c.data.tags["mixture_id"], c.data.tags["seed"]) for c in children]
    assert len(keys) == len(set(keys)) == len(_proxy_records(paths))
    old = [r for r in before.values() if r.data.tags.get("mixture_id") == FAILS][0]
    new = [c for c in children if c.data.tags["mixture_id"] == FAILS]
    assert [c.info.run_id for c in new] == [old.info.run_id]
    rec = [r for r in results.load(paths.search.results) if r["mixture_id"] == FAILS][0]
    assert rec["status"] == "ok"
    assert new[0].info.status == "FINISHED" and new[0].data.metrics["objective"] == rec["objective"]
    assert new[0].data.tags["status"] == "ok"


def test_a_learning_curve_is_metrics_over_training_steps(tracked, tmp_path):
    _, paths, _ = tracked
    client = mlflow.MlflowClient(_store(paths))
    t = track.MlflowTracker(_store(paths), "curves", tmp_path)
    t.start_run(load_config(None, ['name="curves"']), None)
    curve = {"step": [10, 20, 30], "tokens": [640, 1280, 1920], "train_loss": [4.0, 3.0, 2.5],
             "bpb": [None, 2.1, 1.5]}  # the target scored at some points only
    rec = {"mixture_id": "x", "iteration": 0, "seed": 3, "weights": [0.25, 0.75], "status": "ok",
           "metrics": {"bpb": 1.5, "train_loss": 2.4}, "objective": 1.5, "tokens": 1920, "params": 5000,
           "curve": curve}
    child = t.log_proxy(rec, "search", "k")
    history = {name: [(m.step, m.value) for m in client.get_metric_history(child, f"curve/{name}")]
               for name in ("train_loss", "bpb")}
    assert history == {"train_loss": [(10, 4.0), (20, 3.0), (30, 2.5)], "bpb": [(20, 2.1), (30, 1.5)]}
    metrics = client.get_run(child).data.metrics  # the final values stay the record's
    assert {k: metrics[k] for k in ("bpb", "train_loss", "objective", "num_params")} == \
        {"bpb": 1.5, "train_loss": 2.4, "objective": 1.5, "num_params": 5000}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fail_from_third(real, calls: list):
    def log_proxy(self, *args, **kwargs):
        calls.append("log_proxy")
        if len(calls) >= 3:
            raise RuntimeError("tracking server went away")
        return real(self, *args, **kwargs)
    return log_proxy


@pytest.mark.parametrize("failure", ["bad store", "server down", "not installed", "error mid-run"])
def test_a_failing_tracker_warns_once_and_changes_nothing(failure, untracked, tmp_path, monkeypatch, caplog):
    settings = ['track.backend="mlflow"']
    if failure == "bad store":
        (tmp_path / "a-file").write_text("")
        settings.append(f'track.uri="sqlite:///{tmp_path}/a-file/mlflow.db"')  # a folder that is a file
    if failure == "server down":
        # Two retries, at once: the HTTP client's retry warnings are not shown (the guard's line is).
        for var, value in (("MAX_RETRIES", "2"), ("BACKOFF_FACTOR", "0"), ("BACKOFF_JITTER", "0")):
            monkeypatch.setenv(f"MLFLOW_HTTP_REQUEST_{var}", value)
        settings.append(f'track.uri="http://127.0.0.1:{_free_port()}"')
    if failure == "not installed":
        monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, *settings)
    calls: list = []
    if failure == "error mid-run":
        monkeypatch.setattr(track.MlflowTracker, "log_proxy", _fail_from_third(track.MlflowTracker.log_proxy, calls))
        for name in ("log_summary", "end"):
            monkeypatch.setattr(track.MlflowTracker, name, lambda self, *a, name=name: calls.append(name))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        pipeline.run_stage("search", cfg, paths.root)
    # The search's own verdicts on its results (climb.optimize.quality.warnings) are not the tracker's.
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name != "climb.stages.search"]
    assert [r.name for r in warned] == ["climb.runtime.track"], [r.getMessage() for r in warned]
    assert "is off for the rest of this run" in warned[0].getMessage()
    if failure == "not installed":
        assert "pip install 'climb[track]'" in warned[0].getMessage()
    assert _outputs(paths) == untracked
    if failure == "error mid-run":  # the two proxies logged before stay; nothing reaches the tracker after
        assert calls == ["log_proxy"] * 3
        _, children = _split(_runs(_store(paths)))
        assert len(children) == 2
        assert len(json.loads(paths.track.read_text())["runs"][0]["proxies"]) == 2


@pytest.mark.parametrize("backend", ["wandb", "trackio"])
def test_the_thin_trackers_log_offline_where_installed(backend, tmp_path, monkeypatch, caplog):
    """W&B (offline mode) and trackio (a local store) are optional: tested where installed."""
    pytest.importorskip(backend)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # read when trackio is imported
    cfg, paths, _, _ = prepare(tmp_path, monkeypatch, f'track.backend="{backend}"')
    with caplog.at_level(logging.WARNING):
        pipeline.run_stage("search", cfg, paths.root)
    assert not [r.getMessage() for r in caplog.records if r.name == "climb.runtime.track"]
    entry = json.loads(paths.track.read_text())["runs"][-1]
    assert entry["backend"] == backend and entry["summary"]
    assert len(entry["proxies"]) == len(_proxy_records(paths))
    if backend == "trackio":  # finished and forgotten: its exit hook has nothing left to finish or print
        import trackio
        assert trackio.context_vars.current_run.get() is None


def test_bad_track_settings_are_refused():
    with pytest.raises(ConfigError, match=r"track.backend must be one of 'mlflow', 'wandb', 'trackio' or \"\" "
                                          r"\(off\), got 'tensorboard'"):
        load_config(None, ['track.backend="tensorboard"'])
    with pytest.raises(ConfigError, match="track.interval_s must be >= 0"):
        load_config(None, ['track.backend="mlflow"', "track.interval_s=-1"])
    with pytest.raises(ConfigError, match="W&B server's URL"):
        load_config(None, ['track.backend="wandb"', 'track.uri="runs/wandb"'])
    with pytest.raises(ConfigError, match="unknown config key"):
        load_config(None, ['track.server="http://x"'])
    assert load_config(None, []).track.backend == ""


def test_the_tracker_resolves_its_store(tmp_path):
    run = tmp_path / "run"
    assert track.mlflow_uri("", run) == f"sqlite:///{run}/mlflow.db"
    assert track.mlflow_uri("{run}/t.db", run) == f"sqlite:///{run}/t.db"
    assert track.mlflow_uri(str(tmp_path / "store"), run) == f"sqlite:///{tmp_path}/store/mlflow.db"
    for uri in ("sqlite:///rel.db", "http://127.0.0.1:5000", "databricks", "file:///x/mlruns"):
        assert track.mlflow_uri(uri, run) == uri


def test_climb_does_not_import_a_tracker_unless_asked():
    code = ("import sys, climb.cli, climb.pipeline\n"
            "from climb.config import load_config\n"
            "from climb.runtime import track\n"
            "with track.session(load_config(None, []), None) as t:\n"
            "    with t.during('search'):\n"
            "        pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'wandb', 'trackio')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
