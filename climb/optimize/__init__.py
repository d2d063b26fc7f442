"""The search's mathematics, as plain functions over arrays (no files, no proxies):

- `candidates`: Dirichlet sampling of mixtures around a prior, epoch caps, dedup;
- `predictor`: regressors of proxy score on mixture weights (LightGBM, linear, GP, blends);
- `gp`, `acquisition`: the GP posterior and batch acquisition (EI, Thompson, UCB);
- `strategy`: what to measure next and which mixture to pick; `simulate` runs a
  whole search over a finite pool whose every result is known;
- `quality`: seed noise, signal, out-of-fold Spearman and paired comparisons.
"""
