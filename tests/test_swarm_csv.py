"""Swarm CSV IO (climb.io.swarm_csv) and the `predictor evaluate | propose` commands."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from climb import cli
from climb.cli import main as cli_main
from climb.io.swarm_csv import read_prior, read_swarm, target_values, write_swarm

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DOMAINS = ["web", "code", "books"]


def make_swarm(tmp_path: Path, n=30, seed=0, name="s"):
    rng = np.random.default_rng(seed)
    W = rng.dirichlet(np.ones(3), n)
    loss = 2 + (W[:, 0] - 0.5) ** 2 + 0.5 * (W[:, 1] - 0.3) ** 2 + 0.01 * rng.normal(size=n)
    w, m = tmp_path / f"{name}_w.csv", tmp_path / f"{name}_m.csv"
    write_swarm(w, m, [f"r{i}" for i in range(n)], DOMAINS, W, {"loss": loss, "acc": -loss}, key="index")
    return w, m, W, loss


def test_roundtrip_and_layout(tmp_path):
    w, m, W, loss = make_swarm(tmp_path)
    assert list(pd.read_csv(w).columns) == ["index"] + DOMAINS
    assert list(pd.read_csv(m).columns) == ["index", "loss", "acc"]
    s = read_swarm(w, m)
    assert s.domains == DOMAINS and s.keys[:2] == ["r0", "r1"] and len(s) == 30
    np.testing.assert_allclose(s.weights, W, atol=1e-12)
    np.testing.assert_allclose(target_values(s, "loss"), loss)
    assert s.renormalised == 0
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write left no temp file


def test_rows_follow_weights_order_and_renormalise(tmp_path):
    pd.DataFrame({"index": [3, 1, 2], "a": [0.333, 0.5, 2.0], "b": [0.666, 0.5, 2.0]}).to_csv(tmp_path / "w.csv",
                                                                                               index=False)
    pd.DataFrame({"index": [1, 2, 3], "loss": [1.0, 2.0, 3.0]}).to_csv(tmp_path / "m.csv", index=False)
    s = read_swarm(tmp_path / "w.csv", tmp_path / "m.csv")
    assert s.keys == ["3", "1", "2"]
    np.testing.assert_allclose(target_values(s, "loss"), [3.0, 1.0, 2.0])
    np.testing.assert_allclose(s.weights.sum(1), 1.0)
    assert s.renormalised == 2  # 0.999 (rounding) and 4.0 (counts); 1.0 left alone


def _write(tmp_path, name, df):
    p = tmp_path / name
    df.to_csv(p, index=False)
    return p


@pytest.mark.parametrize("case, pattern", [
    ("missing_key_weights", "no key column 'index'"),
    ("missing_key_metrics", "no key column 'index'"),
    ("dup_keys", "duplicated keys"),
    ("negative", "negative"),
    ("nan_weight", "NaN"),
    ("text_weight", "non-numeric"),
    ("zero_row", "all-zero"),
    ("nan_metric", "NaN"),
    ("missing_file", "not found"),
])
def test_bad_files_are_rejected_naming_the_file(tmp_path, case, pattern):
    w = pd.DataFrame({"index": [1, 2, 3], "a": [0.5, 0.2, 1.0], "b": [0.5, 0.8, 0.0]})
    m = pd.DataFrame({"index": [1, 2, 3], "loss": [1.0, 2.0, 3.0]})
    bad_file = "w.csv"
    if case == "missing_key_weights":
        w = w.rename(columns={"index": "id"})
    elif case == "missing_key_metrics":
        m, bad_file = m.drop(columns="index"), "m.csv"
    elif case == "dup_keys":
        m, bad_file = pd.DataFrame({"index": [1, 2, 2], "loss": [1.0, 2.0, 3.0]}), "m.csv"
    elif case == "negative":
        w.loc[1, "a"] = -0.1
    elif case == "nan_weight":
        w.loc[1, "a"] = np.nan
    elif case == "text_weight":
        w["a"] = ["0.5", "x", "1"]
    elif case == "zero_row":
        w.loc[2, "a"] = 0.0
    elif case == "nan_metric":
        m.loc[0, "loss"], bad_file = np.nan, "m.csv"
    wp, mp = _write(tmp_path, "w.csv", w), _write(tmp_path, "m.csv", m)
    if case == "missing_file":
        wp = tmp_path / "nope.csv"
        bad_file = "nope.csv"
    with pytest.raises(ValueError, match=pattern) as e:
        read_swarm(wp, mp, target="loss")
    assert bad_file in str(e.value)


def test_key_mismatch_and_missing_target(tmp_path):
    wp = _write(tmp_path, "w.csv", pd.DataFrame({"index": [1, 2, 3], "a": [1.0, 1.0, 1.0]}))
    mp = _write(tmp_path, "m.csv", pd.DataFrame({"index": [1, 2, 4, 5], "loss": [1.0, 2.0, 3.0, 4.0]}))
    with pytest.raises(ValueError, match="1 keys only in the weights file.*2 only in the metrics file"):
        read_swarm(wp, mp)
    mp = _write(tmp_path, "m.csv", pd.DataFrame({"index": [1, 2, 3], "loss": [1.0, 2.0, 3.0]}))
    s = read_swarm(wp, mp, key="index")
    with pytest.raises(ValueError, match=r"no column 'accuracy'; available: loss") as e:
        target_values(s, "accuracy")
    assert "m.csv" in str(e.value)
    with pytest.raises(ValueError, match="no key column 'run'"):
        read_swarm(wp, mp, key="run")


def test_read_prior(tmp_path):
    p = _write(tmp_path, "prior.csv", pd.DataFrame({"books": [2.0], "web": [6.0], "code": [2.0]}))
    np.testing.assert_allclose(read_prior(p, DOMAINS), [0.6, 0.2, 0.2])
    p = _write(tmp_path, "prior2.csv", pd.DataFrame({"web": [1.0, 2.0], "code": [1.0, 1.0], "books": [0, 0]}))
    with pytest.raises(ValueError, match="exactly one row"):
        read_prior(p, DOMAINS)


def test_cli_evaluate_prints_json(tmp_path, capsys):
    w, m, _, _ = make_swarm(tmp_path, 60, seed=1, name="train")
    tw, tm, _, _ = make_swarm(tmp_path, 40, seed=2, name="test")
    rc = cli_main(["predictor", "evaluate", "--train-weights", str(w), "--train-metrics", str(m),
                   "--test-weights", str(tw), "--test-metrics", str(tm), "--key", "index", "--target", "acc",
                   "--goal", "maximize", "--model", "gp"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for k in ("spearman", "pearson", "n_train", "n_test", "top1_regret", "top1_rank", "model"):
        assert k in out
    assert out["n_train"] == 60 and out["n_test"] == 40 and out["model"] == "gp"
    assert out["spearman"] > 0.8 and out["top1_regret"] >= 0 and out["top1_rank"] >= 1


def test_cli_errors_exit_2(tmp_path, capsys):
    w, m, _, _ = make_swarm(tmp_path)
    rc = cli_main(["predictor", "evaluate", "--train-weights", str(w), "--train-metrics", str(m),
                   "--test-weights", str(w), "--test-metrics", str(m), "--target", "nope", "--goal", "minimize"])
    assert rc == 2 and "no column 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("acquisition", ["default", "explore"])
def test_cli_propose_writes_a_weights_csv(tmp_path, capsys, acquisition):
    w, m, W, loss = make_swarm(tmp_path, 40, seed=3)
    prior = _write(tmp_path, "natural.csv", pd.DataFrame({"web": [0.5], "code": [0.3], "books": [0.2]}))
    out = tmp_path / "next.csv"
    rc = cli_main(["predictor", "propose", "--weights", str(w), "--metrics", str(m), "--target", "loss",
                   "--goal", "minimize", "--n", "6", "--out", str(out), "--prior", str(prior), "--pool", "3000",
                   "--model", "gp", "--seed", "1"]
                  + (["--acquisition", acquisition] if acquisition != "default" else []))
    assert rc == 0
    info = json.loads(capsys.readouterr().out)
    s = read_swarm(out, info["predicted"])
    assert s.domains == DOMAINS and len(s) == 6
    d = np.abs(s.weights[:, None] - s.weights[None]).sum(-1) + 9 * np.eye(6)
    assert d.min() >= 0.05 - 1e-9 and np.abs(s.weights[:, None] - W[None]).sum(-1).min() >= 0.05 - 1e-9
    if acquisition == "explore":  # its exploit slots: the best predicted, at least about as good as the best seen
        assert target_values(s, "predicted:loss").min() <= loss.min() + 0.02


@pytest.mark.skipif(not (SHARED / "swarms" / "regmix").is_dir(), reason="../shared/data not present")
def test_reads_regmix():
    d = SHARED / "swarms" / "regmix"
    s = read_swarm(d / "train_mixture_1m.csv", d / "train_pile_loss_1m.csv", target="metric/the_pile_pile_cc_val_loss")
    assert len(s) == 512 and len(s.domains) == 17 and s.renormalised == 303
    np.testing.assert_allclose(s.weights.sum(1), 1.0)
    t = read_swarm(d / "test_mixture_1B.csv", d / "test_pile_loss_1B.csv")
    assert len(t) == 64 and t.keys[0] == "0"


def test_nan_in_other_metric_columns_is_fine(tmp_path):
    w, _, W, loss = make_swarm(tmp_path, 5)
    m = _write(tmp_path, "m2.csv", pd.DataFrame({"index": [f"r{i}" for i in range(5)], "loss": loss,
                                                 "piqa": [np.nan, 0.5, 0.5, np.nan, 0.6]}))
    s = read_swarm(w, m, target="loss")
    np.testing.assert_allclose(target_values(s, "loss"), loss)
    with pytest.raises(ValueError, match="'piqa' has 2 NaN"):
        target_values(s, "piqa")


def test_main_cli_has_the_predictor_group(tmp_path, capsys):
    w, m, _, _ = make_swarm(tmp_path, 40, seed=4)
    rc = cli.main(["predictor", "evaluate", "--train-weights", str(w), "--train-metrics", str(m),
                   "--test-weights", str(w), "--test-metrics", str(m), "--target", "loss", "--goal", "minimize",
                   "--model", "linear"])
    assert rc == 0 and json.loads(capsys.readouterr().out)["n_test"] == 40


def _evaluate(w, m, tw, tm, *extra):
    return cli_main(["predictor", "evaluate", "--train-weights", str(w), "--train-metrics", str(m),
                     "--test-weights", str(tw), "--test-metrics", str(tm), "--target", "loss", "--goal", "minimize",
                     *extra])


def test_cli_one_training_row_is_a_clear_error(tmp_path, capsys):
    w, m, _, _ = make_swarm(tmp_path, 1, name="one")
    tw, tm, _, _ = make_swarm(tmp_path, 10, name="test")
    for model in ("lightgbm", "default"):
        assert _evaluate(w, m, tw, tm, "--model", model) == 2
        err = capsys.readouterr().err
        assert "one_w.csv: 1 row(s); a predictor needs at least 2" in err and "Traceback" not in err


def test_cli_constant_prediction_is_said_and_has_no_regret(tmp_path, capsys, caplog):
    w, m, _, _ = make_swarm(tmp_path, 3, name="tiny")  # 3 rows: no split can leave 2 rows on each side
    tw, tm, _, _ = make_swarm(tmp_path, 10, name="test")
    assert _evaluate(w, m, tw, tm, "--model", "lightgbm") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["constant_prediction"] is True
    assert out["spearman"] is None and out["top1_regret"] is None and out["top1_rank"] is None
    assert "predicts one value" in caplog.text and "no top-1 regret" in caplog.text


def test_cli_linear_on_a_constant_target(tmp_path, capsys, caplog, recwarn):
    w, _, W, _ = make_swarm(tmp_path, 20)
    m = _write(tmp_path, "const.csv", pd.DataFrame({"index": [f"r{i}" for i in range(20)], "loss": 2.5}))
    tw, tm, _, _ = make_swarm(tmp_path, 10, name="test")
    assert _evaluate(w, m, tw, tm, "--model", "linear") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["spearman"] is None and out["pearson"] is None and out["top1_regret"] is None
    assert "is the same (2.5) in all 20 rows" in caplog.text
    assert not [x for x in recwarn if "constant" in str(x.message).lower()]  # no raw scipy warning


def test_cli_is_quiet_without_verbose(tmp_path):
    import subprocess
    import sys
    w, m, W, loss = make_swarm(tmp_path, 30)
    pd.DataFrame({"index": [f"r{i}" for i in range(30)], **{d: W[:, j].round(2) for j, d in enumerate(DOMAINS)}}
                 ).to_csv(tmp_path / "rounded.csv", index=False)  # rows off 1 by rounding: an INFO line
    cmd = [sys.executable, "-m", "climb.cli", "predictor", "evaluate", "--train-weights", str(tmp_path / "rounded.csv"),
           "--train-metrics", str(m), "--test-weights", str(w), "--test-metrics", str(m), "--target", "loss",
           "--goal", "minimize", "--model", "default"]
    quiet = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "INFO" not in quiet.stderr and json.loads(quiet.stdout)["n_train"] == 30
    loud = subprocess.run(cmd + ["-v"], capture_output=True, text=True, check=True)
    assert "renormalised" in loud.stderr and "blend weight" in loud.stderr


def test_text_in_a_weight_cell_names_row_and_value(tmp_path):
    wp = _write(tmp_path, "w.csv", pd.DataFrame({"index": ["a", "b", "c"], "web": ["0.5", "0,2", "1"],
                                                 "code": [0.5, 0.8, 0.0]}))
    mp = _write(tmp_path, "m.csv", pd.DataFrame({"index": ["a", "b", "c"], "loss": [1.0, 2.0, 3.0]}))
    with pytest.raises(ValueError, match=r"w\.csv: non-numeric weight columns \['web'\] \(1 cells .*index b, "
                                         r"column web: '0,2'"):
        read_swarm(wp, mp)


def test_infinite_target_is_called_infinite(tmp_path):
    w, _, _, loss = make_swarm(tmp_path, 4)
    mp = _write(tmp_path, "m.csv", pd.DataFrame({"index": ["r0", "r1", "r2", "r3"], "loss": [1.0, np.inf, 2.0, 3.0]}))
    with pytest.raises(ValueError, match=r"'loss' has 1 infinite values \(keys r1"):
        read_swarm(w, mp, target="loss")


def test_domain_unused_in_training_is_warned(tmp_path, capsys, caplog):
    w, m, W, loss = make_swarm(tmp_path, 40)
    W0 = W.copy()
    W0[:, 2] = 0.0  # "books" never trained on ...
    W0 /= W0.sum(1, keepdims=True)
    wp = _write(tmp_path, "w0.csv", pd.DataFrame({"index": [f"r{i}" for i in range(40)],
                                                  **{d: W0[:, j] for j, d in enumerate(DOMAINS)}}))
    tw, tm, _, _ = make_swarm(tmp_path, 10, name="test")  # ... but used by every test row
    assert _evaluate(wp, m, tw, tm, "--model", "gp") == 0
    assert "domain 'books' is 0 in every training row but not in 10 test rows" in caplog.text
    caplog.clear()
    assert _evaluate(w, m, tw, tm, "--model", "gp") == 0
    assert "is 0 in every training row" not in caplog.text


def test_cli_propose_from_candidates(tmp_path, capsys):
    w, m, W, loss = make_swarm(tmp_path, 30, seed=5)
    rng = np.random.default_rng(6)
    C = np.vstack([W[:10], rng.dirichlet(np.ones(3), 40)])  # 10 already measured + 40 new
    keys = [f"cand{i}" for i in range(len(C))]
    cand = _write(tmp_path, "cand.csv", pd.DataFrame({"index": keys, "books": C[:, 2], "web": C[:, 0],
                                                      "code": C[:, 1]}))  # other column order: matched by name
    out = tmp_path / "next.csv"
    for acq in ("thompson", "explore"):
        rc = cli_main(["predictor", "propose", "--weights", str(w), "--metrics", str(m), "--target", "loss",
                       "--goal", "minimize", "--n", "5", "--out", str(out), "--candidates", str(cand),
                       "--model", "gp", "--acquisition", acq])
        assert rc == 0
        info = json.loads(capsys.readouterr().out)
        s = read_swarm(out, info["predicted"])
        assert info["pool"] == 40 and len(s) == 5 and len(set(s.keys)) == 5
        for k, row in zip(s.keys, s.weights):
            i = keys.index(k)
            assert i >= 10  # never one already measured
            np.testing.assert_allclose(row, C[i], atol=1e-9)  # the candidate itself, under its own key
    bad = _write(tmp_path, "bad.csv", pd.DataFrame({"index": ["x"], "web": [0.5], "music": [0.5]}))
    rc = cli_main(["predictor", "propose", "--weights", str(w), "--metrics", str(m), "--target", "loss",
                   "--goal", "minimize", "--n", "1", "--out", str(out), "--candidates", str(bad)])
    assert rc == 2 and "domains differ" in capsys.readouterr().err
