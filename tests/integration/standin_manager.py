"""A stand-in IRM process: registers with a CRS, heartbeats, serves one host of a made-up type (`gadget`).

It stands for a manager that hangs or is slow, which a real one cannot be made to do. Knobs (argv[1], JSON):
name, crs (address), port_file (written with its address once serving), type, units (the host's capacity),
hb (heartbeat interval), reserve_delay (s Reserve sleeps before committing, ignoring the deadline: it commits
after the caller gave up), reserve_gate (a path: Reserve waits, as long as it takes, until that file exists before
committing -- a Reserve held in flight until the test lets it go), get_delay (s GetReservation sleeps), release_delay (s ReleaseReservation sleeps before it releases), release_delay_from (the delay from this
ReleaseReservation on, counting from 0: the ones before answer at once; default 0), release_unavailable (ReleaseReservation
answers UNAVAILABLE), watch_error (WatchCapacity fails FAILED_PRECONDITION with this message). It has no ReserveBatch (UNIMPLEMENTED): the CRS sends it one Reserve per request.

`Standin` starts one as its own process and kills it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.tls import plain_channel

_ROOT = Path(__file__).resolve().parents[2]
if __name__ == "__main__":
    sys.path[:0] = [str(_ROOT), str(_ROOT / "gen")]
from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc  # noqa: E402
from services.registration import Membership  # noqa: E402


class Standin:
    """One stand-in manager process, registered with the CRS at `crs`; `kill()` is SIGKILL."""

    def __init__(self, tmp: str, crs: str, name: str, **cfg: object) -> None:
        from tests.conftest import eventually

        self.port_file = os.path.join(str(tmp), f"{name}.port")
        cfg.update(name=name, crs=crs, port_file=self.port_file)
        self.log = open(os.path.join(str(tmp), f"{name}.standin.log"), "w")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen([sys.executable, __file__, json.dumps(cfg)], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.address = eventually(lambda: os.path.exists(self.port_file) and Path(self.port_file).read_text(),
                                  what=f"stand-in {name} serving")
        self.channel = plain_channel(self.address)
        self.stub = irm_pb2_grpc.ResourceManagerStub(self.channel)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.channel.close()
        self.log.close()

    def held(self, tenant: str) -> list[irm_pb2.Reservation]:
        """Its active reservations of `tenant`."""
        return list(self.stub.ListReservations(irm_pb2.ListReservationsRequest(tenant=tenant)).reservations)


@contextlib.contextmanager
def crs_with_a_gated_standin(suite, tmp: Path):  # type: ignore[no-untyped-def]  # noqa: ANN201
    """A CRS (conftest `suite`) and a stand-in manager `slow` whose Reserve waits until the file `gate` exists,
    its one host seen in the CRS: yields (the CRS's ResourceManager stub, gate, the stand-in); the stand-in is
    killed after. The CRS's irm_timeout_s is over the time a test holds a Reserve at the manager."""
    from tests.conftest import eventually

    crs = suite.start("crs", heartbeat_interval_s=0.3, heartbeat_timeout_s=1.5, irm_timeout_s=20.0)
    gate = Path(tmp) / "commit"
    slow = Standin(str(tmp), crs.address, "slow", type="gadget", hb=0.3, reserve_gate=str(gate))
    try:
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
        eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 1,
                   what="the manager's host in the CRS")
        yield stub, gate, slow
    finally:
        slow.kill()


def gadget(name: str = "g", units: float = 1.0, rtype: str = "gadget", count: int = 1) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name=name, resource_type=rtype, count=count,
                                 attributes={"units": common_pb2.AttributeRequest(number=units)})


def log(*a: object) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


