"""Merged models: one GPT whose weights are a weighted average of several GPTs' weights.

Continue one shared base on each cluster alone and average the continuations' weights by
a mixture's weights: the merged model stands in for a model trained on that mixture
(DeMix, arXiv 2602.00747), and scoring it costs one evaluation, not a training run.
Models from one base stay in one basin, which is what makes their average a model at all.

``MergedModels`` keeps the k models' parameters as one [k, n] matrix, so a merge is one
vector-matrix product written into a single GPT that is reused for every mixture::

    from proxies.merge import MergedModels, merge_weights
    merged = MergedModels(cfg, [torch.load(f) for f in files])
    model = merged.model(w)                 # a GPT with sum_i w_i * theta_i
    sd = merge_weights(states, w)           # the same as a state dict

Tested by ``pytest tests/test_proxies_base.py``.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .model import GPT, GPTConfig


def _check(weights, k: int) -> np.ndarray:
    w = np.asarray(weights, np.float64)
    if w.shape != (k,):
        raise ValueError(f"{w.shape[0] if w.ndim == 1 else w.shape} merge weights for {k} models")
    if not np.isfinite(w).all() or (w < 0).any() or abs(w.sum() - 1.0) > 1e-6:
        raise ValueError(f"merge weights must be >= 0 and sum to 1, got {w.tolist()}")
    return w


def merge_weights(states: Sequence[dict[str, torch.Tensor]], weights) -> dict[str, torch.Tensor]:
    """sum_i weights[i] * states[i][name] for every entry (accumulated in float64)."""
    w = _check(weights, len(states))
    if not states or any(s.keys() != states[0].keys() for s in states):
        raise ValueError("merge_weights needs state dicts of one model shape")
    return {name: sum(float(wi) * s[name].double() for wi, s in zip(w, states)).to(states[0][name].dtype)
            for name in states[0]}


class MergedModels:
    """Any weighted average of k same-shaped GPTs' weights, as one reused GPT."""

    def __init__(self, cfg: GPTConfig, states: Sequence[dict[str, torch.Tensor]], device: str = "cpu") -> None:
        if not states:
            raise ValueError("MergedModels needs at least one model")
        self.gpt = GPT(cfg).to(device).eval()
        rows = []
        for s in states:
            self.gpt.load_state_dict(s)
            rows.append(torch.nn.utils.parameters_to_vector(self.gpt.parameters()).detach().double())
        self.matrix = torch.stack(rows)  # [k, n], float64, in self.gpt.parameters() order
        self.k = len(states)

    @torch.no_grad()
    def model(self, weights) -> GPT:
        """The GPT whose every parameter is sum_i weights[i] * model_i's (the same object each call)."""
        w = torch.as_tensor(_check(weights, self.k), dtype=torch.float64, device=self.matrix.device)
        torch.nn.utils.vector_to_parameters((w @ self.matrix).float(), self.gpt.parameters())
        return self.gpt
