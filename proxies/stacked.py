"""Train a swarm of proxies at once as one batched model.

``StackedGPT`` holds P independent GPTs of the same shape with every weight
stacked along a leading proxy axis; each linear layer is one batched matmul
(``torch.baddbmm``) over the P proxies, attention runs on P*B sequences, and
the loss is the sum of the P per-proxy mean losses, so each proxy's gradient
is exactly the gradient of its own loss. AdamW is elementwise, so one optimizer
over the stacked tensors keeps an independent state per proxy; gradient
clipping is done per proxy. Each proxy draws its own batches from its own
``MixtureSampler``.

Given the same seeds, ``train_stacked`` starts from the same weights as
``proxies.train.train`` (each GPT is built under ``torch.manual_seed(seed)``),
sees the same batches and applies the same updates; only the floating-point
summation order of the batched kernels differs, so losses agree to rounding.

Usage::

    from proxies.stacked import train_stacked
    results = train_stacked(GPTConfig(vocab_size=tok.vocab_size), TrainConfig(steps=200),
                            [sampler_a, sampler_b], seeds=[0, 0], device="cuda")
    for model, stats in results: ...       # plain GPT models, as train() returns

Tested by ``pytest tests/test_proxies_stacked.py``.
"""
from __future__ import annotations

import logging
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from .model import GPT, GPTConfig
from .sampler import MixtureSampler
from .train import (TailAverage, TrainConfig, average_from, end_step, log_due, make_optimizer, param_groups, prepare,
                    run_stats, seeded, start_step)

logger = logging.getLogger(__name__)

# Linear layers of a block, as (name in the stacked block, path in a GPT Block).
_LINEARS = (("attn", "attn.c_attn"), ("proj", "attn.c_proj"), ("fc", "mlp.c_fc"), ("out", "mlp.c_proj"))
_NORMS = (("ln1", "ln_1"), ("ln2", "ln_2"))


def _get(module: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        module = getattr(module, part)
    return module


class _StackedBlock(nn.Module):
    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        for name, path in _LINEARS:
            # nn.Linear stores [out, in]; a batched matmul wants [P, in, out].
            w = torch.stack([_get(b, path).weight.detach().t() for b in blocks])
            bias = torch.stack([_get(b, path).bias.detach() for b in blocks])
            setattr(self, f"{name}_w", nn.Parameter(w.contiguous()))
            setattr(self, f"{name}_b", nn.Parameter(bias.clone()))
        for name, path in _NORMS:
            setattr(self, f"{name}_w", nn.Parameter(torch.stack([_get(b, path).weight.detach() for b in blocks])))
            setattr(self, f"{name}_b", nn.Parameter(torch.stack([_get(b, path).bias.detach() for b in blocks])))


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # x [P, N, C], w and b [P, C]; nn.LayerNorm's eps.
    return torch.addcmul(b.unsqueeze(1), F.layer_norm(x, x.shape[-1:], eps=1e-5), w.unsqueeze(1))


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.baddbmm(b.unsqueeze(1), x, w)


class StackedGPT(nn.Module):
    """P same-shaped GPTs as one module: ``forward(idx [P,B,T], targets [P,B,T]) -> losses [P]``."""

    def __init__(self, models: list[GPT]) -> None:
        super().__init__()
        if not models:
            raise ValueError("StackedGPT needs at least one model")
        cfg = models[0].config
        if any(m.config != cfg for m in models):
            raise ValueError("StackedGPT: every model must have the same GPTConfig")
        if cfg.dropout > 0:
            raise ValueError("StackedGPT does not implement dropout; proxies train with dropout=0")
        self.config = cfg
        self.n_proxies = len(models)
        self.wte = nn.Parameter(torch.stack([m.wte.weight.detach() for m in models]))  # [P, V, C], tied head
        self.wpe = nn.Parameter(torch.stack([m.wpe.weight.detach() for m in models]))  # [P, S, C]
        self.blocks = nn.ModuleList(_StackedBlock([m.blocks[i] for m in models]) for i in range(cfg.n_layer))
        self.lnf_w = nn.Parameter(torch.stack([m.ln_f.weight.detach() for m in models]))
        self.lnf_b = nn.Parameter(torch.stack([m.ln_f.bias.detach() for m in models]))
        # An untied LM head is stacked like the rest; a tied one is wte itself.
        self.head = None if cfg.tie_embeddings else nn.Parameter(
            torch.stack([m.lm_head.weight.detach() for m in models]))  # [P, V, C]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        P, B, T = idx.shape
        cfg = self.config
        C, H, V = cfg.n_embd, cfg.n_head, cfg.vocab_size
        if P != self.n_proxies or T > cfg.seq_len:
            raise ValueError(f"input {tuple(idx.shape)} does not fit {self.n_proxies} proxies of seq_len {cfg.seq_len}")
        # Proxy p's token t is row p*V + t of the flattened embedding tables.
        offsets = (torch.arange(P, device=idx.device) * V).view(P, 1, 1)
        x = F.embedding(idx + offsets, self.wte.view(P * V, C)) + self.wpe[:, :T].unsqueeze(1)
        x = x.reshape(P, B * T, C)
        for blk in self.blocks:
            h = _layer_norm(x, blk.ln1_w, blk.ln1_b)
            q, k, v = (
                t.reshape(P * B, T, H, C // H).transpose(1, 2)
                for t in _linear(h, blk.attn_w, blk.attn_b).split(C, dim=-1)
            )
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            y = y.transpose(1, 2).reshape(P, B * T, C)
            x = x + _linear(y, blk.proj_w, blk.proj_b)
            h = _layer_norm(x, blk.ln2_w, blk.ln2_b)
            x = x + _linear(F.gelu(_linear(h, blk.fc_w, blk.fc_b)), blk.out_w, blk.out_b)
        head = self.wte if self.head is None else self.head
        logits = torch.bmm(_layer_norm(x, self.lnf_w, self.lnf_b), head.transpose(1, 2))  # [P, B*T, V]
        tgt = targets.reshape(P, B * T)
        nll = F.cross_entropy(logits.float().view(-1, V), tgt.reshape(-1), ignore_index=-1, reduction="none")
        return nll.view(P, -1).sum(1) / (tgt >= 0).sum(1).clamp_min(1)

    @torch.no_grad()
    def unstack(self) -> list[GPT]:
        """The P proxies as plain GPT modules (on the stacked model's device, eval mode)."""
        out = []
        for p in range(self.n_proxies):
            m = GPT(self.config).to(self.wte.device)
            m.wte.weight.copy_(self.wte[p])
            m.wpe.weight.copy_(self.wpe[p])
            for blk, sblk in zip(m.blocks, self.blocks):
                for name, path in _LINEARS:
                    _get(blk, path).weight.copy_(getattr(sblk, f"{name}_w")[p].t())
                    _get(blk, path).bias.copy_(getattr(sblk, f"{name}_b")[p])
                for name, path in _NORMS:
                    _get(blk, path).weight.copy_(getattr(sblk, f"{name}_w")[p])
                    _get(blk, path).bias.copy_(getattr(sblk, f"{name}_b")[p])
            m.ln_f.weight.copy_(self.lnf_w[p])
            m.ln_f.bias.copy_(self.lnf_b[p])
            if self.head is not None:
                m.lm_head.weight.copy_(self.head[p])
            out.append(m.eval())
        return out


def _clip_per_proxy(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """clip_grad_norm_ applied to each proxy's slice of the stacked gradients; returns the P norms."""
    grads = [p.grad for p in params if p.grad is not None]
    sq = torch.stack([g.float().pow(2).flatten(1).sum(1) for g in grads]).sum(0)
    norms = sq.sqrt()
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))).to(g.dtype))
    return norms


