"""Batches of training windows drawn from a weighted mixture of token-store clusters.

Each row of a batch is a window of ``seq_len + 1`` tokens from one cluster; x is
the first ``seq_len`` tokens and y the same window shifted by one. Two choices,
each of which lowers the noise of a proxy's score (BENCHMARKS.md, proxy noise):

- which cluster a row comes from: ``exact=True`` allocates rows so that the
  running count of every cluster stays within one row of ``weights * rows`` (a
  deterministic stride schedule: each row goes to the cluster furthest behind its
  share), so every stretch of training follows the weights; ``exact=False`` draws
  each row's cluster i.i.d. with probability ``weights[c]``.
- which window: ``common=True`` gives every cluster its own random stream, seeded
  by (seed, cluster), that walks the cluster in a random order of non-overlapping
  windows, pass after pass. Each pass draws a random offset (so window boundaries
  move between passes) and the keys of a Feistel permutation of the pass's
  windows (``FeistelPermutation``: a keyed bijection of range(count) computed a
  chunk of CHUNK windows at a time, so a stream's memory does not grow with its
  cluster). The n-th window drawn from a cluster is then the same whatever the
  mixture: two proxies with one seed see the same documents in the same order
  within each cluster (common random numbers), so their difference measures the
  mixture, not the draw. ``common=False`` draws a uniformly random window from
  one generator.

Windows come from the first ``read_cap`` tokens of each cluster (``TokenStore.head``: a
representative part of the cluster, every shard in proportion; 0: all the store holds).
Set it to the most tokens one run can draw from a cluster, steps * batch_size *
(seq_len + 1): a store capped at that, at more, or not capped at all then gives the same
batches, step for step, so a store need hold no more (climb's ``tokenize.cap``).

All randomness comes from numpy Generators seeded by ``seed``, so a sampler is
reproducible and independent of global RNG state.

Usage::

    from proxies.sampler import MixtureSampler
    sampler = MixtureSampler(TokenStore("runs/x/tokens"), weights, seq_len=128,
                             batch_size=16, seed=0, device="cuda", read_cap=300 * 16 * 129)
    x, y = sampler.next_batch()      # int64 [16, 128] on the device

Tested by ``pytest tests/test_proxies_data.py tests/test_capped_store.py``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from .tokens import TokenStore

logger = logging.getLogger(__name__)

WEIGHT_SUM_TOL = 1e-6


def validate_weights(weights, store: TokenStore, seq_len: int) -> np.ndarray:
    """Check a mixture against the store; returns it as float64 renormalised to sum exactly 1."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.shape[0] != store.n_clusters:
        raise ValueError(
            f"mixture weights have shape {w.shape} but the token store has {store.n_clusters} clusters; "
            f"pass one weight per cluster"
        )
    if not np.all(np.isfinite(w)):
        raise ValueError(f"mixture weights contain NaN/inf at clusters {np.flatnonzero(~np.isfinite(w)).tolist()}")
    if np.any(w < 0):
        raise ValueError(
            f"mixture weights are negative at clusters {np.flatnonzero(w < 0).tolist()}; weights must be >= 0"
        )
    total = float(w.sum())
    if abs(total - 1.0) > WEIGHT_SUM_TOL:
        raise ValueError(
            f"mixture weights sum to {total:.8g}, not 1 (tolerance {WEIGHT_SUM_TOL}); normalise them (w / w.sum())"
        )
    too_short = [c for c in np.flatnonzero(w > 0) if store.tokens[c] < seq_len + 1]
    if too_short:
        c = int(too_short[0])
        raise ValueError(
            f"cluster {c} has weight {w[c]:.4g} but only {int(store.tokens[c])} tokens, fewer than "
            f"seq_len+1={seq_len + 1}; give clusters {[int(i) for i in too_short]} zero weight"
        )
    # np.random.Generator.choice demands sum(p) == 1 to ~1e-8, tighter than our tolerance.
    return w / total


