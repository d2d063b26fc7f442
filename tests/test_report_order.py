"""The report's search figure does not depend on the order of the results log.

Parallel proxies finish in any order and a search resumed after a kill appends its
records in another, so the same records reach the report in different orders; each
point's jitter was drawn by its place in the list, and the figure (and the page that
embeds it) differed between an undisturbed and a resumed run. Found by
benchmarks/scale_kill.py at 10^7 documents.

    pytest tests/test_report_order.py
"""
from __future__ import annotations

import numpy as np

from climb.stages.report import plot_search


def _records() -> list[dict]:
    rng = np.random.default_rng(3)
    out = []
    for it in range(3):
        for j in range(6):
            out.append({"mixture_id": f"it{it}-{j:03d}", "iteration": it, "seed": 0, "status": "ok",
                        "objective": float(2.0 - 0.01 * it + rng.normal(0, 0.02))})
    return out


def test_the_search_figure_is_the_same_bytes_whatever_the_records_order(tmp_path):
    records = _records()
    plans = {r["mixture_id"]: r["objective"] + 0.01 for r in records if r["iteration"] > 0}
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    plot_search(records, plans, "minimize", "loss", a)
    shuffled = [records[i] for i in np.random.default_rng(0).permutation(len(records))]
    assert shuffled != records
    plot_search(shuffled, plans, "minimize", "loss", b)
    for name in ("score_by_iteration.png", "predicted_vs_measured.png"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
