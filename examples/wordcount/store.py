"""The `Store` module of the word-count example: a service the application needs.

It serves shards of a synthetic corpus over HTTP: GET /shard/<i> returns shard i as
little-endian uint32 word ids (Zipf-distributed, deterministic per shard) with its word
count in `X-Words`. It binds a free loopback port and says it is ready, and where, with the
line `HARNESS_READY <host:port>` (application_manager.manifest); the main module finds it
in `HARNESS_MODULE_STORE_ENDPOINT`.

    python store.py [WORDS_PER_SHARD]
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

VOCABULARY = 50_000


def shard(i: int, words: int) -> np.ndarray:
    ids = np.random.default_rng(1_000 + i).zipf(1.3, size=words)
    return (ids % VOCABULARY).astype("<u4")


def main(argv: list[str]) -> int:
    words = int(argv[0]) if argv else 200_000

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            parts = self.path.strip("/").split("/")
            if len(parts) != 2 or parts[0] != "shard" or not parts[1].isdigit():
                self.send_error(404, "GET /shard/<i>")
                return
            body = shard(int(parts[1]), words).tobytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("X-Words", str(words))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    host, port = server.server_address[:2]
    print(f"HARNESS_READY {host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
