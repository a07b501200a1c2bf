"""An IRM's membership in the CRS: register, then heartbeat until stopped."""

from __future__ import annotations

import logging
import threading

import grpc

from harness.v1 import registry_pb2, registry_pb2_grpc
from services import client

log = logging.getLogger(__name__)


class Membership:
    def __init__(self, crs_address: str, name: str, address: str, resource_types: list[str],
                 heartbeat_interval_s: float = 2.0) -> None:
        self.crs_address = crs_address
        self.request = registry_pb2.RegisterManagerRequest(name=name, address=address,
                                                           resource_types=resource_types)
        self.interval = heartbeat_interval_s
        self._stop = threading.Event()
        self.registered = threading.Event()
        self._thread = threading.Thread(target=self._run, name="membership", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        stub = registry_pb2_grpc.ManagerRegistryStub(client.channel(self.crs_address))
        known = False
        while not self._stop.is_set():
            try:
                if not known:
                    reply = stub.RegisterManager(self.request, timeout=5)
                    self.interval = min(self.interval, reply.heartbeat_interval_s or self.interval)
                    known = True
                    self.registered.set()
                    log.info("registered with the CRS", extra={"crs": self.crs_address})
                else:
                    known = stub.Heartbeat(registry_pb2.HeartbeatRequest(name=self.request.name), timeout=5).known
                    if not known:
                        log.warning("the CRS forgot us; registering again")
                        continue
            except grpc.RpcError as e:
                if known:
                    log.warning("heartbeat failed", extra={"code": str(e.code())})
                known = False
                self._stop.wait(min(1.0, self.interval))
                continue
            self._stop.wait(self.interval)
