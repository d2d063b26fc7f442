"""Train one proxy GPT on batches from a MixtureSampler.

AdamW (fused on CUDA) with decoupled weight decay on matrices only, linear warmup
followed by cosine or warmup-stable-decay (WSD) learning-rate schedule, gradient
clipping, and bf16 autocast where the device has native bf16 kernels
(``TrainConfig.precision``; the settings live in ``proxies.config``, importable
without torch, and are exported here too). All torch randomness (init, dropout) runs inside
``torch.random.fork_rng`` seeded by ``seed``, so the caller's global RNG is untouched
and a CPU run is bit-for-bit reproducible given the seed and a fresh sampler.

Usage::

    from proxies.train import TrainConfig, train
    model, stats = train(GPTConfig(vocab_size=tok.vocab_size), TrainConfig(steps=500),
                         sampler, seed=0, device="cuda")
    stats["final_loss"], stats["tokens_per_s"]

If ``train_cfg.batch_size`` is a multiple of ``sampler.batch_size``, gradients are
accumulated over micro-batches (to fit memory). Tested by ``pytest tests/test_proxies_model.py``.

The setup ``train`` shares with ``proxies.stacked.train_stacked`` lives here too:
``prepare`` (checks, device, micro-batches, autocast), ``seeded``, ``param_groups``
and ``make_optimizer``, ``start_step`` / ``end_step`` (deadline, learning rate,
optimizer step, tail average), ``log_due`` and ``run_stats``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import torch

from .config import GPTConfig, TrainConfig
from .model import GPT
from .sampler import MixtureSampler

logger = logging.getLogger(__name__)


class TrainingTimeout(RuntimeError):
    """Training ran past its wall-clock deadline (the caller's time limit)."""


def check_deadline(deadline: float | None, step: int, steps: int) -> None:
    """Raise TrainingTimeout once ``time.monotonic()`` is past ``deadline`` (None: no limit)."""
    if deadline is not None and time.monotonic() > deadline:
        raise TrainingTimeout(f"training stopped at step {step}/{steps}: past its time limit")


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for 0-based ``step``; the last step (steps-1) gets exactly lr * min_lr_ratio."""
    min_lr = cfg.lr * cfg.min_lr_ratio
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    last = cfg.steps - 1
    if cfg.schedule == "cosine":
        span = max(1, last - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - min_lr)
    # WSD: constant until the decay window, then linear down to min_lr on the last step.
    decay_steps = max(1, round(cfg.decay_frac * cfg.steps))
    decay_start = cfg.steps - decay_steps
    if step < decay_start:
        return cfg.lr
    progress = min(1.0, (step - decay_start + 1) / decay_steps)
    return cfg.lr + progress * (min_lr - cfg.lr)


def native_bf16(device: torch.device) -> bool:
    """True where bf16 matmuls are faster than fp32: CUDA, and CPUs with AMX.

    oneDNN has bf16 kernels on any CPU with AVX512-BF16, but without AMX's tile units a
    plain SentenceTransformer.encode ran at 0.61x its fp32 speed on such a CPU (18.9
    against 30.7 documents/s); with AMX it ran at 2.13x here (benchmarks/cpu_precision.py).
    Where /proc/cpuinfo cannot say, oneDNN's own answer stands."""
    if device.type == "cuda":
        return True
    if device.type == "cpu":
        try:
            if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
                return False
        except (AttributeError, RuntimeError):
            return False
        flags = cpu_flags()
        return flags is None or "amx_bf16" in flags
    return False


def cpu_flags() -> set[str] | None:
    """The CPU's feature flags (Linux's /proc/cpuinfo), or None where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


# On a CPU, bf16 pays only once the matmuls are wide enough: a narrow proxy
# trained slower under bf16 autocast than in fp32, wider ones faster (see
# BENCHMARKS.md, Stage speed).
CPU_BF16_MIN_WIDTH = 96


def uses_bf16(device: torch.device, precision: str, width: int | None = None) -> bool:
    """Whether the trainers run a model of this width (n_embd) under bf16 autocast."""
    if precision != "auto":
        return precision == "bf16"
    return native_bf16(device) and (device.type != "cpu" or width is None or width >= CPU_BF16_MIN_WIDTH)


def autocast(device: torch.device, precision: str, width: int | None = None):
    """The autocast context the trainers run forward passes under (width: the model's n_embd)."""
    if uses_bf16(device, precision, width) and device.type in ("cuda", "cpu"):
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def average_from(cfg: TrainConfig) -> int:
    """The first step whose weights enter the tail average (cfg.steps: no averaging)."""
    if cfg.average_last <= 0:
        return cfg.steps
    return max(0, cfg.steps - max(1, round(cfg.average_last * cfg.steps)))


class TailAverage:
    """Running equal-weight mean of a module's parameters over the steps it is updated."""

    def __init__(self) -> None:
        self.avg: list[torch.Tensor] | None = None
        self.n = 0

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        params = [p.detach() for p in model.parameters()]
        self.n += 1
        if self.avg is None:
            self.avg = [p.clone().float() for p in params]
            return
        for a, p in zip(self.avg, params):
            a.add_(p.float() - a, alpha=1.0 / self.n)

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        if self.avg is not None:
            for a, p in zip(self.avg, model.parameters()):
                p.copy_(a.to(p.dtype))


class Prepared(NamedTuple):
    device: torch.device
    accum: int  # micro-batches per optimizer step
    amp: Any  # the autocast context forward passes run under
    tokens_per_step: int


def prepare(model_cfg: GPTConfig, train_cfg: TrainConfig, samplers: list[MixtureSampler],
            device: str | torch.device) -> Prepared:
    """Check that the samplers fit the model and the batch; the device, accumulation and autocast to train with."""
    device = torch.device(device)
    for s in samplers:
        if s.seq_len > model_cfg.seq_len:
            raise ValueError(
                f"sampler.seq_len={s.seq_len} exceeds model seq_len={model_cfg.seq_len}; "
                "build the sampler with seq_len=model_cfg.seq_len"
            )
    micro = sorted({s.batch_size for s in samplers})
    if len(micro) != 1:
        raise ValueError(f"every sampler needs the same batch_size; got {micro}")
    if train_cfg.batch_size % micro[0] != 0:
        raise ValueError(
            f"train_cfg.batch_size={train_cfg.batch_size} is not a multiple of sampler.batch_size="
            f"{micro[0]}; build the sampler with batch_size=train_cfg.batch_size"
        )
    return Prepared(device, train_cfg.batch_size // micro[0], autocast(device, train_cfg.precision, model_cfg.n_embd),
                    train_cfg.batch_size * samplers[0].seq_len)


@contextlib.contextmanager
def seeded(seed: int, device: torch.device):
    """torch's RNG seeded with ``seed`` inside (CPU, and ``device`` if CUDA); the caller's is restored after."""
    cuda = device.type == "cuda"
    fork_devices = [device.index if device.index is not None else torch.cuda.current_device()] if cuda else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        yield


def param_groups(params: Iterable[torch.Tensor], weight_decay: float, matrix_dim: int = 2) -> list[dict]:
    """AdamW groups: tensors of at least ``matrix_dim`` dimensions (matrices: linear weights,
    embeddings) decay, the rest (biases, LayerNorm gains) does not."""
    params = [p for p in params if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= matrix_dim], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < matrix_dim], "weight_decay": 0.0}]