class MixtureSampler:
    """Draws (x, y) int64 batches [batch_size, seq_len] from clusters mixed by ``weights``."""

    def __init__(
        self,
        store: TokenStore,
        weights: np.ndarray,
        seq_len: int,
        batch_size: int,
        seed: int,
        device: str | torch.device = "cpu",
        exact: bool = False,
        common: bool = False,
        read_cap: int = 0,
    ) -> None:
        if seq_len <= 0 or batch_size <= 0:
            raise ValueError(f"seq_len and batch_size must be positive, got {seq_len}, {batch_size}")
        if read_cap < 0:
            raise ValueError(f"read_cap must be >= 0 (0: every token the store holds), got {read_cap}")
        self.store = store
        self.weights = validate_weights(weights, store, seq_len)
        self.seq_len = int(seq_len)
        self.batch_size = int(batch_size)
        self.seed = seed
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        self._active = np.flatnonzero(self.weights > 0)
        self._p = self.weights[self._active]
        # On a CPU windows are read from the files (pread), so a proxy's memory does not grow with
        # the store's pages it touched; a GPU's sampler keeps the maps (many windows a step).
        # Only each cluster's first read_cap tokens (of its representative order) are read.
        self.read_cap = int(read_cap)
        mapped = self.device.type == "cuda"
        self._arrays = {int(c): store.head(int(c), self.read_cap, mapped=mapped) for c in self._active}
        short = [int(c) for c in self._active if len(self._arrays[int(c)]) < self.seq_len + 1]
        if short:
            raise ValueError(f"clusters {short} hold fewer than seq_len+1={self.seq_len + 1} tokens in {store.path} "
                             f"(capped at {store.cap} a cluster); build the store with a larger cap")
        # Valid window starts are 0 .. n - seq_len - 1 inclusive.
        self._n_starts = np.array([len(self._arrays[int(c)]) - self.seq_len for c in self._active], dtype=np.int64)
        self._pin = self.device.type == "cuda"
        self.exact, self.common = bool(exact), bool(common)
        self._taken = np.zeros(len(self._active), dtype=np.float64)  # rows given to each active cluster
        self._rows = 0
        self._streams = [_WindowStream(self._arrays[int(c)], self.seq_len, (int(seed), int(c)))
                         for c in self._active] if self.common else []

    def sample_windows(self) -> np.ndarray:
        """One batch of windows as int64 [batch_size, seq_len + 1]."""
        which = self._exact_rows() if self.exact else self.rng.choice(len(self._active), size=self.batch_size,
                                                                       p=self._p)
        buf = np.empty((self.batch_size, self.seq_len + 1), dtype=np.int64)
        if self.common:
            for row, k in enumerate(which):
                buf[row] = self._streams[int(k)].next()
        else:
            starts = self.rng.integers(0, self._n_starts[which])
            for row, (k, s) in enumerate(zip(which, starts)):
                buf[row] = self._arrays[int(self._active[k])][s : s + self.seq_len + 1]
        return buf

    def _exact_rows(self) -> np.ndarray:
        # Stride schedule: each row goes to the cluster whose count lags its share most,
        # so after r rows every count is within one of weights * r.
        which = np.empty(self.batch_size, dtype=np.int64)
        for row in range(self.batch_size):
            self._rows += 1
            k = int(np.argmax(self._p * self._rows - self._taken))
            self._taken[k] += 1
            which[row] = k
        return which

    def skip(self, batches: int) -> None:
        """Draw and drop ``batches`` batches: the sampler then continues where a run that
        trained on them would (a resumed run's fast-forward)."""
        for _ in range(batches):
            self.sample_windows()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return _to_batch(self.sample_windows(), self.device, self._pin)


def _to_batch(buf: np.ndarray, device: torch.device, pin: bool) -> tuple[torch.Tensor, torch.Tensor]:
    t = torch.from_numpy(buf)
    if pin:
        # A fresh pinned tensor per batch: reusing one buffer could be overwritten
        # while the previous asynchronous copy is still reading it.
        t = t.pin_memory()
    t = t.to(device, non_blocking=pin)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


class SwitchSampler:
    """``before``'s batches for the first ``switch_at`` batches, then ``after``'s.

    A run continued from a shared base (a proxy trained on one mixture for its first
    steps, then on its own) draws from this: trained from scratch it equals, step for
    step, the base followed by its continuation. The two samplers draw from their own
    generators, so ``after``'s batches do not depend on what ``before`` drew, and a
    continuation needs no ``before`` at all (None): skipping past the switch only
    counts its batches.
    """

    def __init__(self, before: MixtureSampler | None, after: MixtureSampler, switch_at: int) -> None:
        if switch_at < 0:
            raise ValueError(f"switch_at must be >= 0, got {switch_at}")
        if before is not None and (before.seq_len, before.batch_size) != (after.seq_len, after.batch_size):
            raise ValueError("both samplers of a SwitchSampler need the same seq_len and batch_size")
        self.before, self.after, self.switch_at = before, after, int(switch_at)
        self.seq_len, self.batch_size, self.device = after.seq_len, after.batch_size, after.device
        self.weights = after.weights
        self.drawn = 0

    def sample_windows(self) -> np.ndarray:
        if self.drawn < self.switch_at:
            if self.before is None:
                raise ValueError(f"this sampler continues a base from batch {self.switch_at}; it has no sampler "
                                 f"for batch {self.drawn} (skip the base's batches first)")
            out = self.before.sample_windows()
        else:
            out = self.after.sample_windows()
        self.drawn += 1
        return out

    def skip(self, batches: int) -> None:
        first = max(0, min(batches, self.switch_at - self.drawn))
        if first and self.before is not None:
            self.before.skip(first)
        self.after.skip(batches - first)
        self.drawn += batches

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return _to_batch(self.sample_windows(), self.device, self.device.type == "cuda")


# A pass's order of window starts is a keyed Feistel permutation evaluated a chunk at a time, so
# a stream's memory does not grow with its cluster (a materialised permutation of a 10**10-token
# cluster's windows took ~0.6 GB a stream, and each proxy of a stacked swarm held its own copy).
FEISTEL_ROUNDS = 4
# Permutation inputs evaluated at once: a stream holds at most this many window starts (16 KiB).
# A numpy call's fixed cost dominates at this size, so a larger chunk is cheaper per window.
CHUNK = 2048
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's multipliers