class Rm(irm_pb2_grpc.ResourceManagerServicer):
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.name = cfg["name"]
        self.rtype = cfg.get("type", "gadget")
        self.cap = float(cfg.get("units", 100))
        self.lock = threading.Lock()
        self.used = 0.0
        self.gen = 1
        self.by_req: dict[tuple[str, str], irm_pb2.Reservation] = {}
        self.by_id: dict[str, irm_pb2.Reservation] = {}
        self.need: dict[str, float] = {}
        self.releases = 0
        self.subscribers: list[tuple[list, threading.Event]] = []

    def host(self) -> common_pb2.PhysicalResource:
        return common_pb2.PhysicalResource(
            id=f"{self.name}-h1", resource_type=self.rtype, capacity={"units": self.cap}, used={"units": self.used},
            location=common_pb2.Location(site="s", rack="r", host=f"{self.name}-h1"), generation=self.gen)

    def DescribeAllocationSpec(self, request, context):  # noqa: N802
        return irm_pb2.DescribeAllocationSpecResponse(resource_types=[irm_pb2.ResourceTypeSpec(
            name=self.rtype, manager=self.name, attributes=[irm_pb2.AttributeSpec(
                name="units", kind=irm_pb2.AttributeSpec.KIND_NUMBER, unit="u",
                domain=common_pb2.Range(min=0, max=self.cap), consumable=True)])])

    def DiscoverResources(self, request, context):  # noqa: N802
        return irm_pb2.DiscoverResourcesResponse(resources=[self.host()])

    def WatchCapacity(self, request, context):  # noqa: N802
        if self.cfg.get("watch_error"):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(self.cfg["watch_error"]))
        q: list = []
        ev = threading.Event()
        self.subscribers.append((q, ev))
        yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT, resource=self.host())
        yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT_END)
        while context.is_active():
            if ev.wait(0.2):
                ev.clear()
                while q:
                    yield q.pop(0)

    def _publish(self) -> None:
        for q, ev in self.subscribers:
            q.append(irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_UPDATED, resource=self.host()))
            ev.set()

    def QuotePrice(self, request, context):  # noqa: N802
        return irm_pb2.QuotePriceResponse(price_per_minute=0.0, groups=[
            irm_pb2.GroupQuote(name=g.name, manager=self.name) for g in request.groups])

    def Reserve(self, request, context):  # noqa: N802
        log("Reserve", request.request_id)
        key = (request.tenant, request.request_id)
        with self.lock:
            if key in self.by_req:
                return self.by_req[key]
        time.sleep(float(self.cfg.get("reserve_delay", 0)))
        gate = self.cfg.get("reserve_gate")
        while gate and not os.path.exists(str(gate)):
            time.sleep(0.05)
        need = sum(g.attributes["units"].number * g.count for g in request.groups)
        with self.lock:
            if key in self.by_req:
                return self.by_req[key]
            if self.used + need > self.cap + 1e-9:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "no room")
            self.used += need
            self.gen += 1
            rid = f"{self.name}-{uuid.uuid4().hex[:8]}"
            r = irm_pb2.Reservation(id=rid, tenant=request.tenant, request_id=request.request_id,
                                    state=irm_pb2.Reservation.STATE_ACTIVE, created_at=time.time())
            for g in request.groups:
                r.groups.append(irm_pb2.AllocatedGroup(
                    name=g.name, resource_type=g.resource_type, manager=self.name, manager_reservation_id=rid,
                    resources=[irm_pb2.AllocatedResource(id=f"{rid}-{i}", physical_id=f"{self.name}-h1",
                                                         physical_generation=self.gen,
                                                         attributes={"units": g.attributes["units"].number})
                               for i in range(g.count)]))
            self.by_req[key] = self.by_id[rid] = r
            self.need[rid] = need
        log("COMMITTED", request.request_id)
        self._publish()
        return r

    def GetReservation(self, request, context):  # noqa: N802
        log("GetReservation", request.request_id or request.reservation_id)
        time.sleep(float(self.cfg.get("get_delay", 0)))
        with self.lock:
            r = (self.by_req.get((request.tenant, request.request_id)) if request.request_id
                 else self.by_id.get(request.reservation_id))
        if r is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "no such reservation")
        return r

    def ListReservations(self, request, context):  # noqa: N802
        with self.lock:
            rs = [r for r in self.by_id.values() if r.tenant == request.tenant and (
                request.include_released or r.state == irm_pb2.Reservation.STATE_ACTIVE)]
        return irm_pb2.ListReservationsResponse(reservations=rs)

    def ReleaseReservation(self, request, context):  # noqa: N802
        log("ReleaseReservation", request.reservation_id)
        with self.lock:
            self.releases += 1
            nth = self.releases - 1
        if nth >= int(self.cfg.get("release_delay_from", 0)):
            time.sleep(float(self.cfg.get("release_delay", 0)))
        if self.cfg.get("release_unavailable"):
            context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in refuses releases")
        with self.lock:
            r = self.by_id.get(request.reservation_id)
            if r is None:
                context.abort(grpc.StatusCode.NOT_FOUND, "no such reservation")
            if r.state == irm_pb2.Reservation.STATE_ACTIVE:
                r.state = irm_pb2.Reservation.STATE_RELEASED
                self.used -= self.need[r.id]
                self.gen += 1
        self._publish()
        return r


def main() -> None:
    cfg = json.loads(sys.argv[1])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    irm_pb2_grpc.add_ResourceManagerServicer_to_server(Rm(cfg), server)
    hs = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    hs.set("harness.v1.ResourceManager", health_pb2.HealthCheckResponse.SERVING)
    hs.set("", health_pb2.HealthCheckResponse.SERVING)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    addr = f"127.0.0.1:{port}"
    Membership(cfg["crs"], cfg["name"], addr, [cfg.get("type", "gadget")],
               heartbeat_interval_s=float(cfg.get("hb", 0.3))).start()
    # Written whole, then renamed: the test reads the address as soon as the file exists.
    tmp = cfg["port_file"] + ".tmp"
    Path(tmp).write_text(addr)
    os.replace(tmp, cfg["port_file"])
    log("serving", addr)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
