"""Option pricing with the Black-Scholes formula, two implementations:

* CPU: numpy, parallel over the VM's cores;
* FPGA (`--fpga`): the batch goes to the virtual FPGA of the reservation's `dfe`
  group (an FPGA group configured with the `black_scholes` design), in tasks of
  `FPGA_CHUNK` options, through the client library; the VM only coordinates.

    python app.py MILLION_OPTIONS [--fpga]
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import deque

import numpy as np
from scipy.special import ndtr

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _parallel import cpus, parallel  # noqa: E402


def black_scholes(s, k, t, r, sigma):  # type: ignore[no-untyped-def]
    """European call and put prices."""
    sq = sigma * np.sqrt(t)
    d1 = (np.log(s / k) + (r + 0.5 * sigma * sigma) * t) / sq
    d2 = d1 - sq
    disc = k * np.exp(-r * t)
    call = s * ndtr(d1) - disc * ndtr(d2)
    put = disc * ndtr(-d2) - s * ndtr(-d1)
    return call, put


def main(argv: list[str]) -> int:
    fpga = "--fpga" in argv
    argv = [a for a in argv if a != "--fpga"]
    millions = float(argv[0]) if argv else 1.0
    n = int(millions * 1_000_000)
    rng = np.random.default_rng(11)
    s = rng.uniform(10, 200, n)
    k = s * rng.uniform(0.8, 1.2, n)
    t = rng.uniform(0.1, 2.0, n)
    r, sigma = 0.02, rng.uniform(0.1, 0.5, n)
    call = np.empty(n)
    put = np.empty(n)
    t0 = time.perf_counter()

    def chunk(a: int, b: int) -> None:
        call[a:b], put[a:b] = black_scholes(s[a:b], k[a:b], t[a:b], r, sigma[a:b])

    if fpga:
        where = on_fpga(s, k, t, r, sigma, call, put)
    else:
        parallel(chunk, n)
        where = f"cpus={cpus()}"
    parity = float(np.max(np.abs(call - put - (s - k * np.exp(-r * t)))))
    assert parity < 1e-6 * max(1.0, math.sqrt(n))
    print(f"black_scholes options={n} {where} mean_call={call.mean():.4f} parity_err={parity:.2e} "
          f"compute_s={time.perf_counter() - t0:.3f}")
    return 0


FPGA_CHUNK = 50_000
FPGA_AHEAD = 8     # tasks in flight: enough to keep 4 devices busy


def on_fpga(s, k, t, r, sigma, call, put) -> str:  # type: ignore[no-untyped-def]
    """Price on the reservation's virtual FPGA (calls, then puts from parity-free second pass)."""
    from irm_fpga.client import VirtualFpga

    group = os.environ["HARNESS_GROUP_DFE_IDS"].split(",")[0]
    address = os.environ["HARNESS_GROUP_DFE_ADDRESSES"].split(",")[0]
    device_s = 0.0
    with VirtualFpga.attach(address, os.environ["HARNESS_TENANT"], group) as dfe:
        # At most FPGA_AHEAD tasks outstanding: each holds its encoded request and, once done, its result until
        # read, so submitting the whole batch at once took the host VM over 256 MB on a 1-device group.
        pending: deque = deque()
        for put_side, out in ((False, call), (True, put)):
            for a in range(0, len(s), FPGA_CHUNK):
                if len(pending) >= FPGA_AHEAD:
                    device_s += _collect(*pending.popleft())
                pending.append((out, a, dfe.submit({
                    "spot": s[a:a + FPGA_CHUNK], "strike": k[a:a + FPGA_CHUNK], "maturity": t[a:a + FPGA_CHUNK],
                    "rate": r, "volatility": sigma[a:a + FPGA_CHUNK], "put": put_side})))
        while pending:
            device_s += _collect(*pending.popleft())
    return f"fpga_group={group} device_s={device_s:.4f}"


def _collect(out, a: int, fut) -> float:  # type: ignore[no-untyped-def]
    """Write a done task's prices into `out` at `a`; its device time."""
    res = fut.result()
    out[a:a + FPGA_CHUNK] = res.value["price"]
    return res.device_time_s


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
