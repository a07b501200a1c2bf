"""The FPGA IRM's Reserve and QuotePrice judge a request as the CRS and the compute IRM do (a tenant's review):
group names unique, traits honoured, constraints refused, what never fits refused as NEVER_FITS before any group
is made, capacity in use said as CAPACITY_IN_USE, a range of devices taken at its smallest whole number, and
empty ids refused as INVALID_ARGUMENT. The Orchestrator runs in-process over two real FPGA-servers of 4 devices."""

from __future__ import annotations

import grpc
import pytest

from harness.v1 import fpga_pb2, irm_pb2, irm_pb2_grpc
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig
from services.errors import (
    CAPACITY_IN_USE,
    MANAGER_UNAVAILABLE,
    NEVER_FITS,
    PIN_REFUSED,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
    error_info,
)
from services.tls import plain_channel
from tests.conftest import eventually
from tests.integration.test_fpga_group_consistency import FAST, held


@pytest.fixture
def servers(suite):
    return {name: suite.start("fpga-server", name=name, **FAST) for name in ("A", "B")}


@pytest.fixture
def orch(servers, db_url):
    o = Orchestrator(OrchestratorConfig(servers=[p.address for p in servers.values()], database=db_url,
                                        autoscaler="none", reconcile_interval_s=0, server_timeout_s=2.0))
    o._discover_servers(strict=True)
    yield o
    o.stop()


def vfpga(name: str = "f", devices: float | None = 1, count: int = 1, *, design: str = "sleep",
          required: tuple[str, ...] = (), forbidden: tuple[str, ...] = (),
          devices_range: tuple[float, float] | None = None) -> irm_pb2.ResourceGroup:
    g = irm_pb2.ResourceGroup(name=name, resource_type="vfpga", count=count, required_traits=list(required),
                              forbidden_traits=list(forbidden))
    g.attributes["design"].text = design
    if devices_range is not None:
        g.attributes["devices"].range.min, g.attributes["devices"].range.max = devices_range
    elif devices is not None:
        g.attributes["devices"].number = devices
    return g


def reserve(orch: Orchestrator, request_id: str, *groups: irm_pb2.ResourceGroup, **more) -> irm_pb2.Reservation:
    return orch.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=request_id, groups=list(groups), **more), None)


def devices_held(servers) -> int:
    return sum(sum(held(p.address).values()) for p in servers.values())


