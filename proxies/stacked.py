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


def layout(cfg: GPTConfig) -> list[tuple[str, str, bool]]:
    """(stacked parameter, GPT parameter, transposed) for every parameter of a StackedGPT.

    The one table that maps a GPT onto its stacked form: building the stack, unstacking
    it, and stacking what else is kept per parameter (a base's optimizer state) all read it.
    nn.Linear stores [out, in]; a batched matmul wants [in, out], hence the transposes.
    """
    out = [("wte", "wte.weight", False), ("wpe", "wpe.weight", False)]
    for i in range(cfg.n_layer):
        for name, path in _LINEARS:
            out += [(f"blocks.{i}.{name}_w", f"blocks.{i}.{path}.weight", True),
                    (f"blocks.{i}.{name}_b", f"blocks.{i}.{path}.bias", False)]
        for name, path in _NORMS:
            out += [(f"blocks.{i}.{name}_w", f"blocks.{i}.{path}.weight", False),
                    (f"blocks.{i}.{name}_b", f"blocks.{i}.{path}.bias", False)]
    out += [("lnf_w", "ln_f.weight", False), ("lnf_b", "ln_f.bias", False)]
    if not cfg.tie_embeddings:  # a tied LM head is wte itself
        out.append(("head", "lm_head.weight", False))
    return out


def stack_tensors(cfg: GPTConfig, per_model: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """{stacked name: tensor [P, ...]} from one {GPT parameter name: tensor} per proxy."""
    return {s: torch.stack([(t[g].t() if tr else t[g]).detach() for t in per_model]).contiguous()
            for s, g, tr in layout(cfg)}


class _StackedBlock(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        C = cfg.n_embd
        shapes = {"attn": (C, 3 * C), "proj": (C, C), "fc": (C, 4 * C), "out": (4 * C, C)}
        for name, (n_in, n_out) in shapes.items():
            setattr(self, f"{name}_w", nn.Parameter(torch.empty(0, n_in, n_out)))
            setattr(self, f"{name}_b", nn.Parameter(torch.empty(0, n_out)))
        for name, _ in _NORMS:
            setattr(self, f"{name}_w", nn.Parameter(torch.empty(0, C)))
            setattr(self, f"{name}_b", nn.Parameter(torch.empty(0, C)))


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
        self.wte = nn.Parameter(torch.empty(0))  # [P, V, C]
        self.wpe = nn.Parameter(torch.empty(0))  # [P, S, C]
        self.blocks = nn.ModuleList(_StackedBlock(cfg) for _ in range(cfg.n_layer))
        self.lnf_w = nn.Parameter(torch.empty(0))
        self.lnf_b = nn.Parameter(torch.empty(0))
        self.head = None if cfg.tie_embeddings else nn.Parameter(torch.empty(0))  # [P, V, C]
        stacked = stack_tensors(cfg, [dict(m.named_parameters()) for m in models])
        for name, value in stacked.items():
            self.get_parameter(name).data = value

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
            params = dict(m.named_parameters())
            for s, g, tr in layout(self.config):
                w = self.get_parameter(s)[p]
                params[g].copy_(w.t() if tr else w)
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
    base: dict | None = None,
) -> list[tuple[GPT, dict]]:
    """Train len(samplers) fresh proxies together; one (model, stats) per proxy, as ``train`` returns.

    The proxies share the step schedule and the wall time, so each one's
    ``tokens_per_s`` is the swarm's throughput divided by the number of proxies.
    ``base`` (a paused run's state, ``proxies.train``): every proxy continues it, as
    ``train(..., base=base)`` does, its weights and optimizer state stacked P times.
    """
    if len(samplers) != len(seeds) or not samplers:
        raise ValueError(f"train_stacked needs one seed per sampler; got {len(samplers)} samplers, {len(seeds)} seeds")
    device, accum, amp, tokens_per_step = prepare(model_cfg, train_cfg, samplers, device)
    P = len(samplers)

    models = []
    for seed in seeds:  # exactly as train() builds its model, so the inits match
        with seeded(seed, device):
            models.append(GPT(model_cfg))
        if base is not None:
            models[-1].load_state_dict(base["model"])
    model = StackedGPT(models).to(device)
    del models
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    # Matrices (stacked: 3-d) decay, biases and norm gains (stacked: 2-d) do not, as in train().
    optimizer = make_optimizer(param_groups(params, train_cfg.weight_decay, matrix_dim=3), train_cfg, device)
    losses = torch.zeros(train_cfg.steps, P, device=device)
    tail_avg, avg_from = TailAverage(), average_from(train_cfg)  # elementwise, so per proxy as in train()
    first = 0
    if base is not None:
        first = _continue(base, model, optimizer, losses, tail_avg, train_cfg)
        for s in samplers:
            s.skip(first * accum)
    t0 = time.perf_counter()
    for step in range(first, train_cfg.steps):
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
    more = {"stacked": P, **({"continued_from": first} if base is not None else {})}
    return [(m, {**run_stats(loss_list, tokens_per_step, seconds, m.num_params()), **more})
            for m, loss_list in zip(model.unstack(), per_step)]


def _continue(base: dict, model: StackedGPT, optimizer, losses: torch.Tensor, tail_avg: TailAverage,
              train_cfg: TrainConfig) -> int:
    """Load a base's optimizer state, step losses and tail average into every proxy of the
    stack (its weights are in already); returns the base's step."""
    cfg, P = model.config, model.n_proxies
    step = int(base["step"])
    if not 0 < step < train_cfg.steps or len(base["losses"]) != step:
        raise ValueError(f"cannot continue a base paused at step {step} of {len(base['losses'])} losses "
                         f"in a run of {train_cfg.steps} steps")
    with torch.device("meta"):  # built there, not moved there: moving would untie a tied head
        gpt = GPT(cfg)
    # The optimizer numbers parameters group by group (proxies.train.param_groups).
    named = list(gpt.named_parameters())
    gpt_order = [n for n, p in named if p.dim() >= 2] + [n for n, p in named if p.dim() < 2]
    snamed = list(model.named_parameters())
    stacked_order = [n for n, p in snamed if p.dim() >= 3] + [n for n, p in snamed if p.dim() < 3]
    saved = base["optimizer"]["state"]
    per_name = {gpt_order[int(i)]: st for i, st in saved.items()}
    state = {}
    for key in ("exp_avg", "exp_avg_sq"):
        stacked = stack_tensors(cfg, [{n: st[key] for n, st in per_name.items()}] * P)
        for j, n in enumerate(stacked_order):
            state.setdefault(j, {"step": per_name[_gpt_name(cfg, n)]["step"].clone()})[key] = stacked[n]
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
    losses[:step] = torch.tensor(base["losses"], device=losses.device).unsqueeze(1).expand(step, P)
    avg, n = base["tail"]
    if avg is not None:
        by_name = dict(zip([nm for nm, _ in named], avg))
        stacked = stack_tensors(cfg, [by_name] * P)
        tail_avg.avg = [stacked[nm].to(losses.device) for nm, _ in snamed]
    tail_avg.n = int(n)
    return step


def _gpt_name(cfg: GPTConfig, stacked_name: str) -> str:
    return next(g for s, g, _ in layout(cfg) if s == stacked_name)
