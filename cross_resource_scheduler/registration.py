"""The CRS's ManagerRegistry service: managers registering (by name, at the address of their ResourceManager
service), heartbeating, and listed. A registration under a name another manager answers at is refused; one that
says a new instance id tells the addresses that the manager's resources may have moved (addresses.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import select

from cross_resource_scheduler.addresses import Addresses
from cross_resource_scheduler.compensation import part_request_ids
from cross_resource_scheduler.models import Compensation, Manager, Reservation
from cross_resource_scheduler.registry import Registry
from cross_resource_scheduler.view import CapacityView
from harness.v1 import irm_pb2, registry_pb2
from services import control, tls
from services.clock import Clock
from services.config import ConfigError, check_address
from services.db import Database
from services.errors import FailedPrecondition, HarnessError, InvalidArgument, NotFound, Violations

# Logged as the CRS service, as before this module was split out of it: log filters select by that name.
log = logging.getLogger("cross_resource_scheduler.service")

# A manager's instance id (RegisterManagerRequest.instance_id), at most this long.
MAX_INSTANCE_ID = 128
# How long a registration waits for the manager already registered under its name to answer a health check.
PROBE_TIMEOUT_S = 1.0


def serving_at(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a manager's ResourceManager answers SERVING at `address` now."""
    # A channel of its own: the shared one may still be backing off from an earlier failure there.
    with tls.open_channel(address) as ch:
        try:
            reply = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service="harness.v1.ResourceManager"), timeout=timeout)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


