"""The FPGA IRM's ResourceManager API (irm_fpga.orchestrator): virtual FPGAs (resource type "vfpga") reserved like
any other resource, the CRS's too: each virtual FPGA of a reservation one FPGA group the Orchestrator makes.
"""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING

import grpc
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from harness.v1 import common_pb2, fpga_pb2, irm_pb2
from irm_fpga import designs as design_lib
from irm_fpga.models import Group, Reservation
from irm_fpga.orchestrator_servers import VFPGA, physical, server_traits, usable_devices
from services import control, paging
from services.errors import (
    CAPACITY_IN_USE,
    MANAGER_UNAVAILABLE,
    NEVER_FITS,
    OVER_PRICE,
    PIN_REFUSED,
    RESERVATION_PENDING,
    RETRY_LATER_S,
    Aborted,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    Violations,
    owned,
    require_since,
    require_tenant,
)
from services.idempotency import request_hash, request_id_problem, reservation_key, reused_request_id

if TYPE_CHECKING:
    from irm_fpga.orchestrator import Orchestrator

# A reservation still being made (its groups' devices reconfiguring: seconds) is asked about again after this long.
PENDING_RETRY_S = 1.0
MAX_DEVICES = 4096     # devices per virtual FPGA of a reservation: beyond any cluster this emulates
MAX_RESERVE_REQUEST_ID_CHARS = 128  # Reserve's, as every resource manager's (irm.proto)
# A PIN_REFUSED's metadata values (common.proto: "group", "pin", "refused", a pin and the others a line each), cut
# to fit an ErrorInfo value, as a CRS's are (cross_resource_scheduler.stacking).
REFUSED_BYTES = 240
PRICE_SLACK = 1e-9     # a cap equal to the quote, give or take float rounding, is met (as the compute IRM's)


def _devices(attr: common_pb2.AttributeRequest, path: str, v: Violations) -> int:
    """A group's devices per virtual FPGA: a whole number, or the smallest whole number in a range (irm.proto's
    AttributeRequest.range: the smallest that fits; a CRS passes a tenant's range on as it was asked)."""
    which = attr.WhichOneof("value")
    if which == "range":
        lo, hi = attr.range.min, attr.range.max if attr.range.HasField("max") else math.inf
        if not attr.range.HasField("min") or not math.isfinite(lo):
            v.add(f"{path}.range.min", "a range of devices needs a finite lower bound")
            return 1
        devices = float(max(1, math.ceil(lo - 1e-9)))
        if not devices <= hi:       # NaN too
            v.add(f"{path}.range", f"no whole number of devices from 1 to {MAX_DEVICES} in [{lo:g}, {hi:g}]")
            return 1
    elif which == "number":
        devices = attr.number
    else:
        v.add(path, f"a whole number of devices from 1 to {MAX_DEVICES} (or a range)")
        return 1
    # Finite first: int(inf) raises (it read as INTERNAL).
    if not (math.isfinite(devices) and 1 <= devices <= MAX_DEVICES and devices == int(devices)):
        v.add(path, f"a whole number from 1 to {MAX_DEVICES}, got {devices:g}")
        return 1
    return int(devices)


def _lines(names: list[str], limit: int) -> str:
    """`names` one a line, as many whole lines as fit in `limit` bytes (an ErrorInfo value keeps 256)."""
    out: list[str] = []
    for name in names:
        if len("\n".join([*out, name]).encode()) > limit:
            break
        out.append(name)
    return "\n".join(out)


def _no_constraints(request: irm_pb2.ReserveRequest | irm_pb2.QuotePriceRequest, v: Violations) -> None:
    v.check(len(request.constraints) == 0, "constraints",
            "the FPGA IRM places each virtual FPGA on its own; send constraints between groups to the CRS")


def _pending(request_id: str) -> Aborted:
    return Aborted(f"the reservation with request_id {request_id!r} is being made (its devices reconfigure); ask "
                   "again shortly", reason=RESERVATION_PENDING, retry_after_s=PENDING_RETRY_S)


