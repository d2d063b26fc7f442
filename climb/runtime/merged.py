"""A mixture's objective read from merged models (`search.merge`; proxies/merge.py).

With the shared base continued once per cluster on that cluster alone, any mixture w has
a model without training: the one whose weights are the continuations' averaged by w.
`MergedFeature` scores that model on a fixed random sample of the target (the same
texts and task items for every mixture, so the sample's noise is common to all of
them) and gives the predictor its feature, as the experts' ensemble loss does
(climb.optimize.experts.ExpertPrior).

Each mixture costs one forward pass over the sample; the feature counts them
(`forward_tokens`) so that the compute account can charge them: a forward pass is a
third of a training step's arithmetic per token (2 against 6 multiply-adds per
parameter), so they enter the account as forward_tokens / 3 training tokens.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from climb.config import ProxyConfig, TargetConfig
from climb.runtime.device import resolve_device
from climb.runtime.targets import evaluate, expert_terms, load_target, objective, objective_logprobs

log = logging.getLogger(__name__)


def target_sample(target: dict, tok, max_tokens: int, seed: int) -> tuple[dict, int]:
    """A fixed random part of a loaded target of about `max_tokens` tokens, shared out
    evenly over its texts and tasks (at least one text or item of each), and its tokens."""
    parts = (["texts"] if target["texts"] else []) + [f"task:{n}" for n in target["tasks"]]
    if not parts:
        raise ValueError("the target is empty")
    per = max(1, max_tokens // len(parts))
    rng = np.random.default_rng(seed)
    out: dict = {"texts": [], "tasks": {}}
    total = 0
    for part in parts:
        if part == "texts":
            units = list(target["texts"])
            lengths = [len(ids) + 1 for ids in tok.encode_batch(units)]
        else:
            units = list(target["tasks"][part[5:]])
            texts = [u["query"] + " " + u["choices"][u["gold"]] if "choices" in u else u["context"] + u["continuation"]
                     for u in units]
            lengths = [len(ids) for ids in tok.encode_batch(texts)]
        picked, n = [], 0
        for i in rng.permutation(len(units)):
            if picked and n >= per:
                break
            picked.append(int(i))
            n += lengths[int(i)]
        keep = [units[i] for i in sorted(picked)]  # in the target's order: all of it is the target itself
        total += n
        if part == "texts":
            out["texts"] = keep
        else:
            out["tasks"][part[5:]] = keep
    return out, total


class MergedFeature:
    """Mixtures (rows of weights over the continued clusters) -> the merged model's objective
    on a sample of the target; each mixture is scored once and remembered."""

    def __init__(self, model_files: list[str], proxy_cfg: ProxyConfig, target_cfg: TargetConfig, tok, run_dir,
                 max_tokens: int = 4096, seed: int = 0) -> None:
        import torch

        from proxies.merge import MergedModels
        self.target_cfg, self.tok = target_cfg, tok
        self.device = resolve_device(proxy_cfg.device)
        cfg = proxy_cfg.model_config(tok.vocab_size)
        states = [torch.load(f, map_location="cpu", weights_only=True) for f in model_files]
        self.merged = MergedModels(cfg, states, device=self.device)
        self.params = self.merged.gpt.num_params()
        full = load_target(target_cfg, Path(run_dir))
        self.sample, self.sample_tokens = target_sample(full, tok, max_tokens, seed)
        try:
            expert_terms(target_cfg)
            self.by_tokens = True  # losses: only the scored tokens' log-probabilities are needed
        except Exception:
            self.by_tokens = False  # accuracies: every choice is scored
        self.cache: dict[bytes, float] = {}
        self.scored, self.forward_tokens, self.seconds = 0, 0, 0.0

    def score(self, w: np.ndarray) -> float:
        model = self.merged.model(w)
        if self.by_tokens:
            logp, coef = objective_logprobs(model, self.tok, self.target_cfg, self.sample, self.device)
            return float(-(coef * logp.astype(np.float64)).sum())
        metrics = evaluate(model, self.tok, self.target_cfg, Path("."), self.device, bf16=False, target=self.sample)
        return objective(metrics, self.target_cfg)

    def __call__(self, W) -> np.ndarray:
        W = np.atleast_2d(np.asarray(W, np.float64))
        out = np.empty(len(W))
        t0, new = time.perf_counter(), 0
        for i, w in enumerate(W):
            w = np.clip(w, 0.0, None)
            w = w / w.sum()
            key = np.round(w, 12).tobytes()
            if key not in self.cache:
                self.cache[key] = self.score(w)
                new += 1
            out[i] = self.cache[key]
        if new:
            self.scored += new
            self.forward_tokens += new * self.sample_tokens
            self.seconds += time.perf_counter() - t0
            log.info("merged models: %d mixtures scored on %d target tokens in %.1fs", new, self.sample_tokens,
                     time.perf_counter() - t0)
        return out

    def record(self, seed: int) -> dict:
        """The scoring's entry in the compute account (a forward pass: a third of a training token)."""
        return {"mixture_id": "merge-scoring", "iteration": -5, "seed": seed, "weights": [], "status": "ok",
                "tokens": self.forward_tokens // 3, "params": self.params, "seconds": round(self.seconds, 3),
                "forward_tokens": self.forward_tokens, "mixtures_scored": self.scored,
                "sample_tokens": self.sample_tokens}
