"""A DeltaMerge-like table merge (thesis §4.5: SAP HANA's delta merge): a sorted main table
of (key, value) rows is merged with a delta of updates and inserts into a new sorted main.
It holds the old main, the delta and the new main in memory at once, so it is
memory-hungry: with too little memory it dies (in a VM, at the VM's memory limit).
Partitions are merged in parallel over the VM's cores.

    python app.py MILLION_ROWS
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _parallel import cpus, parallel  # noqa: E402


def main(argv: list[str]) -> int:
    millions = float(argv[0]) if argv else 2.0
    n = int(millions * 1_000_000)
    rng = np.random.default_rng(7)
    main_keys = np.arange(0, 2 * n, 2, dtype=np.int64)  # sorted, even keys
    main_vals = rng.random(n)
    d = n // 4
    delta_keys = rng.integers(0, 2 * n, size=d, dtype=np.int64)  # updates (even) and inserts (odd)
    delta_vals = rng.random(d)
    t0 = time.perf_counter()
    order = np.argsort(delta_keys, kind="stable")
    delta_keys, delta_vals = delta_keys[order], delta_vals[order]
    parts = cpus() * 2
    edges = np.linspace(0, 2 * n, parts + 1).astype(np.int64)

    def merge(a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        ks, vs = [], []
        for p in range(a, b):
            lo, hi = edges[p], edges[p + 1]
            m0, m1 = np.searchsorted(main_keys, [lo, hi])
            d0, d1 = np.searchsorted(delta_keys, [lo, hi])
            k = np.concatenate([main_keys[m0:m1], delta_keys[d0:d1]])
            v = np.concatenate([main_vals[m0:m1], delta_vals[d0:d1]])
            o = np.argsort(k, kind="stable")  # delta after main for equal keys
            k, v = k[o], v[o]
            last = np.ones(len(k), dtype=bool)
            last[:-1] = k[1:] != k[:-1]  # keep the newest version of each key
            ks.append(k[last])
            vs.append(v[last])
        return np.concatenate(ks), np.concatenate(vs)

    chunks = parallel(merge, parts)
    new_keys = np.concatenate([c[0] for c in chunks])
    new_vals = np.concatenate([c[1] for c in chunks])
    assert bool(np.all(new_keys[1:] > new_keys[:-1]))
    print(f"deltamerge main={n} delta={d} merged={len(new_keys)} cpus={cpus()} checksum={new_vals.sum():.6f} "
          f"compute_s={time.perf_counter() - t0:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