def train_stacked(
    model_cfg: GPTConfig,
    train_cfg: TrainConfig,
    samplers: list[MixtureSampler],
    seeds: list[int],
    device: str | torch.device = "cpu",
    deadline: float | None = None,
) -> list[tuple[GPT, dict]]:
    """Train len(samplers) fresh proxies together; one (model, stats) per proxy, as ``train`` returns.

    The proxies share the step schedule and the wall time, so each one's
    ``tokens_per_s`` is the swarm's throughput divided by the number of proxies.
    """
    if len(samplers) != len(seeds) or not samplers:
        raise ValueError(f"train_stacked needs one seed per sampler; got {len(samplers)} samplers, {len(seeds)} seeds")
    device, accum, amp, tokens_per_step = prepare(model_cfg, train_cfg, samplers, device)
    P = len(samplers)

    models = []
    for seed in seeds:  # exactly as train() builds its model, so the inits match
        with seeded(seed, device):
            models.append(GPT(model_cfg))
    model = StackedGPT(models).to(device)
    del models
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    # Matrices (stacked: 3-d) decay, biases and norm gains (stacked: 2-d) do not, as in train().
    optimizer = make_optimizer(param_groups(params, train_cfg.weight_decay, matrix_dim=3), train_cfg, device)
    losses = torch.zeros(train_cfg.steps, P, device=device)
    tail_avg, avg_from = TailAverage(), average_from(train_cfg)  # elementwise, so per proxy as in train()
    t0 = time.perf_counter()
    for step in range(train_cfg.steps):
        start_step(optimizer, step, train_cfg, deadline)
        step_loss = torch.zeros(P, device=device)
        for _ in range(accum):
            xs, ys = zip(*(s.next_batch() for s in samplers))
            x = torch.stack(xs).to(device, non_blocking=True)
            y = torch.stack(ys).to(device, non_blocking=True)
            with amp:
                per_proxy = model(x, y)
            (per_proxy.sum() / accum).backward()
            step_loss += per_proxy.detach() / accum
        if train_cfg.grad_clip > 0:
            _clip_per_proxy(params, train_cfg.grad_clip)
        end_step(optimizer, model, step, tail_avg, avg_from)
        losses[step] = step_loss
        if log_due(step, train_cfg):
            cur = losses[step]
            logger.info("step %d/%d, %d proxies: loss %.4f..%.4f", step + 1, train_cfg.steps, P,
                        cur.min().item(), cur.max().item())
    per_step = losses.t().tolist()  # syncs the device
    seconds = time.perf_counter() - t0
    tail_avg.copy_to(model)
    return [(m, {**run_stats(loss_list, tokens_per_step, seconds, m.num_params()), "stacked": P})
            for m, loss_list in zip(model.unstack(), per_step)]
