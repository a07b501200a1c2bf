"""An RTM-like seismic stencil (thesis §4.5: Reverse Time Migration): a 2-D acoustic wave
propagated with a second-order finite-difference stencil, parallel over the VM's cores.
Work and memory are linear in the number of grid rows (the input size).

    python app.py ROWS [STEPS]
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _parallel import cpus, parallel  # noqa: E402

COLS = 1024
BLOCK = 128


def main(argv: list[str]) -> int:
    rows = int(argv[0]) if argv else 400
    steps = int(argv[1]) if len(argv) > 1 else 40
    prev = np.zeros((rows, COLS), dtype=np.float32)
    cur = np.zeros_like(prev)
    nxt = np.zeros_like(prev)
    cur[rows // 2, COLS // 2] = 1.0
    c2 = np.float32(0.2)
    t0 = time.perf_counter()
    for _ in range(steps):
        def band(a: int, b: int, prev=prev, cur=cur, nxt=nxt) -> None:  # type: ignore[no-untyped-def]
            # Cache-sized blocks of rows: the stencil stays compute-bound, so cores add speed.
            for lo in range(max(a, 1), min(b, rows - 1), BLOCK):
                hi = min(lo + BLOCK, b, rows - 1)
                lap = (cur[lo - 1:hi - 1, 1:-1] + cur[lo + 1:hi + 1, 1:-1] + cur[lo:hi, :-2] + cur[lo:hi, 2:]
                       - 4.0 * cur[lo:hi, 1:-1])
                nxt[lo:hi, 1:-1] = 2.0 * cur[lo:hi, 1:-1] - prev[lo:hi, 1:-1] + c2 * lap
        parallel(band, rows)
        prev, cur, nxt = cur, nxt, prev
    energy = float(np.square(cur, dtype=np.float64).sum())
    print(f"rtm rows={rows} cols={COLS} steps={steps} cpus={cpus()} energy={energy:.6e} "
          f"compute_s={time.perf_counter() - t0:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
