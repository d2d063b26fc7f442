"""Reading a merged token store (proxies.tokens writes it): cluster files, and the first n tokens
of a cluster in its representative order, the same from any store that holds them.

A cluster's tokens come from several shards (each shard's documents of the cluster, in its
order). ``apportion`` fixes one order of all of them that spreads every shard evenly, and a
store capped at C keeps the first min(C, tokens) of that order: each shard's first
``apportion(C, ...)[s]`` tokens, concatenated in shard order. The counts never fall as the
prefix grows, so ``TokenStore.head(c, n)`` finds the first n in any store capped at n or more,
or not capped: each shard's first ``apportion(n, ...)[s]`` tokens, read from where that shard's
piece of the file begins (one contiguous range when n is what the file holds).

    from proxies.token_store import TokenStore     # also importable from proxies.tokens
    store = TokenStore("runs/x/tokens")
    store.tokens, store.stored                     # every token counted; what the files hold
    window_source = store.head(3, 300 * 16 * 129)   # len() and [a:b], as a proxy's sampler reads it

Tested by ``pytest tests/test_capped_store.py tests/test_proxies_data.py``.
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np


def cluster_file(directory: Path, c: int) -> Path:
    return directory / f"cluster_{c:05d}.bin"


def apportion(k: int, sizes: Sequence[int]) -> list[int]:
    """How many of its first tokens each part gives to the first ``k`` tokens of a cluster.

    ``sizes`` are the parts' (shards') tokens of the cluster, T_s, in merge order. The
    cluster's representative order places token j of part s at (j + 1/2) / T_s (ties: the
    lower s first), so every part is spread evenly over the order; its first k tokens take
    about k * T_s / sum(T) of each part, adding up to min(k, sum(T)) exactly: the Sainte-Lague
    rounding, a few tokens off at most (2.5 measured over random splits into 12 parts, under 4
    into 300; being a divisor method it is not always within one, which the largest remainder
    is, but whose counts can fall as k grows). Being prefixes of one order, these never fall,
    so a store capped at C holds the first n of any store capped at n <= C.
    Exact integer arithmetic (Python ints; a cluster's counts may pass 2**63 when multiplied).
    """
    sizes = [int(n) for n in sizes]
    total, k = sum(sizes), int(k)
    if k >= total:
        return sizes
    if k <= 0:
        return [0] * len(sizes)
    # The tokens whose place is below k / total: j with (2j + 1) * total < 2 * k * T_s.
    take = [min(n, max(0, -(-(2 * k * n - total) // (2 * total)))) for n in sizes]
    have = sum(take)
    if have < k:  # add the next tokens of the order
        heap = [(Fraction(2 * q + 1, 2 * n), s) for s, (q, n) in enumerate(zip(take, sizes)) if q < n]
        heapq.heapify(heap)
        while have < k:
            _, s = heapq.heappop(heap)
            take[s] += 1
            have += 1
            if take[s] < sizes[s]:
                heapq.heappush(heap, (Fraction(2 * take[s] + 1, 2 * sizes[s]), s))
    elif have > k:  # drop the last tokens taken
        heap = [(-Fraction(2 * q - 1, 2 * n), -s) for s, (q, n) in enumerate(zip(take, sizes)) if q > 0]
        heapq.heapify(heap)
        while have > k:
            _, s = heapq.heappop(heap)
            s = -s
            take[s] -= 1
            have -= 1
            if take[s] > 0:
                heapq.heappush(heap, (-Fraction(2 * take[s] - 1, 2 * sizes[s]), -s))
    return take


class TokenStore:
    """Read-only view of a merged token store; cluster arrays are memory-mapped lazily.

    ``tokens`` (and ``bytes``) count every document of each cluster, capped store or not: they
    are the clusters' sizes. ``stored`` is what each cluster file holds (min(cap, tokens); an
    index written before caps: all of it), and ``head`` what a proxy reads."""

    def __init__(self, out_dir: str | Path) -> None:
        self.path = Path(out_dir)
        index_path = self.path / "index.json"
        if not index_path.exists():
            raise FileNotFoundError(
                f"{index_path} not found; build the store with write_shard_tokens + merge_token_stores"
            )
        with open(index_path) as f:
            self.index = json.load(f)
        self.dtype = np.dtype(self.index["dtype"])
        self.n_clusters = int(self.index["n_clusters"])
        self.tokens = np.asarray(self.index["tokens"], dtype=np.int64)
        self.bytes = np.asarray(self.index["bytes"], dtype=np.int64)
        self.stored = np.asarray(self.index.get("stored", self.index["tokens"]), dtype=np.int64)
        self.cap = int(self.index.get("cap", 0))  # 0: every token stored
        self._maps: dict[int, np.ndarray] = {}
        self._heads: dict[tuple[int, int], list[tuple[int, int]]] = {}

    def array(self, c: int) -> np.ndarray:
        """Token ids in cluster c's file (all of the cluster's, or a capped store's share) as a
        read-only np.memmap (an empty array if the cluster is empty)."""
        if not 0 <= c < self.n_clusters:
            raise IndexError(f"cluster {c} out of range [0, {self.n_clusters})")
        if c not in self._maps:
            n = int(self.stored[c])
            if n == 0:
                # np.memmap cannot map a zero-length file.
                self._maps[c] = np.empty(0, dtype=self.dtype)
            else:
                path = cluster_file(self.path, c)
                if path.stat().st_size != n * self.dtype.itemsize:
                    raise ValueError(f"{path} size does not match index.json; re-run merge_token_stores")
                self._maps[c] = np.memmap(path, dtype=self.dtype, mode="r", shape=(n,))
        return self._maps[c]

    def reader(self, c: int) -> "ClusterReader":
        """Cluster c's file read window by window with pread: what a proxy reads is not mapped
        into it, so its memory does not grow with the pages it has touched (an mmap'ed store counts
        in a process's RSS)."""
        arr = self.array(c)  # checks the cluster and the file's size
        if not len(arr):
            return ClusterReader(None, 0, self.dtype)
        return ClusterReader(cluster_file(self.path, c), len(arr), self.dtype)

    def pieces(self, c: int) -> list[tuple[str | None, int, int, int]]:
        """(shard, offset in the file, tokens there, the shard's tokens of the cluster) of each shard
        in cluster c's file, in merge order; an index without per-shard counts: one piece (None)."""
        full = self.index.get("shard_tokens")
        if full is None:
            return [(None, 0, int(self.stored[c]), int(self.tokens[c]))]
        kept = self.index.get("shard_stored", full)
        out, offset = [], 0
        for name in self.index["shards"]:
            n = int(kept[name].get(str(c), 0))
            out.append((name, offset, n, int(full[name].get(str(c), 0))))
            offset += n
        return out

    def head(self, c: int, n: int = 0, mapped: bool = False):
        """The first ``n`` tokens (0: all stored) of cluster c's representative order
        (``apportion``), as a sliceable sequence (``len``, ``[a:b]``): the same tokens from every
        store holding at least min(n, tokens) of the cluster, capped at any cap >= n or not capped.
        ``mapped``: slices of the np.memmap (``array``); else pread (``reader``). An n beyond what
        the file holds gives the whole file."""
        src = self.array(c) if mapped else self.reader(c)
        stored = int(self.stored[c])
        if not n or n >= stored:
            return src
        n = int(n)
        if (c, n) not in self._heads:
            pieces = self.pieces(c)
            want = apportion(n, [full for _, _, _, full in pieces])
            for (name, _, have, _), w in zip(pieces, want):
                if w > have:  # only an index that lost its per-shard record can get here
                    raise ValueError(f"{self.path}: shard {name} holds {have} tokens of cluster {c} but "
                                     f"the first {n} of the cluster need {w}; re-run merge_token_stores")
            self._heads[(c, n)] = [(off, w) for (_, off, _, _), w in zip(pieces, want) if w]
        segments = self._heads[(c, n)]
        if len(segments) == 1 and segments[0][0] == 0:
            return ClusterReader(src.path, n, self.dtype) if isinstance(src, ClusterReader) else src[:n]
        return Gathered(src, segments, self.dtype)

    def doc_tokens(self, shard: str) -> np.ndarray:
        """Token count (EOS included) of each document the shard wrote, in the order given."""
        return np.load(self.path / "parts" / shard / "doc_tokens.npy")

    def token_shares(self) -> np.ndarray:
        """Fraction of all tokens in each cluster (the 'natural' mixture), by the full counts."""
        total = self.tokens.sum()
        if total == 0:
            raise ValueError(f"token store {self.path} is empty")
        return self.tokens / total

    def __len__(self) -> int:
        return self.n_clusters

    def __repr__(self) -> str:
        capped = f", cap={self.cap}, stored={int(self.stored.sum())}" if self.cap else ""
        return f"TokenStore({str(self.path)!r}, n_clusters={self.n_clusters}, tokens={int(self.tokens.sum())}{capped})"


def _bounds(key, n: int, who: str) -> tuple[int, int]:
    """A contiguous slice's (start, stop) in a sequence of `n`; anything else is refused."""
    if not isinstance(key, slice) or key.step not in (None, 1):
        raise TypeError(f"{who} takes contiguous slices only")
    a, b, _ = key.indices(n)
    return a, b


class Gathered:
    """Segments (offset, length) of a sliceable sequence read as one sequence (`len`, `[a:b]`)."""

    def __init__(self, src, segments: Sequence[tuple[int, int]], dtype: np.dtype) -> None:
        self.src, self.dtype = src, np.dtype(dtype)
        self.offsets = np.array([o for o, _ in segments], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum([n for _, n in segments])]).astype(np.int64)
        self.n = int(self.starts[-1])

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: slice) -> np.ndarray:
        a, b = _bounds(key, self.n, "Gathered")
        if b <= a:
            return np.empty(0, dtype=self.dtype)
        i = int(np.searchsorted(self.starts, a, side="right")) - 1
        out = []
        while a < b:
            e = min(b, int(self.starts[i + 1]))
            off = int(self.offsets[i]) + a - int(self.starts[i])
            out.append(self.src[off: off + e - a])
            a, i = e, i + 1
        return out[0] if len(out) == 1 else np.concatenate(out)


class ClusterReader:
    """A cluster file's tokens as a sliceable sequence (`len`, `[a:b]`), each slice one pread."""

    def __init__(self, path: Path | None, n: int, dtype: np.dtype) -> None:
        self.path, self.n, self.dtype = path, int(n), np.dtype(dtype)
        self._fd: int | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: slice) -> np.ndarray:
        a, b = _bounds(key, self.n, "ClusterReader")
        if b <= a:
            return np.empty(0, dtype=self.dtype)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        size = self.dtype.itemsize
        data = os.pread(self._fd, (b - a) * size, a * size)
        return np.frombuffer(data, dtype=self.dtype)

    def __getstate__(self):  # a file descriptor does not travel to another process
        return {**self.__dict__, "_fd": None}

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