class Registrations:
    """What the CRS's RegisterManager, Heartbeat and ListManagers do: the managers' rows (`db`), the registry
    following them, their resources' count in `view`, `addresses` told of each registration. `control_token`:
    what a manager must send (services.control); `heartbeat_interval_s`: how often it is told to heartbeat;
    `on_new_instance`: called after a manager registers as a new instance (a CRS tells the CRSs above it)."""

    def __init__(self, db: Database, registry: Registry, view: CapacityView, clock: Clock, addresses: Addresses,
                 control_token: str, heartbeat_interval_s: float,
                 on_new_instance: Callable[[], None] = lambda: None,
                 on_removed: Callable[[str, list], None] = lambda name, gone: None,
                 attempts: Callable[[], int] = lambda: 1) -> None:
        """`on_removed(manager, resources)`: after a manager is deregistered, with the resources the view dropped
        (the CRS tells its watchers they are gone); `attempts()`: the placement attempts a part may have been
        reserved under (compensation.part_request_ids)."""
        self.on_new_instance = on_new_instance
        self.on_removed = on_removed
        self.attempts = attempts
        self._changing = threading.Lock()
        # The last refused registration or heartbeat of each name: (when, address, "CODE: message"). Bounded: the
        # names are the callers'.
        self._refused: dict[str, tuple[float, str, str]] = {}
        self._refused_lock = threading.Lock()
        self.db = db
        self.registry = registry
        self.view = view
        self.clock = clock
        self.addresses = addresses
        self.control_token = control_token
        self.heartbeat_interval_s = heartbeat_interval_s

    def refused(self, name: str, address: str, error: HarnessError) -> None:
        """A registration or heartbeat under `name` refused with `error` (ListManagers says so)."""
        with self._refused_lock:
            if len(self._refused) >= 1000 and name not in self._refused:
                del self._refused[min(self._refused, key=lambda k: self._refused[k][0])]
            self._refused[name[:128]] = (self.clock.now(), address[:256], f"{error.code.name}: {error.message}"[:500])

    def register(self, request, context) -> registry_pb2.RegisterManagerResponse:  # noqa: ANN001
        # One registration or deregistration at a time: a deregistration deciding on the manager registered under a
        # name must not take out one that registered meanwhile (restarted elsewhere, a replacement).
        with self._changing:
            return self._register(request, context)

    def _register(self, request, context) -> registry_pb2.RegisterManagerResponse:  # noqa: ANN001
        # Else anyone reaching the CRS could add a manager (or take a gone one's name) and be sent reservations.
        control.check(self.control_token, context, "the CRS (RegisterManager)")
        v = Violations()
        v.check(bool(request.name) and len(request.name) <= 128, "name", "required, at most 128 characters")
        v.check("/" not in request.name, "name", "must not contain '/'")
        if v.check(bool(request.address), "address", "required: host:port of the manager's ResourceManager service"):
            try:
                check_address(request.address)
                if request.address.rpartition(":")[2].lstrip("0") == "":
                    raise ConfigError("port 0")
            except ConfigError:
                v.add("address", f"{request.address!r} is not HOST:PORT with PORT in 1..65535 (an IPv6 host in "
                                 "brackets, e.g. [::1]:50061): the manager's ResourceManager address")
        v.check(len(request.resource_types) > 0, "resource_types", "at least one resource type")
        v.check(len(request.instance_id) <= MAX_INSTANCE_ID, "instance_id",
                f"at most {MAX_INSTANCE_ID} characters: an id the manager makes once per start")
        v.raise_if_any()
        old = self.registry.get(request.name)
        if old is not None and old.address != request.address and serving_at(old.address):
            # The name is taken by a manager that answers: whoever this is must not take its place (and its
            # tenants' reservations) by saying the name -- also while that one is marked down (a heartbeat gap
            # is not a departure: it still holds its tenants' parts). One that stopped answering has moved
            # (restarted on another port, say) and is let in.
            state = (f"is up at {old.address}" if old.up else
                     f"at {old.address} is marked down (its heartbeats stopped) but still answers there")
            raise FailedPrecondition(f"the manager named {request.name!r} {state}; stop it first (then "
                                     "DeregisterManager, `harness managers deregister`, if it is gone for good), "
                                     "or register under another name")

        def upsert(s):  # type: ignore[no-untyped-def]
            row = s.get(Manager, request.name)
            if row is None:
                s.add(Manager(name=request.name, address=request.address,
                              resource_types=list(request.resource_types), registered_at=self.clock.now()))
            else:
                row.address, row.resource_types = request.address, list(request.resource_types)
        self.db.transact(upsert)
        self.registry.register(request.name, request.address, list(request.resource_types))
        # After the registry has its new address: a read in between asks there, into what this replaces.
        moved = self.addresses.registered(request.name, request.address, request.instance_id)
        log.info("manager registered", extra={"manager": request.name, "address": request.address,
                                              "instance": request.instance_id, "new_instance": moved})
        if moved:
            self.on_new_instance()
        return registry_pb2.RegisterManagerResponse(heartbeat_interval_s=self.heartbeat_interval_s)

    def heartbeat(self, request, context) -> registry_pb2.HeartbeatResponse:  # noqa: ANN001
        # Else anyone could keep a stopped manager "up", and reservations would be sent to it.
        try:
            control.check(self.control_token, context, "the CRS (Heartbeat)")
        except HarnessError as e:
            self.refused(request.name, request.address, e)
            raise
        return registry_pb2.HeartbeatResponse(known=self.registry.heartbeat(request.name, request.address))

    def deregister(self, request, context) -> registry_pb2.DeregisterManagerResponse:  # noqa: ANN001
        """Take a manager out for good: its row, the releases still owed to it, its resources in the view; with
        `abandon_parts`, the parts reservations hold there are given up (each such reservation gets a note)."""
        # Else anyone reaching the CRS could make it forget a manager and the parts its tenants hold there.
        control.check(self.control_token, context, "the CRS (DeregisterManager)")
        name = request.name
        if not name:
            raise InvalidArgument.of("name", "required: the name the manager registered under (ListManagers)")
        with self._changing:
            return self._deregister(name, request.abandon_parts)

    def _deregister(self, name: str, abandon_parts: bool) -> registry_pb2.DeregisterManagerResponse:
        state = self.registry.get(name)
        if state is None:
            known = sorted(m.name for m in self.registry.all())
            raise NotFound(f"no manager named {name!r} is registered here (registered: "
                           f"{', '.join(known) if known else 'none'})")
        if state.up:
            # Heartbeating (or stopped too recently to be marked down): it would register again at once.
            ago = max(0.0, self.clock.now() - state.last_heartbeat)
            raise FailedPrecondition(f"the manager {name!r} is up (it heartbeated {ago:.1f} s ago): stop it, and "
                                     "deregister it once the CRS marks it down (ListManagers, `harness managers`: "
                                     "up false)")
        if serving_at(state.address):
            # Running, it would be told it is unknown at its next heartbeat and register again at once.
            raise FailedPrecondition(f"the manager {name!r} still answers at {state.address}: stop it first, then "
                                     "deregister it (a running manager registers again)")
        now = self.clock.now()
        note = (f"{name}: deregistered by the operator at {now:.0f} with this reservation's parts there; those "
                "parts are gone with it (released at it should it register again), and releasing the reservation "
                "no longer asks it")

        def take_out(s) -> tuple[list[str], int]:  # type: ignore[no-untyped-def]
            holding = [r for r in s.scalars(select(Reservation).where(Reservation.state.in_(("active", "pending"))))
                       if r.allocation and any(g.manager == name for g in
                                               irm_pb2.Reservation.FromString(r.allocation).groups)]
            if holding and not abandon_parts:
                ids = sorted(r.id for r in holding)
                raise FailedPrecondition(
                    f"{len(ids)} reservation(s) hold parts at {name!r} ({', '.join(ids[:5])}"
                    f"{', ...' if len(ids) > 5 else ''}): their tenants release them first, or deregister with "
                    "abandon_parts (`--abandon-parts`) to give those parts up")
            for r in holding:
                r.notes = [*(r.notes or []), note]
                # Owed to it as a released part is: the compensator asks registered managers only, so the rows
                # wait for one registering under this name again (a site back on its old database holds the parts;
                # another one under the name knows none of them: NOT_FOUND, done).
                for g in irm_pb2.Reservation.FromString(r.allocation).groups:
                    if g.manager != name:
                        continue
                    ids = [("", g.manager_reservation_id)] if g.manager_reservation_id else [
                        (rid, "") for rid in part_request_ids(r.id, name, self.attempts())]
                    s.add_all(Compensation(manager=name, tenant=r.tenant, irm_request_id=rid,
                                           irm_reservation_id=irm_id, created_at=now, next_try_at=now)
                              for rid, irm_id in ids)
            row = s.get(Manager, name)
            if row is not None and row.address == state.address:
                s.delete(row)
            s.flush()
            owed = len(list(s.scalars(select(Compensation.id).where(Compensation.manager == name))))
            return sorted(r.id for r in holding), owed
        abandoned, owed = self.db.transact(take_out)
        gone = self.registry.remove(name, expected=state)
        self.addresses.forget(name)
        self.on_removed(name, gone)
        log.warning("manager deregistered", extra={"manager": name, "address": state.address,
                                                   "resources_removed": len(gone), "releases_pending": owed,
                                                   "abandoned_reservations": abandoned})
        return registry_pb2.DeregisterManagerResponse(name=name, resources_removed=len(gone),
                                                      releases_pending=owed, abandoned_reservations=abandoned)

    def managers(self) -> registry_pb2.ListManagersResponse:
        out = []
        with self._refused_lock:
            refused = dict(self._refused)
        for m in self.registry.all():
            count = sum(1 for n in list(self.view.nodes.values()) if n.manager == m.name)
            said = refused.pop(m.name, None)
            out.append(registry_pb2.ManagerInfo(name=m.name, address=m.address, resource_types=m.resource_types,
                                                up=m.up, last_heartbeat=max(m.last_heartbeat, 0.0),
                                                resources=count, follow_error=m.follow_error,
                                                refused=said[2] if said and said[0] > m.last_heartbeat else ""))
        others = sorted(refused.items(), key=lambda kv: -kv[1][0])[:100]
        return registry_pb2.ListManagersResponse(managers=out, refused=[
            registry_pb2.RefusedRegistration(name=name, address=address, refused=why, at=at)
            for name, (at, address, why) in others])
