"""A common-stream window's cost: the Feistel order (proxies.sampler) against the permutation it replaced.

Each pass of a cluster's stream used to materialise rng.permutation(count) of its window starts
(8 bytes a window: ~0.6 GB for 10**10 tokens at seq_len 128, in every stream). It now computes a
keyed Feistel permutation CHUNK starts at a time. This times `next()` per window over whole
passes on clusters of 10**4 .. 10**8 tokens (an in-memory array, so the order's cost is not
hidden behind reads), old and new side by side (best and median of --reps), then the first
window and the peak traced memory of a 10**10-token cluster (a stand-in with no tokens).

    python benchmarks/window_stream.py --json benchmarks/results/window_stream.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import show, write_result  # noqa: E402

from proxies.sampler import _WindowStream  # noqa: E402


class PermutationStream:
    """The stream before the Feistel order (proxies/sampler.py until this benchmark)."""

    def __init__(self, array, seq_len: int, seed: tuple[int, int]) -> None:
        self.array, self.seq_len = array, seq_len
        self.rng = np.random.default_rng(list(seed))
        self.order = np.empty(0, dtype=np.int64)
        self.pos = 0

    def _new_pass(self) -> None:
        n, L = len(self.array), self.seq_len
        offset = int(self.rng.integers(0, max(1, min(L, n - L))))
        count = max(1, (n - 1 - offset) // L)
        self.order = offset + L * self.rng.permutation(count)
        self.pos = 0

    def next(self) -> np.ndarray:
        if self.pos >= len(self.order):
            self._new_pass()
        s = int(self.order[self.pos])
        self.pos += 1
        return self.array[s : s + self.seq_len + 1]


class NoTokens:
    """A cluster's length without its tokens: every window is the same zeros."""

    def __init__(self, n: int, seq_len: int) -> None:
        self.n, self.row = n, np.zeros(seq_len + 1, dtype=np.uint16)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key: slice) -> np.ndarray:
        return self.row


def ns_per_window(cls, array, seq_len: int, windows: int) -> float:
    stream = cls(array, seq_len, (0, 3))
    t = time.perf_counter()
    for _ in range(windows):
        stream.next()
    return (time.perf_counter() - t) / windows * 1e9


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--big", type=float, default=1e10, help="tokens of the cluster timed for its first window")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    L = args.seq_len
    out = {"seq_len": L, "load_average": os.getloadavg()[0], "sizes": [], "big": {}}
    for n, passes in [(10**4, 200), (10**5, 20), (10**6, 3), (10**7, 2), (10**8, 2)]:
        array, windows = np.zeros(n, dtype=np.uint16), passes * (n // L)
        times = {"permutation": [], "feistel": []}
        for _ in range(args.reps):  # alternated, so a busy machine slows both alike
            times["permutation"].append(ns_per_window(PermutationStream, array, L, windows))
            times["feistel"].append(ns_per_window(_WindowStream, array, L, windows))
        row = {"tokens": n, "windows": windows}
        for k, v in times.items():
            row[k] = {"best_ns": round(min(v)), "median_ns": round(statistics.median(v))}
        out["sizes"].append(row)
        show(row)
    for name, cls in [("permutation", PermutationStream), ("feistel", _WindowStream)]:
        tracemalloc.start()
        stream = cls(NoTokens(int(args.big), L), L, (0, 3))
        t = time.perf_counter()
        stream.next()
        first = time.perf_counter() - t
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        t = time.perf_counter()
        for _ in range(10**6):
            stream.next()
        per = (time.perf_counter() - t) * 1e3  # 10**6 windows: ms total == ns a window
        out["big"][name] = {"tokens": int(args.big), "first_window_ms": round(first * 1e3, 1),
                            "peak_traced_mib": round(peak / 2**20, 2), "next_1e6_ns_per_window": round(per)}
        show(out["big"][name])
        del stream
    out["load_average_after"] = os.getloadavg()[0]
    if args.json:
        write_result(args.json, out)


if __name__ == "__main__":
    main()