class FeistelPermutation:
    """A keyed bijection of range(count) whose values are computed on demand, in O(1) memory.

    ``network`` is a Feistel network on ``bits``-bit integers, 2**bits the smallest power of
    two >= count (so < 2 * count). Round r splits x into its low b and high a bits
    (a + b = bits, the two as equal as can be) and maps it to ``lo << a | (hi ^ F_r(lo))``;
    the widths then swap for the next round. Each round is invertible whatever F_r is
    (lo is carried over, and hi = the new low bits ^ F_r(lo)), hence the network is a
    bijection of range(2**bits). F_r(v) is the top a bits of a multiply-xorshift-multiply
    hash of ``v ^ keys[r]``.

    The permutation of range(count) is the network's values at 0, 1, ..., 2**bits - 1 with
    those >= count dropped (each value below count comes from exactly one input):
    ``block(j, stop)`` gives the part that inputs j .. stop-1 contribute, so a pass is
    ``block(0, CHUNK)``, ``block(CHUNK, 2 * CHUNK)``, ... up to ``domain``.
    """

    def __init__(self, count: int, keys) -> None:
        if not 1 <= count <= 2**63:  # values come back as int64
            raise ValueError(f"count must lie in [1, 2**63], got {count}")
        self.count = int(count)
        self.bits = (self.count - 1).bit_length()
        self.domain = 1 << self.bits
        self.keys = tuple(int(k) for k in np.asarray(keys, dtype=np.uint64).reshape(-1))
        # (low width b, high width a, key) of each round, as plain ints: building numpy scalars
        # would cost more than the rounds' arithmetic on a chunk
        b, a = self.bits // 2, self.bits - self.bits // 2
        self._rounds = []
        for key in self.keys:
            self._rounds.append((b, a, key))
            a, b = b, a

    def network(self, x) -> np.ndarray:
        """The Feistel network on uint64 values < 2**bits: a bijection of range(2**bits)."""
        x = np.asarray(x, dtype=np.uint64)
        for b, a, key in self._rounds:
            if a == 0:  # bits <= 1 and no high half: the round is the identity
                continue
            lo = x & ((1 << b) - 1)
            z = lo ^ key
            z *= _M1
            z ^= z >> 32
            z *= _M2
            z >>= 64 - a  # F: the hash's top a bits
            z ^= x >> b
            lo <<= a
            x = lo | z
        return x

    def block(self, j: int, stop: int) -> np.ndarray:
        """The values (int64, in range(count)) that the network gives inputs j .. stop-1, in that order."""
        y = self.network(np.arange(j, min(stop, self.domain), dtype=np.uint64))
        return y[y < self.count].astype(np.int64)


class _WindowStream:
    """One cluster's windows in a random order of non-overlapping windows, pass after pass.

    Each pass draws, from the stream's own generator, a random offset (so window boundaries
    move between passes) and the keys of a :class:`FeistelPermutation` of its ``count``
    windows; their starts are computed a chunk at a time, so a stream holds at most CHUNK
    of them whatever the cluster's size.
    """

    def __init__(self, array: np.ndarray, seq_len: int, seed: tuple[int, int]) -> None:
        self.array, self.seq_len = array, seq_len
        self.rng = np.random.default_rng(list(seed))
        self.offset, self.perm = 0, None  # the current pass's offset and order (None: no pass yet)
        self._j = 0  # the next of the order's inputs to evaluate
        self._buf = memoryview(np.empty(0, dtype=np.int64))  # window starts of this chunk (ints when indexed)
        self._k = 0  # how many of _buf were drawn

    def _new_pass(self) -> None:
        n, L = len(self.array), self.seq_len
        # A random offset each pass, so window boundaries move between passes.
        offset = int(self.rng.integers(0, max(1, min(L, n - L))))
        count = max(1, (n - 1 - offset) // L)
        keys = self.rng.integers(0, 2**64, size=FEISTEL_ROUNDS, dtype=np.uint64)
        self.offset, self.perm, self._j = offset, FeistelPermutation(count, keys), 0

    def _refill(self) -> None:
        while True:
            if self.perm is None or self._j >= self.perm.domain:
                self._new_pass()
            idx = self.perm.block(self._j, self._j + CHUNK)
            self._j += CHUNK
            if len(idx):
                idx *= self.seq_len
                idx += self.offset
                self._buf, self._k = memoryview(idx), 0
                return

    def next(self) -> np.ndarray:
        k = self._k
        if k >= len(self._buf):
            self._refill()
            k = 0
        s = self._buf[k]
        self._k = k + 1
        return self.array[s : s + self.seq_len + 1]

    def __getstate__(self):  # a memoryview does not pickle
        return {**self.__dict__, "_buf": np.asarray(self._buf)}

    def __setstate__(self, state) -> None:
        self.__dict__.update(state, _buf=memoryview(state["_buf"]))
