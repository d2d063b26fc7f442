"""Tiny GPT decoder used as the proxy language model in the mixture search.

A pre-LayerNorm GPT (nanoGPT style): token + learned positional embeddings,
causal self-attention through ``F.scaled_dot_product_attention`` (which picks
flash / memory-efficient kernels on CUDA), a 4x GELU MLP, and an LM head tied
to the token embedding.

Its settings are ``GPTConfig`` (``proxies.config``, importable without torch;
also exported here).

Usage::

    from proxies.model import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size), seed=0).to(device)
    logits, loss = model(x, y)          # x, y: int64 [B, T], y == -1 is ignored
    lp = model.token_logprobs(ids)      # [B, T-1] log p(ids[:, t] | ids[:, :t])

Tested by ``pytest tests/test_proxies_model.py``.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import GPTConfig

logger = logging.getLogger(__name__)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Project x [B, T, C] to q, k, v, each [B, n_head, T, head_dim]."""
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        shape = (B, T, self.n_head, C // self.n_head)
        return tuple(t.view(shape).transpose(1, 2) for t in (q, k, v))  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.split_heads(x)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only transformer; ``forward(idx, targets=None) -> (logits, loss)``."""

    def __init__(self, config: GPTConfig, seed: int | None = None) -> None:
        super().__init__()
        self.config = config
        if seed is None:
            self._build(config)
        else:
            # Fork so that seeding the init does not reset the caller's global RNG.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self._build(config)

    def _build(self, config: GPTConfig) -> None:
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.seq_len, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # GPT-2 scaling: each block adds two residual branches, so shrink their
        # output projections to keep the residual-stream variance from growing with depth.
        proj_std = 0.02 / math.sqrt(2 * config.n_layer)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=proj_std)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count; a tied LM head is counted once (as the embedding)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wpe.weight.numel() + self.wte.weight.numel()
        return n

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx: int64 [B, T] with T <= seq_len. Returns logits [B, T, vocab] and,
        when targets [B, T] is given, the mean cross-entropy over targets != -1."""
        B, T = idx.shape
        if T > self.config.seq_len:
            raise ValueError(
                f"sequence length {T} exceeds the model's seq_len={self.config.seq_len}; "
                "truncate the input or build the model with a larger GPTConfig.seq_len"
            )
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            # Float32 loss: under bf16 autocast the logits are bf16 and a bf16
            # log-softmax over the vocabulary loses too much precision.
            loss = F.cross_entropy(
                logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1
            )
        return logits, loss

    def token_logprobs(self, idx: torch.Tensor) -> torch.Tensor:
        """Log-probabilities [B, T-1] (float32) of idx[:, 1:] given their prefixes.

        idx is [B, T] with T <= seq_len + 1. Entries of idx[:, 1:] that are negative
        (padding) get log-prob 0, so row sums count only real tokens.
        """
        inputs, targets = idx[:, :-1], idx[:, 1:]
        logits, _ = self(inputs.clamp_min(0))
        return gather_logprobs(logits, targets)


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[..., targets] in float32; 0 where targets < 0."""
    logits = logits.float()
    mask = targets >= 0
    safe = targets.clamp_min(0).unsqueeze(-1)
    # gather - logsumexp avoids materialising a second [B, T, V] log-softmax tensor.
    lp = logits.gather(-1, safe).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.where(mask, lp, torch.zeros_like(lp))
