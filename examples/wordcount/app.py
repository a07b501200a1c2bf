"""Word count over a corpus served by another module: a two-module application.

The `Main` module fetches SHARDS shards from the `Store` module (its address comes from
`HARNESS_MODULE_STORE_ENDPOINT`, set by the application manager once the store said it was
ready) and counts word frequencies, fetching and counting on as many threads as the VM has
cores (numpy's bincount and socket reads release the GIL). It checks every shard's length
against the store's `X-Words` header and prints the corpus' most frequent words.

    python app.py SHARDS
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _parallel import cpus  # noqa: E402

VOCABULARY = 50_000


def fetch_and_count(endpoint: str, i: int) -> tuple[np.ndarray, int]:
    with urllib.request.urlopen(f"http://{endpoint}/shard/{i}", timeout=60) as r:
        expected = int(r.headers["X-Words"])
        ids = np.frombuffer(r.read(), dtype="<u4")
    if ids.size != expected:
        raise RuntimeError(f"shard {i}: {ids.size} words, the store announced {expected}")
    return np.bincount(ids, minlength=VOCABULARY), ids.size


def main(argv: list[str]) -> int:
    shards = int(argv[0]) if argv else 16
    endpoint = os.environ.get("HARNESS_MODULE_STORE_ENDPOINT", "")
    if not endpoint:
        print("HARNESS_MODULE_STORE_ENDPOINT is not set: run me through the application manager", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    counts = np.zeros(VOCABULARY, dtype=np.int64)
    total = 0
    with ThreadPoolExecutor(max(1, cpus())) as pool:
        for c, n in pool.map(lambda i: fetch_and_count(endpoint, i), range(shards)):
            counts += c
            total += n
    top = np.argsort(counts)[::-1][:5]
    print(f"{total} words in {shards} shards from {endpoint} in {time.perf_counter() - t0:.2f} s; "
          f"top: {', '.join(f'{w}x{counts[w]}' for w in top)}")
    return 0 if counts.sum() == total else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
