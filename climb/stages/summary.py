"""What a finished search found and how far to trust it, as one dict: the report's
`summary.json` and the exported dataset's card are both made from it."""
from __future__ import annotations

from climb.config import RunConfig
from climb.io.files import read_json
from climb.runtime.stage import RunPaths


def search_summary(cfg: RunConfig, paths: RunPaths, n_results: int, n_clusters: int) -> dict:
    """Target, the comparison's means and verdicts, the run's noise figures and the proxies trained."""
    sstats = paths.stats("search")
    comp = sstats["comparison"]
    qfile = paths.search.quality
    quality = read_json(qfile) if qfile.exists() else {}
    return {"target": {"name": "+".join(cfg.target.objective), "goal": cfg.target.goal},
            "results": {k: float(v) for k, v in comp.items() if v is not None},
            "comparison": sstats.get("verdicts", {}),
            "quality": {k: quality.get(k) for k in ("seed_sd", "paired_sd", "swarm_sd", "snr",
                                                    "predictor_oof_spearman", "warnings")},
            "proxies_trained": sstats.get("proxies", n_results) + sstats.get("replicate_proxies", 0)
            + sstats.get("comparison_proxies", len(comp) * cfg.search.eval_seeds)
            + sstats.get("one_shot_proxies", 0),
            "clusters": n_clusters}
