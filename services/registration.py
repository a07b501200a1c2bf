"""An IRM's membership in the CRS: register, then heartbeat until stopped."""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable

import grpc

from harness.v1 import registry_pb2, registry_pb2_grpc
from services import client, control

log = logging.getLogger(__name__)

# Heartbeats at most this often, whatever interval the CRS asks for (a zero or negative one would spin), and at
# least this rarely (a huge one would have the CRS take us for down).
MIN_INTERVAL_S = 0.05
MAX_INTERVAL_S = 60.0
# A registration that keeps failing is logged once, then at most this often.
WARN_EVERY_S = 30.0


def sane_interval(value: float, fallback: float = 2.0) -> float:
    """`value` within MIN_INTERVAL_S..MAX_INTERVAL_S (`fallback` if it is not a number)."""
    if not math.isfinite(value):
        value = fallback
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, value))


class Membership:
    """The manager `name` (its ResourceManager at `address`) registered with the CRS at `crs_address`, and kept so
    by heartbeats until stop(); registering again whenever the CRS does not know it (it missed heartbeats, a call
    failed).

    Each registration says `instance_id`: by default a random id of this Membership, made when the manager starts
    (it makes one Membership per CRS as it starts, and a manager restarted -- a new process, or a new component in
    this one -- makes new ones), and the same in all its registrations. The CRS keeps what it learned from the
    manager about where its resources are while the id stays the same, and asks again once it changes (a restart
    may have moved them). `instance_id` given is sent instead (it must change whenever the manager restarts)."""

    def __init__(self, crs_address: str, name: str, address: str,
                 resource_types: list[str] | Callable[[], list[str]],
                 heartbeat_interval_s: float = 2.0, control_token: str = "", instance_id: str = "") -> None:
        self.crs_address = crs_address
        self.control_token = control_token
        self.instance_id = instance_id or uuid.uuid4().hex
        # A function: asked at each registration (a CRS registering with one above offers what its managers do).
        self._types = resource_types if callable(resource_types) else (lambda: list(resource_types))
        self.request = registry_pb2.RegisterManagerRequest(name=name, address=address,
                                                           instance_id=self.instance_id)
        self.interval = sane_interval(heartbeat_interval_s)
        self._stop = threading.Event()
        self._renew = threading.Event()
        self.registered = threading.Event()
        self._thread = threading.Thread(target=self._run, name="membership", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def renew(self) -> None:
        """Register again soon (at the next heartbeat), as a new instance: what the CRS learned of where this
        manager's resources are may be out of date (a CRS below whose own manager restarted), and the types it
        offers may have changed."""
        self._renew.set()

    def _run(self) -> None:
        stub = registry_pb2_grpc.ManagerRegistryStub(control.channel(client.channel(self.crs_address),
                                                                     self.control_token))
        known = False
        failing_since: float | None = None     # first registration failing since then
        warned = -math.inf
        while not self._stop.is_set():
            if self._renew.is_set():
                self._renew.clear()
                self.instance_id = self.request.instance_id = uuid.uuid4().hex
                known = False
            try:
                if not known:
                    types = self._types()
                    if not types:       # a CRS with no manager yet: it registers once it offers something
                        self._stop.wait(min(1.0, self.interval))
                        continue
                    del self.request.resource_types[:]
                    self.request.resource_types.extend(types)
                    reply = stub.RegisterManager(self.request, timeout=5)
                    asked = reply.heartbeat_interval_s or self.interval
                    self.interval = sane_interval(min(self.interval, asked), self.interval)
                    known = True
                    failing_since, warned = None, -math.inf
                    self.registered.set()
                    log.info("registered with the CRS", extra={"crs": self.crs_address})
                else:
                    known = stub.Heartbeat(registry_pb2.HeartbeatRequest(
                        name=self.request.name, address=self.request.address), timeout=5).known
                    if not known:
                        log.warning("the CRS forgot us; registering again")
                        continue
            except grpc.RpcError as e:
                now = time.monotonic()
                if known:
                    log.warning("heartbeat failed", extra={"code": str(e.code())})
                elif failing_since is None:
                    failing_since = now
                if not known and now - warned >= WARN_EVERY_S:
                    warned = now
                    hint = ("set this manager's control_token to the CRS's (HARNESS_CONTROL_TOKEN in compose)"
                            if e.code() == grpc.StatusCode.UNAUTHENTICATED else "")
                    log.warning("cannot register with the CRS; retrying", extra={
                        "crs": self.crs_address, "code": str(e.code()), "details": e.details() or "",
                        "failing_for_s": round(now - failing_since, 1), **({"fix": hint} if hint else {})})
                known = False
                self._stop.wait(min(1.0, self.interval))
                continue
            self._stop.wait(self.interval)
