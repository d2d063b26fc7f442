"""The proxy model's and trainer's settings: ``GPTConfig`` and ``TrainConfig``.

Plain dataclasses that import no torch, so that a caller can read their fields and
defaults, or check a setting, without loading it (``proxies.model`` and
``proxies.train`` use them and import torch). Each ``__post_init__`` checks its
fields; a bad one raises ``ConfigFieldError``, a ValueError naming the field.

Usage::

    from proxies.config import GPTConfig, TrainConfig
    GPTConfig(vocab_size=4096, n_embd=128, n_head=4)
    TrainConfig(steps=500, schedule="wsd")
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("cosine", "wsd")
PRECISIONS = ("auto", "fp32", "bf16")


class ConfigFieldError(ValueError):
    """A setting the model or trainer cannot use: ``field`` names it, ``problem`` says
    what is wrong and the values seen (e.g. "must be at least 1, got 0")."""

    def __init__(self, owner: str, field: str, problem: str) -> None:
        super().__init__(f"{owner}.{field} {problem}")
        self.field = field
        self.problem = problem


def _choices(options: tuple[str, ...]) -> str:
    return ", ".join(map(repr, options[:-1])) + f" or {options[-1]!r}"


@dataclass(frozen=True)
class GPTConfig:
    # Embedding-table rows; use Tokenizer.vocab_size, which is already padded
    # to a multiple of 64 so the LM-head matmul hits fast kernel shapes.
    vocab_size: int
    # Number of transformer blocks.
    n_layer: int = 2
    # Attention heads per block; must divide n_embd.
    n_head: int = 2
    # Residual-stream width.
    n_embd: int = 64
    # Maximum context length (size of the positional-embedding table).
    seq_len: int = 128
    # Dropout on embeddings, attention probabilities and residual branches;
    # 0.0 for proxies because each token is seen about once.
    dropout: float = 0.0
    # Share the token embedding with the LM head (GPT-2). Untied, a proxy this small
    # leaves its initial loss plateau sooner and more steadily (BENCHMARKS.md, proxy noise).
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "n_embd", "seq_len"):
            if getattr(self, name) < 1:
                raise ConfigFieldError("GPTConfig", name, f"must be at least 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head != 0:
            raise ConfigFieldError("GPTConfig", "n_head", f"must divide n_embd, got n_head={self.n_head}, "
                                   f"n_embd={self.n_embd}; pick an n_head that divides n_embd")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigFieldError("GPTConfig", "dropout", f"must be in [0, 1), got {self.dropout}")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 200
    batch_size: int = 16
    lr: float = 3e-3
    # Final learning rate as a fraction of lr (both schedules decay to lr * min_lr_ratio).
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    schedule: str = "cosine"  # or "wsd" (warmup-stable-decay, decay over last decay_frac)
    decay_frac: float = 0.2
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    grad_clip: float = 1.0
    log_every: int = 50
    # Matmul precision: "auto" runs them under bf16 autocast where the device has
    # native bf16 kernels (CUDA; CPUs with AVX512-BF16 or AMX, for models at least
    # proxies.train.CPU_BF16_MIN_WIDTH wide), fp32 elsewhere.
    precision: str = "auto"
    # torch.compile the model (pays a one-off compilation; worth it for long GPU runs).
    compile: bool = False
    # Evaluate the mean of the weights over this last fraction of steps (0: the last
    # weights). Averaging the tail removes much of the step-to-step SGD noise.
    average_last: float = 0.0

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigFieldError("TrainConfig", "precision",
                                   f"must be {_choices(PRECISIONS)}, got {self.precision!r}")
        if self.schedule not in SCHEDULES:
            raise ConfigFieldError("TrainConfig", "schedule",
                                   f"must be {_choices(SCHEDULES)}, got {self.schedule!r}")
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigFieldError("TrainConfig", name, f"must be at least 1, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ConfigFieldError("TrainConfig", "warmup_steps", f"must be at least 0, got {self.warmup_steps}")
        if not self.lr > 0:
            raise ConfigFieldError("TrainConfig", "lr", f"must be positive, got {self.lr}")
        if not 0.0 <= self.average_last < 1.0:
            raise ConfigFieldError("TrainConfig", "average_last",
                                   f"must be in [0, 1) (0: the last weights), got {self.average_last}")
        if not 0.0 < self.decay_frac <= 1.0:
            raise ConfigFieldError("TrainConfig", "decay_frac", f"must be in (0, 1], got {self.decay_frac}")