def _without_fft_on(orch: Orchestrator, address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server at `address` read as one without the fft design (every emulated server has every design)."""
    real = orch._stamped_infos

    def trimmed_infos():     # noqa: ANN202
        infos, generations = real()
        for name, info in infos.items():
            if orch.servers[name].address == address:
                trimmed = fpga_pb2.ServerInfo()
                trimmed.CopyFrom(info)
                trimmed.designs[:] = [d for d in info.designs if d != "fft"]
                infos[name] = trimmed
        return infos, generations
    monkeypatch.setattr(orch, "_stamped_infos", trimmed_infos)


def test_two_groups_of_one_name_are_refused_not_given_one_virtual_fpga_twice(orch, servers):
    with pytest.raises(InvalidArgument) as e:
        reserve(orch, "dup", vfpga("f", 2), vfpga("f", 3, design="fft"))
    assert [(v.field, v.description) for v in e.value.violations] == [("groups[1].name",
                                                                        "duplicate group name 'f'")]
    assert orch._find_reservation("t", "dup") is None and devices_held(servers) == 0
    with pytest.raises(InvalidArgument):
        orch.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[vfpga("f"), vfpga("f")]), None)
    made = reserve(orch, "dup", vfpga("f", 2), vfpga("g", 3, design="fft"))
    assert [(g.name, [r.attributes["devices"] for r in g.resources]) for g in made.groups] == [("f", [2]),
                                                                                              ("g", [3])]
    assert devices_held(servers) == 5


@pytest.mark.parametrize("traits", [{"required": ("gpu",)}, {"forbidden": ("fpga",)}, {"forbidden": ("sleep",)}])
def test_traits_no_fpga_server_has_never_fit(orch, servers, traits):
    with pytest.raises(FailedPrecondition) as e:
        reserve(orch, "tr", vfpga(**traits))
    assert e.value.reason == NEVER_FITS and "traits" in str(e.value)
    with pytest.raises(FailedPrecondition) as q:
        orch.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[vfpga(**traits)]), None)
    assert q.value.reason == NEVER_FITS
    assert devices_held(servers) == 0 and orch._find_reservation("t", "tr") is None
    # Traits every server has are met.
    made = reserve(orch, "tr", vfpga(required=("fpga", "sleep"), forbidden=("gpu",)))
    assert made.state == irm_pb2.Reservation.STATE_ACTIVE


def test_a_group_is_made_only_on_the_servers_with_its_traits(orch, servers, monkeypatch):
    # Server B stands for one without the fft design (every emulated server has every design).
    b = servers["B"].address
    _without_fft_on(orch, b, monkeypatch)
    made = reserve(orch, "only-a", vfpga("f", 2, count=2, design="fft", required=("fft",)))
    a = next(name for name, h in orch.servers.items() if h.address == servers["A"].address)
    assert [r.physical_id for r in made.groups[0].resources] == [a, a]
    assert sum(held(servers["A"].address).values()) == 4 and held(b) == {}
    # Four more devices are free, on B alone: not for this group.
    with pytest.raises(ResourceExhausted) as e:
        reserve(orch, "only-a-2", vfpga("g", 1, required=("fft",)))
    assert e.value.reason == CAPACITY_IN_USE and e.value.retry_after_s
    # More than the servers with its traits have at all never fits, though all servers together have 8.
    with pytest.raises(FailedPrecondition) as never:
        reserve(orch, "only-a-3", vfpga("h", 3, count=2, required=("fft",)))
    assert never.value.reason == NEVER_FITS and "with its traits have 4 usable" in str(never.value)
    assert held(b) == {}


def test_constraints_are_refused_not_ignored(orch, servers):
    bad = irm_pb2.GroupConstraint(kind=99, group_a="f", group_b="f")
    with pytest.raises(InvalidArgument) as e:
        reserve(orch, "c", vfpga(), constraints=[bad])
    assert [v.field for v in e.value.violations] == ["constraints"]
    with pytest.raises(InvalidArgument):
        orch.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[vfpga()], constraints=[bad]), None)
    assert devices_held(servers) == 0


def test_more_devices_than_the_servers_have_never_fits_before_any_group_is_made(orch, servers, monkeypatch):
    made: list[str] = []
    real = orch.create_group
    monkeypatch.setattr(orch, "create_group", lambda *a, **k: made.append(a[1]) or real(*a, **k))
    for request_id, groups in (("n1", [vfpga("f", 1, count=9)]), ("n2", [vfpga("f", 3, count=2), vfpga("g", 3)])):
        with pytest.raises(FailedPrecondition) as e:
            reserve(orch, request_id, *groups)
        assert e.value.reason == NEVER_FITS and "8 usable" in str(e.value)
    # A quote judges each group alone (a CRS's unit prices are alternatives): one group of 9 never fits.
    with pytest.raises(FailedPrecondition):
        orch.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[vfpga("f", 1, count=9)]), None)
    assert made == [] and devices_held(servers) == 0


def test_capacity_in_use_is_said_so_with_a_retry_delay_and_nothing_is_made(orch, servers, monkeypatch):
    reserve(orch, "first", vfpga("f", 3, count=2))
    made: list[str] = []
    real = orch.create_group
    monkeypatch.setattr(orch, "create_group", lambda *a, **k: made.append(a[1]) or real(*a, **k))
    with pytest.raises(ResourceExhausted) as e:
        reserve(orch, "second", vfpga("g", 1, count=3))
    assert e.value.reason == CAPACITY_IN_USE and e.value.retry_after_s and "2 of the 8 usable are free" in str(e.value)
    assert made == [] and devices_held(servers) == 6
    # A resize beyond what is free says so too.
    g = orch.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="t", request_id="grp", design="sleep", size=1), None)
    with pytest.raises(ResourceExhausted) as r:
        orch.ResizeGroup(fpga_pb2.ResizeGroupRequest(tenant="t", group_id=g.id, size=4), None)
    assert r.value.reason == CAPACITY_IN_USE and r.value.retry_after_s


@pytest.mark.parametrize(("bounds", "devices"), [((1.0, 1.0), 1), ((1.2, 3.0), 2), ((2.0, 8.0), 2),
                                                 ((0.0, 4.0), 1)])
def test_a_range_of_devices_gets_its_smallest_whole_number(orch, bounds, devices):
    made = reserve(orch, f"r{bounds}", vfpga(devices_range=bounds))
    assert made.groups[0].resources[0].attributes["devices"] == devices


@pytest.mark.parametrize("bounds", [(1.5, 1.9), (3.0, 2.0)])
def test_a_range_with_no_whole_number_of_devices_is_refused(orch, bounds):
    with pytest.raises(InvalidArgument) as e:
        reserve(orch, "bad-range", vfpga(devices_range=bounds))
    assert [v.field for v in e.value.violations] == ["groups[0].attributes[devices].range"]
    g = vfpga(devices=None)
    g.attributes["devices"].range.max = 2
    with pytest.raises(InvalidArgument) as e:
        reserve(orch, "no-min", g)
    assert [v.field for v in e.value.violations] == ["groups[0].attributes[devices].range.min"]


def test_empty_ids_are_invalid_arguments_naming_the_field(orch):
    calls = [
        (lambda: orch.GetReservation(irm_pb2.GetReservationRequest(tenant="t"), None), "reservation_id"),
        (lambda: orch.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id=""), None),
         "reservation_id"),
        (lambda: orch.GetReservation(irm_pb2.GetReservationRequest(tenant="t", request_id=""), None), "request_id"),
        (lambda: orch.GetMetrics(irm_pb2.GetMetricsRequest(tenant="t"), None), "reservation_id"),
        (lambda: orch.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t"), None), "reservation_id"),
        (lambda: orch.GetGroup(fpga_pb2.GetGroupRequest(tenant="t"), None), "group_id"),
        (lambda: orch.DeleteGroup(fpga_pb2.DeleteGroupRequest(tenant="t"), None), "group_id"),
    ]
    g = orch.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="t", request_id="grp", design="sleep", size=1), None)
    calls.append((lambda: orch.DetachClient(fpga_pb2.ClientRequest(tenant="t", group_id=g.id), None), "client_id"))
    for call, field in calls:
        with pytest.raises(InvalidArgument) as e:
            call()
        assert [v.field for v in e.value.violations] == [field]


def test_a_range_of_devices_through_the_crs_is_reserved(suite):
    crs = suite.start("crs", heartbeat_interval_s=0.3)
    server = suite.start("fpga-server", **FAST)
    suite.start("fpga", servers=server.address, crs_address=crs.address, heartbeat_interval_s=0.3)
    c = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: [r.resource_type for r in c.DiscoverResources(irm_pb2.DiscoverResourcesRequest(),
                                                                       timeout=10).resources] == ["vfpga"],
               what="the FPGA-server in the CRS")
    quote = c.QuotePrice(irm_pb2.QuotePriceRequest(tenant="alice", groups=[vfpga(devices_range=(2, 3))]), timeout=30)
    res = c.Reserve(irm_pb2.ReserveRequest(tenant="alice", request_id="rng", groups=[vfpga(devices_range=(2, 3))]),
                    timeout=60)
    assert res.groups[0].resources[0].attributes["devices"] == 2
    assert res.price_per_minute == pytest.approx(quote.price_per_minute) and res.price_per_minute > 0
    # A trait no FPGA-server has: the CRS's own verdict, as before.
    with pytest.raises(grpc.RpcError) as e:
        c.Reserve(irm_pb2.ReserveRequest(tenant="alice", request_id="gpu", groups=[vfpga(required=("gpu",))]),
                  timeout=60)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and error_info(e.value)[0] == NEVER_FITS


def test_a_pinned_request_short_of_devices_is_placed_again_not_never_fits(orch, servers):
    # Pinned groups are a CRS's placement from its view of these servers: where the view is behind (a device
    # blacklisted since), RESOURCE_EXHAUSTED makes it place again; NEVER_FITS would tell the tenant to change it.
    names = sorted(orch.servers)
    for request_id, group in (("p1", vfpga("f", 5, count=2)), ("p2", vfpga("g", 9))):
        group.placement[:] = names[:group.count]
        with pytest.raises(ResourceExhausted) as e:
            reserve(orch, request_id, group)
        assert e.value.reason == CAPACITY_IN_USE and "place again" in str(e.value)
    assert devices_held(servers) == 0


def test_a_pin_on_a_server_without_the_groups_traits_is_pin_refused(orch, servers, monkeypatch):
    _without_fft_on(orch, servers["B"].address, monkeypatch)
    b = next(name for name, h in orch.servers.items() if h.address == servers["B"].address)
    g = vfpga("f", 1, design="fft", required=("fft",))
    g.placement[:] = [b]
    with pytest.raises(FailedPrecondition) as e:
        reserve(orch, "pin", g)
    assert e.value.reason == PIN_REFUSED
    assert (e.value.metadata["group"], e.value.metadata["pin"], e.value.metadata["refused"]) == ("f", b, b)
    assert devices_held(servers) == 0


def test_a_quote_judges_each_group_alone_on_the_last_known_state(orch, servers, monkeypatch):
    orch._server_infos()        # the servers' states, seen once
    monkeypatch.setattr(orch, "_server_infos", lambda: pytest.fail("a quote called the servers"))
    # A CRS asks unit prices of alternatives in one call: three groups of 3 devices on 8 are not one request.
    names = sorted(orch.servers)
    probes = []
    for i, name in enumerate([names[0], names[0], names[1]]):
        g = vfpga(f"k{i}", 3)
        g.placement[:] = [name]
        probes.append(g)
    quote = orch.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=probes), None)
    assert [q.price_per_minute for q in quote.groups] == [pytest.approx(3 * orch.config.price_per_device_minute)] * 3
    with pytest.raises(FailedPrecondition) as e:        # one group alone larger than the servers: never fits
        orch.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[vfpga("big", 3, count=3)]), None)
    assert e.value.reason == NEVER_FITS


def test_short_only_of_a_server_that_does_not_answer_is_unavailable(orch, servers):
    servers["B"].stop()
    for request_id, group in (("u1", vfpga("f", 4, count=2)), ("u2", vfpga("g", required=("gpu",)))):
        with pytest.raises(Unavailable) as e:
            reserve(orch, request_id, group)
        assert e.value.reason == MANAGER_UNAVAILABLE and "1 of the 2 FPGA-servers answer" in str(e.value)
    assert reserve(orch, "u3", vfpga("h", 4)).state == irm_pb2.Reservation.STATE_ACTIVE


def test_get_metrics_honours_since_and_refuses_a_since_that_is_no_time(orch):
    r = reserve(orch, "m", vfpga(devices=1))
    now = orch.clock.now()
    got = orch.GetMetrics(irm_pb2.GetMetricsRequest(tenant="t", reservation_id=r.id, since=now - 60), None)
    assert {s.name for s in got.series} == {"completed", "queued", "busy_device_s"}
    assert all(x.time >= now - 60 for s in got.series for x in s.samples)
    # Samples at or after `since` only: its one sample (the counters now) is before a time to come.
    later = orch.GetMetrics(irm_pb2.GetMetricsRequest(tenant="t", reservation_id=r.id, since=now + 3600), None)
    assert list(later.series) == []
    for bad in (float("nan"), float("inf")):
        with pytest.raises(InvalidArgument) as e:
            orch.GetMetrics(irm_pb2.GetMetricsRequest(tenant="t", reservation_id=r.id, since=bad), None)
        assert [v.field for v in e.value.violations] == ["since"]


def test_unknown_and_overlong_request_ids_are_worded_as_at_the_crs(orch):
    """Review 25: "reservation 'nope' does not exist" for a request id; "required" for one too long."""
    with pytest.raises(NotFound) as e:
        orch.GetReservation(irm_pb2.GetReservationRequest(tenant="t", request_id="nope"), None)
    assert str(e.value) == "no reservation of this tenant has request id 'nope'"
    with pytest.raises(NotFound) as e:
        orch.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id="r-nope"), None)
    assert str(e.value) == "reservation 'r-nope' does not exist"
    with pytest.raises(InvalidArgument) as e:
        reserve(orch, "x" * 129, vfpga())
    assert [(v.field, v.description) for v in e.value.violations] == [
        ("request_id", "at most 128 characters, got 129 (a client-chosen idempotency key of 1-128 characters)")]
    with pytest.raises(InvalidArgument) as e:
        orch.CreateGroup(fpga_pb2.CreateGroupRequest(tenant="t", request_id="g" * 257, design="sleep", size=1), None)
    assert ("request_id", "at most 256 characters, got 257 (a client-chosen idempotency key of 1-256 characters)") in \
        [(v.field, v.description) for v in e.value.violations]