class VfpgaReservations:
    """The IRM API (the Orchestrator's ResourceManager methods call these), over the Orchestrator's groups
    (`create_group`, `delete`), capacity (`_free_total_capacity`, `_stamped_infos`, `servers`, `ask_all`) and
    WatchCapacity streams (`watchers`): each looked up on it at each use, not copied, since its `servers` map is
    replaced as servers answer and tests replace its methods."""

    def __init__(self, orch: Orchestrator) -> None:
        self.orch = orch
        self.config = orch.config
        self.db = orch.db
        self.clock = orch.clock

    def DescribeAllocationSpec(self, request, context):  # noqa: N802
        total = sum(self.orch._free_total_capacity().values())
        return irm_pb2.DescribeAllocationSpecResponse(resource_types=[irm_pb2.ResourceTypeSpec(
            name=VFPGA, manager=self.config.name,
            description="A virtual FPGA: an FPGA group of devices configured with one design (thesis §3.2).",
            metrics=["completed", "queued", "busy_device_s"],
            attributes=[
                irm_pb2.AttributeSpec(name="devices", kind=irm_pb2.AttributeSpec.KIND_NUMBER, unit="devices",
                                      domain=common_pb2.Range(min=1, max=max(1, total)), consumable=True,
                                      integer=True,
                                      # What _parse takes when a group leaves it out: the CRS counts it too.
                                      default=common_pb2.AttributeRequest(number=1),
                                      description="Devices backing the virtual FPGA (default 1)."),
                irm_pb2.AttributeSpec(name="design", kind=irm_pb2.AttributeSpec.KIND_TEXT,
                                      allowed_values=sorted(design_lib.DESIGNS),
                                      required=True,     # _parse refuses a group without it (no default)
                                      description="The design every device of the group is configured with "
                                                  "(required)."),
            ])])

    def DiscoverResources(self, request, context):  # noqa: N802
        if request.resource_type and request.resource_type != VFPGA:
            return irm_pb2.DiscoverResourcesResponse()
        infos, generations = self.orch._stamped_infos()
        return irm_pb2.DiscoverResourcesResponse(resources=[physical(i, generations[n], self.config)
                                                            for n, i in infos.items()])

    def _parse(self, groups: list[irm_pb2.ResourceGroup],
               violations: Violations | None = None) -> list[tuple[irm_pb2.ResourceGroup, str, int]]:
        """`violations`: problems the caller found in its request already, reported with these."""
        v = Violations() if violations is None else violations
        out = []
        names: set[str] = set()
        v.check(len(groups) > 0, "groups", "at least one group is required")
        for i, g in enumerate(groups):
            p = f"groups[{i}]"
            v.check(bool(g.name) and len(g.name) <= 128, f"{p}.name", "required, at most 128 characters")
            # Each group's virtual FPGAs are made under request ids named by it: a second group of one name would
            # be answered with the first's.
            v.check(g.name not in names, f"{p}.name", f"duplicate group name {g.name!r}")
            names.add(g.name)
            v.check(g.resource_type == VFPGA, f"{p}.resource_type", f"this manager provides {VFPGA!r}")
            v.check(1 <= g.count <= 64, f"{p}.count", "between 1 and 64 virtual FPGAs")
            design = g.attributes["design"].text if "design" in g.attributes else ""
            v.check(design in design_lib.DESIGNS, f"{p}.attributes[design]",
                    f"required: one of {sorted(design_lib.DESIGNS)}")
            devices = _devices(g.attributes["devices"], f"{p}.attributes[devices]", v) if "devices" in g.attributes \
                else 1
            clash = set(g.required_traits) & set(g.forbidden_traits)
            v.check(not clash, f"{p}.forbidden_traits", f"traits both required and forbidden: {sorted(clash)}")
            for key in g.attributes:
                v.check(key in ("design", "devices"), f"{p}.attributes[{key}]", "unknown; use design, devices")
            if g.placement:
                v.check(len(g.placement) == g.count, f"{p}.placement", "one FPGA-server per instance, or none")
                unknown = sorted(set(g.placement) - set(self.orch.servers))
                v.check(not unknown, f"{p}.placement", f"unknown FPGA-server(s) {unknown}; this manager has "
                                                       f"{sorted(self.orch.servers)}")
            out.append((g, design, int(devices)))
        v.raise_if_any()
        return out

    def _servers_for(self, parsed: list[tuple[irm_pb2.ResourceGroup, str, int]], *,
                     reserving: bool) -> list[list[str] | None]:
        """Per group, the FPGA-servers it may be made on (those with its traits; None: any). Refused here, before
        any device is taken: what no set of the servers could hold, even all free (FAILED_PRECONDITION,
        NEVER_FITS); what only the servers that answer cannot hold (UNAVAILABLE: the others' devices are unknown
        now). A request with pinned groups is a CRS's placement from its view of these servers: where that view
        is behind (a device blacklisted since), it is RESOURCE_EXHAUSTED (place again), and a pin on a server
        without the group's traits is PIN_REFUSED (placed again clear of it), never NEVER_FITS, which would reach
        the tenant as "change the request".

        Reserving (`reserving`), the groups are judged together, on the servers' state now, and what the free
        devices cannot hold now is RESOURCE_EXHAUSTED, CAPACITY_IN_USE (making its first groups would cost their
        reconfigurations for nothing). A quote judges each group alone (a CRS asks unit prices of alternatives in
        one call), on the servers' last known state: it calls no server."""
        infos = self.orch._server_infos() if reserving else self.orch._last_known_infos()
        if not infos:
            raise Unavailable("no FPGA-server answers; nothing was reserved, retry", reason=MANAGER_UNAVAILABLE,
                              retry_after_s=PENDING_RETRY_S)
        silent = len(self.config.servers) - len(infos)
        usable = {n: usable_devices(i) for n, i in infos.items()}
        total = sum(usable.values())
        pinned = any(g.placement for g, _, _ in parsed)

        def short(what: str) -> Exception:
            if silent:
                return Unavailable(f"{what}: {len(infos)} of the {len(self.config.servers)} FPGA-servers answer, "
                                   f"with {total} usable devices; nothing was reserved, retry once the others are "
                                   "back",
                                   reason=MANAGER_UNAVAILABLE, retry_after_s=PENDING_RETRY_S)
            if pinned:
                return ResourceExhausted(f"{what}; nothing was reserved: place again (the servers changed since "
                                         "the placement was made)", reason=CAPACITY_IN_USE,
                                         retry_after_s=PENDING_RETRY_S)
            return FailedPrecondition(f"{what}: it never fits as asked; nothing was reserved", reason=NEVER_FITS)

        v = Violations()
        for i, (g, _, devices) in enumerate(parsed):
            v.check(devices <= total, f"groups[{i}].attributes[devices]",
                    f"group {g.name!r} asks for {devices} devices per virtual FPGA; the FPGA-servers have {total} "
                    "usable devices in all")
        if v.items and (silent or pinned):
            raise short(f"{max(n for _, _, n in parsed)} devices per virtual FPGA do not fit")
        v.raise_if_any()
        out: list[list[str] | None] = []
        for g, _, devices in parsed:
            where: list[str] | None = None
            if g.required_traits or g.forbidden_traits:
                required, forbidden = set(g.required_traits), set(g.forbidden_traits)
                where = [n for n, i in infos.items()
                         if required <= set(server_traits(i)) and not forbidden & set(server_traits(i))]
                wrong = sorted({n for n in g.placement if n in infos and n not in where})
                if wrong:
                    raise FailedPrecondition(
                        f"group {g.name!r} is pinned to FPGA-server(s) {wrong} whose traits do not match its "
                        f"required_traits {sorted(required)} and forbidden_traits {sorted(forbidden)}; nothing was "
                        "reserved: place it elsewhere", reason=PIN_REFUSED,
                        metadata={"group": g.name[:REFUSED_BYTES], "pin": wrong[0],
                                  "refused": _lines(wrong, REFUSED_BYTES)})
                if not where:
                    raise short(f"group {g.name!r}: no FPGA-server has the required_traits {sorted(required)} "
                                f"without the forbidden_traits {sorted(forbidden)} (their traits: "
                                f"{sorted({t for i in infos.values() for t in server_traits(i)})})")
            room = sum(usable[n] for n in (where if where is not None else usable))
            if g.count * devices > room:
                raise short(f"group {g.name!r} asks for {g.count} x {devices} devices; the FPGA-servers"
                            f"{' with its traits' if where is not None else ''} have {room} usable")
            out.append(where)
        if not reserving:
            return out
        asked = sum(g.count * devices for g, _, devices in parsed)
        if asked > total:
            raise short(f"the groups ask for {asked} devices in all; the FPGA-servers have {total} usable")
        recorded = self.orch._recorded()
        free = sum(max(0, self.orch._free(i, recorded.get(n, 0))) for n, i in infos.items())
        if asked > free:
            raise ResourceExhausted(f"the groups ask for {asked} devices; {free} of the {total} usable are free "
                                    "now; nothing was reserved, retry later (or ask for fewer)",
                                    reason=CAPACITY_IN_USE, retry_after_s=RETRY_LATER_S)
        return out

    def _group_price(self, count: int, devices: int) -> float:
        """Per minute, for `count` virtual FPGAs of `devices` each: what QuotePrice quotes and Reserve charges."""
        return count * devices * self.config.price_per_device_minute

    def _price(self, parsed: list[tuple[irm_pb2.ResourceGroup, str, int]]) -> float:
        return sum(self._group_price(g.count, n) for g, _, n in parsed)

    def QuotePrice(self, request, context):  # noqa: N802
        require_tenant(request.tenant)
        v = Violations()
        _no_constraints(request, v)
        parsed = self._parse(list(request.groups), v)
        self._servers_for(parsed, reserving=False)     # what Reserve refuses as never fitting
        quotes = [irm_pb2.GroupQuote(name=g.name, manager=self.config.name,
                                     price_per_minute=self._group_price(g.count, n)) for g, _, n in parsed]
        return irm_pb2.QuotePriceResponse(price_per_minute=self._price(parsed), groups=quotes)

    def _reservation(self, r: Reservation) -> irm_pb2.Reservation:
        groups = []
        for entry in r.groups:
            resources = []
            for gid in entry["groups"]:
                with self.db.read() as s:
                    g = s.get(Group, gid)
                if g is None:
                    continue
                resources.append(irm_pb2.AllocatedResource(
                    id=g.id, physical_id=",".join(sorted(g.parts)), address=self._advertised(),
                    attributes={"devices": g.size},
                    location=common_pb2.Location(site=self.config.site, rack=self.config.rack,
                                                 host=",".join(sorted(g.parts))),
                    notes=[f"design {g.design}; attach with harness.v1.FpgaOrchestrator/AttachClient"]))
            groups.append(irm_pb2.AllocatedGroup(name=entry["name"], resource_type=VFPGA, manager=self.config.name,
                                                 manager_reservation_id=r.id, resources=resources,
                                                 price_per_minute=entry.get("price", 0.0)))
        state = {"active": irm_pb2.Reservation.STATE_ACTIVE, "released": irm_pb2.Reservation.STATE_RELEASED
                 }.get(r.state, irm_pb2.Reservation.STATE_FAILED)
        return irm_pb2.Reservation(id=r.id, tenant=r.tenant, request_id=r.request_id, state=state, groups=groups,
                                   price_per_minute=r.price_per_minute, created_at=r.created_at,
                                   released_at=r.released_at)

    def _advertised(self) -> str:
        return self.config.advertise_address or self.orch._bound

    def Reserve(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        if (why := request_id_problem(request.request_id, MAX_RESERVE_REQUEST_ID_CHARS)) is not None:
            raise InvalidArgument.of("request_id", why)
        v = Violations()
        cap = request.max_price_per_minute if request.HasField("max_price_per_minute") else None
        v.check(cap is None or (math.isfinite(cap) and cap >= 0), "max_price_per_minute",
                f"a finite price per minute >= 0 (or leave it unset), got {cap}")
        _no_constraints(request, v)
        parsed = self._parse(list(request.groups), v)
        fingerprint = request_hash(request)
        # A retry of a request already made is answered first, whatever the servers' state (or prices) now.
        existing = self.find_reservation(tenant, request.request_id)
        if existing is not None:
            return self._replayed_reservation(existing, fingerprint)
        # What QuotePrice quotes; refused before anything is claimed, so the request_id stays unused.
        price = self._price(parsed)
        if cap is not None and price > cap + PRICE_SLACK:
            raise FailedPrecondition(
                f"price {price:.4f}/min exceeds max_price_per_minute {cap:.4f}; nothing was reserved: raise the "
                "cap, or ask for fewer or smaller virtual FPGAs (QuotePrice says what a request costs)",
                reason=OVER_PRICE, metadata={"pricePerMinute": f"{price:.4f}", "maxPricePerMinute": f"{cap:.4f}"})
        # Checked here, in this request's terms: create_group would name its own fields (max_size).
        servers = self._servers_for(parsed, reserving=True)
        rid = f"fres-{uuid.uuid4().hex[:16]}"
        claim = dict(id=rid, tenant=tenant, request_id=request.request_id, request_hash=fingerprint, state="pending",
                     price_per_minute=0.0, created_at=self.clock.now(), released_at=0.0, groups=[])
        try:
            # The unique (tenant, request_id) index claims the request before any device is taken.
            self.db.transact(lambda s: s.add(Reservation(**claim)))
        except IntegrityError:
            existing = self.find_reservation(tenant, request.request_id)
            if existing is None:
                raise Aborted("a reservation with this request_id is being made; retry shortly",
                              reason=RESERVATION_PENDING, retry_after_s=PENDING_RETRY_S) from None
            return self._replayed_reservation(existing, fingerprint)
        made: list[Group] = []
        entries = []
        try:
            for (g, design, devices), where in zip(parsed, servers, strict=True):
                ids = []
                for i in range(g.count):
                    pinned = [g.placement[i]] if g.placement else None
                    grp = self.orch.create_group(tenant, f"{rid}/{g.name}/{i}", design, devices, min_size=devices,
                                                 max_size=devices, pinned=pinned, reservation_id=rid, only=where)
                    made.append(grp)
                    ids.append(grp.id)
                entries.append({"name": g.name, "groups": ids, "price": self._group_price(g.count, devices)})
            price = sum(e["price"] for e in entries)

            def activate(s):  # type: ignore[no-untyped-def]
                row = s.get(Reservation, rid)
                row.state, row.price_per_minute, row.groups = "active", price, entries
                return row
            row = self.db.transact(activate)
        except BaseException:
            for grp in made:
                self.orch.delete(grp)
            self.db.transact(lambda s: s.execute(delete(Reservation).where(Reservation.id == rid)))
            raise
        return self._reservation(row)

    def _replayed_reservation(self, existing: Reservation, fingerprint: str) -> irm_pb2.Reservation:
        """The reservation a request_id first made, for a retry that asks for the same (one made before requests
        were hashed is not compared)."""
        if existing.request_hash and existing.request_hash != fingerprint:
            raise reused_request_id()
        if existing.state == "pending":
            raise _pending(existing.request_id)
        return self._reservation(existing)

    def find_reservation(self, tenant: str, request_id: str) -> Reservation | None:
        with self.db.read() as s:
            return s.scalar(select(Reservation).where(Reservation.tenant == tenant,
                                                      Reservation.request_id == request_id))

    def _get_reservation(self, tenant: str, reservation_id: str = "", request_id: str = "") -> Reservation:
        if not (reservation_id or request_id):
            raise InvalidArgument.of("reservation_id", "required: the id Reserve answered with")
        with self.db.read() as s:
            if reservation_id:
                r = s.get(Reservation, reservation_id)
            else:
                r = s.scalar(select(Reservation).where(Reservation.tenant == tenant,
                                                       Reservation.request_id == request_id))
        if r is not None and r.state == "pending" and not reservation_id:
            # By request id: "being made" -- NOT_FOUND would tell a caller in doubt (the CRS's compensator) that
            # nothing is held, while the devices of its groups are still reconfiguring. (Its id is given out by
            # no one yet: by id, it is not found.)
            raise _pending(request_id)
        if r is None or r.state == "pending":
            raise NotFound(f"reservation {reservation_id!r} does not exist" if reservation_id else
                           f"no reservation of this tenant has request id {request_id!r}")    # as the CRS says it
        owned(tenant, r.tenant, f"reservation {r.id!r}")
        return r

    def GetReservation(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        return self._reservation(self._get_reservation(tenant, *reservation_key(request)))

    def ListReservations(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        with self.db.read() as s:
            q = select(Reservation).where(Reservation.tenant == tenant, Reservation.state != "pending")
            if not request.include_released:
                q = q.where(Reservation.state == "active")
            rows, token = paging.page(s, q, [Reservation.created_at, Reservation.id], request.page_size,
                                      request.page_token)
        return irm_pb2.ListReservationsResponse(reservations=[self._reservation(r) for r in rows],
                                                next_page_token=token)

    def ReleaseReservation(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        r = self._get_reservation(tenant, request.reservation_id)
        if r.state == "active":
            for entry in r.groups:
                for gid in entry["groups"]:
                    with self.db.read() as s:
                        g = s.get(Group, gid)
                    if g is not None and not g.deleted:
                        self.orch.delete(g)

            def mark(s):  # type: ignore[no-untyped-def]
                row = s.get(Reservation, r.id)
                row.state, row.released_at = "released", self.clock.now()
                return row
            r = self.db.transact(mark)
        return self._reservation(r)

    def GetMetrics(self, request, context):  # noqa: N802
        tenant = require_tenant(request.tenant)
        since = require_since(request.since)
        r = self._get_reservation(tenant, request.reservation_id)
        ids = {gid for e in r.groups for gid in e["groups"]}
        now = self.clock.now()
        series: list[common_pb2.Series] = []
        if now < since:     # its one sample, the counters now, is before what the caller asks for
            return irm_pb2.GetMetricsResponse(series=series)
        for name, m in self.orch.ask_all(self.orch.servers, "GetMeasurements",
                                         fpga_pb2.GetMeasurementsRequest()).items():
            if isinstance(m, grpc.RpcError):
                continue
            for g in m.groups:  # type: ignore[attr-defined]
                if g.group_id in ids:
                    for metric, value in (("completed", g.completed), ("queued", g.queued),
                                          ("busy_device_s", g.busy_device_s)):
                        series.append(common_pb2.Series(name=metric, resource_id=f"{g.group_id}@{name}",
                                                        samples=[common_pb2.Sample(time=now, value=value)]))
        return irm_pb2.GetMetricsResponse(series=series)

    def WatchCapacity(self, request, context):  # noqa: N802
        # Its caps: a tenant's, or the control plane's for a caller with the control token (services.control).
        who = control.watch_tenant(request.tenant, self.config.control_token, context)

        def snapshot():
            if request.resource_type in ("", VFPGA):
                infos, generations = self.orch._stamped_infos()
                for name, info in infos.items():
                    yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT,
                                                resource=physical(info, generations[name], self.config))
            yield irm_pb2.CapacityEvent(kind=irm_pb2.CapacityEvent.KIND_SNAPSHOT_END)

        yield from self.orch.watchers.stream(snapshot, context.is_active, who)