def make_optimizer(groups: list[dict], train_cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW at the schedule's first learning rate, fused on CUDA."""
    return torch.optim.AdamW(groups, lr=lr_at(0, train_cfg), betas=tuple(train_cfg.betas),
                             **({"fused": True} if device.type == "cuda" else {}))


def start_step(optimizer: torch.optim.Optimizer, step: int, train_cfg: TrainConfig, deadline: float | None) -> float:
    """Before a step: stop past the deadline, else set and return the step's learning rate."""
    check_deadline(deadline, step, train_cfg.steps)
    lr = lr_at(step, train_cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def end_step(optimizer: torch.optim.Optimizer, model: torch.nn.Module, step: int, tail_avg: TailAverage,
             avg_from: int) -> None:
    """After the gradients (and clipping): the update, then the tail average from step ``avg_from`` on."""
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step >= avg_from:
        tail_avg.update(model)


def log_due(step: int, train_cfg: TrainConfig) -> bool:
    """Whether step (0-based) is a log point: every ``log_every`` steps, and the last."""
    return train_cfg.log_every > 0 and ((step + 1) % train_cfg.log_every == 0 or step + 1 == train_cfg.steps)


def curve_steps(steps: int, points: int) -> list[int]:
    """``points`` step counts spread evenly over a run of ``steps`` steps, the last one ``steps``."""
    points = max(0, min(points, steps))
    return sorted({round(steps * (i + 1) / points) for i in range(points)}) if points else []


def loss_curve(losses: list[float], tokens_per_step: int, points: int) -> dict:
    """The training loss at ``points`` places: each the mean step loss since the previous one.

    {"step": [...], "tokens": [...], "train_loss": [...]}; empty lists for points = 0.
    """
    ends = curve_steps(len(losses), points)
    starts = [0] + ends[:-1]
    return {"step": ends, "tokens": [e * tokens_per_step for e in ends],
            "train_loss": [float(sum(losses[a:b]) / (b - a)) for a, b in zip(starts, ends)]}


def run_stats(losses: list[float], tokens_per_step: int, seconds: float, num_params: int) -> dict:
    """The stats dict a trainer returns for one proxy (see ``train``), over the steps whose
    losses are given: all of a run's steps, or a paused run's so far."""
    steps = len(losses)
    tail = max(1, math.ceil(0.1 * steps))
    tokens = steps * tokens_per_step
    return {
        "steps": steps,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / max(seconds, 1e-9),
        "final_loss": float(sum(losses[-tail:]) / tail),
        "losses": losses,
        "num_params": num_params,
        "finite": all(math.isfinite(v) for v in losses),
    }


def train(
    model_cfg: GPTConfig,
    train_cfg: TrainConfig,
    sampler: MixtureSampler,
    seed: int,
    device: str | torch.device = "cpu",
    deadline: float | None = None,
    on_point: Callable[[int, GPT], None] | None = None,
    points: Sequence[int] = (),
    stop_at: int | None = None,
    resume: dict | None = None,
    base: dict | None = None,
) -> tuple[GPT, dict]:
    """Train a fresh GPT; returns (model in eval mode, stats).

    ``stop_at`` (0 < stop_at < steps) pauses the run after that many steps: the
    model is returned with its current weights and ``stats["state"]`` holds what
    continuing needs (weights, optimizer, step losses, tail average, RNG). Passing
    that state as ``resume``, with a fresh sampler built as the first one was,
    continues the run to the end exactly as if it had never paused (the sampler
    is fast-forwarded by the batches already drawn). A paused run's stats count
    the steps and tokens trained so far.

    ``base`` is such a state too, shared by many runs: each continues it on its own
    data (a ``SwitchSampler`` whose switch is at the base's batches) and equals, step
    for step, a run trained from scratch on the base's data and then on its own.
    Unlike a resumed run, a continued one reports its own seconds only, and
    ``stats["continued_from"]`` is the base's step (its own tokens are the steps after it).

    ``deadline`` (a ``time.monotonic()`` value) stops training with TrainingTimeout
    at the first step that starts after it. ``on_point(step, model)`` is called after
    each step count in ``points`` short of the last (the model in eval mode, its
    current weights, not the tail average; training goes on after it), e.g. to score
    the model on its target during training.

    stats: steps, tokens, seconds, tokens_per_s, final_loss (mean of the last 10% of
    step losses), losses (one per step), num_params, finite (False if the loss diverged).
    """
    device, accum, amp, tokens_per_step = prepare(model_cfg, train_cfg, [sampler], device)
    if base is not None:
        if resume is not None:
            raise ValueError("train: give a paused run to resume or a base to continue, not both")
        # A copy: the optimizer and the tail average update their state in place, and a
        # base is continued many times.
        resume = {**copy.deepcopy(base), "seconds": 0.0}
    if stop_at is not None and not 0 < stop_at < train_cfg.steps:
        raise ValueError(f"stop_at={stop_at} must be within (0, {train_cfg.steps})")
    first = 0

    with seeded(seed, device):
        model = GPT(model_cfg).to(device)
        model.train()
        forward = torch.compile(model) if train_cfg.compile else model
        optimizer = make_optimizer(param_groups(model.parameters(), train_cfg.weight_decay), train_cfg, device)
        # Losses stay on the device and are read back only at log points, so CUDA
        # steps are not serialised by a host sync every step.
        losses = torch.zeros(train_cfg.steps, device=device)
        tail_avg, avg_from = TailAverage(), average_from(train_cfg)
        if resume is not None:
            first = _restore(resume, model, optimizer, losses, tail_avg, sampler, accum, train_cfg, device)
        stops = {p for p in points if first < p < train_cfg.steps}
        end = stop_at if stop_at is not None else train_cfg.steps
        t0 = last_t = time.perf_counter()
        last_step = first
        for step in range(first, end):
            lr = start_step(optimizer, step, train_cfg, deadline)
            step_loss = torch.zeros((), device=device)
            for _ in range(accum):
                x, y = sampler.next_batch()
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # no-op if already there
                with amp:
                    _, loss = forward(x, y)
                (loss / accum).backward()
                step_loss += loss.detach() / accum
            if train_cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
            end_step(optimizer, model, step, tail_avg, avg_from)
            losses[step] = step_loss
            if on_point is not None and step + 1 in stops:
                model.eval()
                with torch.no_grad():
                    on_point(step + 1, model)
                model.train()
            if log_due(step, train_cfg):
                current = losses[step].item()  # syncs the device, so the timing below is real
                now = time.perf_counter()
                tps = (step + 1 - last_step) * tokens_per_step / max(now - last_t, 1e-9)
                logger.info(
                    "step %d/%d loss %.4f lr %.2e %.0f tok/s", step + 1, train_cfg.steps, current, lr, tps
                )
                last_t, last_step = now, step + 1
        seconds = time.perf_counter() - t0 + (resume or {}).get("seconds", 0.0)
        if stop_at is not None:
            state = _pause(stop_at, model, optimizer, losses, tail_avg, seconds, device)
            model.eval()
            return model, {**run_stats(losses[:stop_at].tolist(), tokens_per_step, seconds, model.num_params()),
                           "state": state}
        loss_list = losses.tolist()
        tail_avg.copy_to(model)

    stats = run_stats(loss_list, tokens_per_step, seconds, model.num_params())
    if base is not None:
        stats["continued_from"] = first
    if not stats["finite"]:
        logger.warning("training diverged: non-finite loss (final_loss=%s)", stats["final_loss"])
    model.eval()
    return model, stats


def _pause(step: int, model: GPT, optimizer, losses: torch.Tensor, tail_avg: TailAverage, seconds: float,
           device: torch.device) -> dict:
    """What continuing a run paused after ``step`` steps needs, on the CPU (torch.save-able)."""
    def cpu(obj):
        if isinstance(obj, torch.Tensor):
            return obj.detach().to("cpu", copy=True)
        if isinstance(obj, dict):
            return {k: cpu(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(cpu(v) for v in obj)
        return obj
    state = {"step": step, "model": cpu(model.state_dict()), "optimizer": cpu(optimizer.state_dict()),
             "losses": losses[:step].tolist(), "tail": [cpu(tail_avg.avg), tail_avg.n], "seconds": seconds,
             "rng": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return state


def _restore(state: dict, model: GPT, optimizer, losses: torch.Tensor, tail_avg: TailAverage,
             sampler: MixtureSampler, accum: int, train_cfg: TrainConfig, device: torch.device) -> int:
    """Load a paused run's state (``_pause``) into a fresh model and optimizer; returns its step."""
    step = int(state["step"])
    if not 0 < step < train_cfg.steps or len(state["losses"]) != step:
        raise ValueError(f"cannot resume a run paused at step {step} of {len(state['losses'])} losses "
                         f"into one of {train_cfg.steps} steps")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    losses[:step] = torch.tensor(state["losses"], device=device)
    avg, n = state["tail"]
    tail_avg.avg, tail_avg.n = ([a.to(device) for a in avg] if avg is not None else None), int(n)
    torch.set_rng_state(state["rng"])
    if device.type == "cuda" and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"], device)
    sampler.skip(step * accum)  # the sampler's draws so far, so it continues where it was
    return step
