"""A CRS under a CRS (stacking.py): two site CRSs, each over a compute IRM, registered as managers with a CRS
above them. Both compute IRMs name their hosts h1 and h2: the top CRS tells them apart by manager, places across
both sites, pins its choice at the CRS below, which places exactly there; a release at the top goes down to the
hosts. Every service is its own process."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc, registry_pb2, registry_pb2_grpc
from services.errors import NEVER_FITS, PIN_REFUSED, PIN_UNKNOWN, error_info, field_violations
from services.tls import plain_channel
from tests.conftest import eventually, start_again

HB = {"heartbeat_interval_s": 0.3, "heartbeat_timeout_s": 1.5}
# A site policy the CRSs above do not run (tests/crs_plugin_examples.py), the repository's root on the path.
NO_BATCH = dict(filters="traits,properties,capacity,affinity,distance,tests.crs_plugin_examples:NoBatch",
                env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})


def inventory(site: str) -> str:
    return ("hosts:\n"
            f"  - {{id: h1, site: {site}, rack: r1, cores: 4, memory_gb: 8, frequency_ghz: 2.4}}\n"
            f"  - {{id: h2, site: {site}, rack: r1, cores: 4, memory_gb: 8, frequency_ghz: 2.4}}\n")


def vms(name: str, count: int, cores: float = 2, **kw) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=count, attributes={
        "cores": common_pb2.AttributeRequest(number=cores), "memory_gb": common_pb2.AttributeRequest(number=1)}, **kw)


def _stack(suite, tmp_path, **site_a):  # noqa: ANN001, ANN202
    top = suite.start("crs", name="top", database=f"sqlite:///{tmp_path / 'top.db'}", **HB)
    below = {}
    for site in ("a", "b"):
        crs = suite.start("crs", name=f"crs-{site}", crs_address=top.address,
                          database=f"sqlite:///{tmp_path / f'crs-{site}.db'}", **HB, **(site_a if site == "a" else {}))
        inv = tmp_path / f"{site}.yaml"
        inv.write_text(inventory(f"site-{site}"))
        compute = suite.start("compute", name=f"compute-{site}", crs_address=crs.address, inventory=str(inv),
                              heartbeat_interval_s=0.3)
        below[site] = (crs, compute)
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(top.address))
    eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest(tenant="t")).resources) == 4,
               timeout=30, what="the four hosts of both sites offered to the top CRS")
    return top, below, stub


@pytest.fixture
def stack(suite, tmp_path):
    return _stack(suite, tmp_path)


def _compute(proc) -> irm_pb2_grpc.ResourceManagerStub:  # noqa: ANN001
    return irm_pb2_grpc.ResourceManagerStub(plain_channel(proc.address))


def test_a_crs_above_places_across_the_crss_below_and_releases_through_them(stack):
    top, below, stub = stack
    managers = registry_pb2_grpc.ManagerRegistryStub(plain_channel(top.address)).ListManagers(
        registry_pb2.ListManagersRequest()).managers
    assert sorted((m.name, list(m.resource_types)) for m in managers) == [("crs-a", ["vm"]), ("crs-b", ["vm"])]
    offered = {(r.manager, r.id): r for r in stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources}
    # The same host ids at two compute IRMs: told apart by the manager each is offered under.
    assert set(offered) == {(f"crs-{s}", f"compute-{s}/{h}") for s in "ab" for h in ("h1", "h2")}
    assert offered[("crs-b", "compute-b/h1")].location.site == "site-b"

    # Four 2-core VMs on four different hosts: every host of both sites, the two h1s included.
    spread = irm_pb2.GroupConstraint(kind=irm_pb2.GroupConstraint.KIND_DIFFERENT_HOST, group_a="x", group_b="x")
    res = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[vms("x", 4)],
                                              constraints=[spread]), timeout=30)
    assert res.state == irm_pb2.Reservation.STATE_ACTIVE
    on = sorted(r.physical_id for g in res.groups for r in g.resources)
    assert on == ["compute-a/h1", "compute-a/h2", "compute-b/h1", "compute-b/h2"]
    # One part per CRS below, its reservation there.
    parts = {g.manager: g.manager_reservation_id for g in res.groups}
    assert sorted(parts) == ["crs-a", "crs-b"]
    at_hosts = {}
    for site, (crs, compute) in below.items():
        there = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address)).GetReservation(
            irm_pb2.GetReservationRequest(tenant="t", reservation_id=parts[f"crs-{site}"]), timeout=10)
        assert there.state == irm_pb2.Reservation.STATE_ACTIVE
        held = _compute(compute).ListReservations(irm_pb2.ListReservationsRequest(tenant="t"), timeout=10)
        [vm_res] = [r for r in held.reservations if r.state == irm_pb2.Reservation.STATE_ACTIVE]
        assert sorted(r.physical_id for g in vm_res.groups for r in g.resources) == ["h1", "h2"]
        at_hosts[site] = vm_res.id

    # The use shows at the top (the CRSs below pass their managers' changes up).
    def used() -> set[float]:
        return {r.used["cores"] for r in stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources}
    eventually(lambda: used() == {2.0}, what="each host's 2 cores in use, seen at the top")
    # Room for one more 2-core VM per host, but not for a 3-core one anywhere.
    with pytest.raises(grpc.RpcError) as full:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r2", groups=[vms("y", 1, cores=3)]), timeout=30)
    assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

    stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=res.id), timeout=30)
    for site, (_, compute) in below.items():
        held = _compute(compute).GetReservation(irm_pb2.GetReservationRequest(
            tenant="t", reservation_id=at_hosts[site]), timeout=10)
        assert held.state == irm_pb2.Reservation.STATE_RELEASED
    eventually(lambda: used() == {0.0}, what="the hosts free again, seen at the top")


def test_a_crs_places_pinned_instances_where_pinned_or_says_why_not(stack):
    _, below, _ = stack
    crs_a = irm_pb2_grpc.ResourceManagerStub(plain_channel(below["a"][0].address))
    pinned = crs_a.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="p1", groups=[
        vms("x", 2, placement=["compute-a/h2", "compute-a/h2"])]), timeout=30)
    assert [r.physical_id for g in pinned.groups for r in g.resources] == ["h2", "h2"]

    def refusal(request_id: str, group: irm_pb2.ResourceGroup) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as e:
            crs_a.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=request_id, groups=[group]), timeout=30)
        return e.value

    gone = refusal("p2", vms("x", 1, placement=["compute-a/h9"]))
    assert gone.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_info(gone)[0] == PIN_UNKNOWN
    assert "'compute-a/h9'" in gone.details()
    # h2 is full now (2 x 2 of its 4 cores): a pin there is refused, not moved to h1.
    full = refusal("p3", vms("x", 1, placement=["compute-a/h2"]))
    assert full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # ... but priced, as its IRM prices a pinned host (a CRS above asks so for a host of each kind, busy or not),
    # and two instances pinned to h1 priced together even where their sum would not fit.
    quote = crs_a.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[
        vms("q0", 1, placement=["compute-a/h2"]), vms("q1", 1, cores=3, placement=["compute-a/h1"]),
        vms("q2", 1, cores=3, placement=["compute-a/h1"])]), timeout=30)
    prices = {q.name: q.price_per_minute for q in quote.groups}
    assert sorted(prices) == ["q0", "q1", "q2"] and 0 < prices["q0"] < prices["q1"] == prices["q2"]
    too_big = refusal("p4", vms("x", 1, cores=8, placement=["compute-a/h1"]))
    assert too_big.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
    miscounted = refusal("p5", vms("x", 2, placement=["compute-a/h1"]))
    assert miscounted.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [f for f, _ in field_violations(miscounted)] == ["groups[0].placement"]
    bare = refusal("p6", vms("x", 1, placement=["h1"]))
    assert [f for f, _ in field_violations(bare)] == ["groups[0].placement[0]"]
    # A manager may not take the name this CRS has above: its resources would be offered as the CRS's own.
    with pytest.raises(grpc.RpcError) as taken:
        registry_pb2_grpc.ManagerRegistryStub(plain_channel(below["a"][0].address)).RegisterManager(
            registry_pb2.RegisterManagerRequest(name="crs-a", address="127.0.0.1:1", resource_types=["vm"]),
            timeout=10)
    assert taken.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "own name" in taken.value.details()


def test_three_levels_name_a_host_by_each_manager_on_the_way_and_reserve_through_them(suite, tmp_path):
    top = suite.start("crs", name="top", database=f"sqlite:///{tmp_path / 'top.db'}", **HB)
    mid = suite.start("crs", name="mid", crs_address=top.address, database=f"sqlite:///{tmp_path / 'mid.db'}", **HB)
    low = suite.start("crs", name="low", crs_address=mid.address, database=f"sqlite:///{tmp_path / 'low.db'}", **HB,
                      **NO_BATCH)
    inv = tmp_path / "a.yaml"
    inv.write_text(inventory("site-a"))
    compute = suite.start("compute", name="compute-a", crs_address=low.address, inventory=str(inv),
                          heartbeat_interval_s=0.3)
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(top.address))
    eventually(lambda: len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 2, timeout=30,
               what="the two hosts offered up two levels")
    offered = sorted((r.manager, r.id) for r in stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources)
    assert offered == [("mid", "low/compute-a/h1"), ("mid", "low/compute-a/h2")]
    # A quote names the manager the group goes to as the reservation does: the CRS below (not its IRM's name).
    quote = stub.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[vms("x", 1, cores=3)]), timeout=60)
    assert [q.manager for q in quote.groups] == ["mid"]
    res = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[vms("x", 1, cores=3)]),
                       timeout=60)
    [g] = res.groups
    assert g.manager == "mid" and g.resources[0].physical_id in ("low/compute-a/h1", "low/compute-a/h2")
    host = g.resources[0].physical_id.rsplit("/", 1)[1]
    held = _compute(compute).ListReservations(irm_pb2.ListReservationsRequest(tenant="t"), timeout=10)
    [at_host] = [r for r in held.reservations if r.state == irm_pb2.Reservation.STATE_ACTIVE]
    assert [r.physical_id for x in at_host.groups for r in x.resources] == [host]

    def used() -> dict[str, float]:
        return {r.id: r.used["cores"] for r in stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources}
    eventually(lambda: used()[g.resources[0].physical_id] == 3.0, what="the use seen two levels up")
    stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=res.id), timeout=60)
    assert _compute(compute).GetReservation(irm_pb2.GetReservationRequest(
        tenant="t", reservation_id=at_host.id), timeout=10).state == irm_pb2.Reservation.STATE_RELEASED
    eventually(lambda: set(used().values()) == {0.0}, what="the hosts free again, seen two levels up")

    # The lowest takes no batch work: its refusal reaches the top in the top's keys, through the middle (pinned
    # there by the top: not the middle's to place again).
    with pytest.raises(grpc.RpcError) as pinned:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="b1", groups=[
            vms("batch", 1, placement=["mid/low/compute-a/h1"])]), timeout=60)
    reason, meta = error_info(pinned.value)
    assert reason == PIN_REFUSED and meta["pin"] == "mid/low/compute-a/h1"
    assert meta["refused"] == "mid/low/compute-a/h1\nmid/*"
    with pytest.raises(grpc.RpcError) as never:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="b2", groups=[vms("batch", 1)]), timeout=60)
    assert error_info(never.value)[0] == NEVER_FITS and "refused_below removed 2" in never.value.details()


def test_a_vm_s_new_address_after_an_irm_below_restarts_shows_at_the_top(suite, tmp_path):
    top = suite.start("crs", name="top", database=f"sqlite:///{tmp_path / 'top.db'}", **HB)
    below = suite.start("crs", name="crs-a", crs_address=top.address, database=f"sqlite:///{tmp_path / 'a.db'}",
                        **HB)
    settings = dict(name="compute-a", crs_address=below.address, heartbeat_interval_s=0.3)
    compute, agent = suite.compute_and_agent(compute=settings)
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(top.address))
    eventually(lambda: stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources, timeout=30,
               what="the compute IRM's hosts at the top")
    res = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[vms("w", 1, cores=1)]),
                       timeout=30)

    def addresses() -> list[str]:
        got = stub.GetReservation(irm_pb2.GetReservationRequest(tenant="t", reservation_id=res.id), timeout=10)
        return [x.address for g in got.groups for x in g.resources]
    assert addresses() == [agent.address]
    # The VM's agent moves: the compute IRM restarts (a new instance) telling another agent's address.
    moved = suite.start("agent", name="agent2", compute_address=compute.address)
    compute.stop()
    start_again(lambda: suite.start("compute", address=compute.address, agent_address=moved.address, **settings),
                "the compute IRM")
    # The CRS below registers with the top again as a new instance: the top asks it, and it asks its IRM.
    eventually(lambda: addresses() == [moved.address], timeout=30, what="the new address read at the top")


def test_a_manager_joining_a_crs_below_is_described_above(stack, suite, tmp_path):
    top, below, stub = stack
    big = tmp_path / "big.yaml"
    big.write_text("hosts:\n  - {id: big1, site: site-a, rack: r2, cores: 16, memory_gb: 64, frequency_ghz: 3.0}\n")
    # 8 cores: more than any host the top has been described (4): refused there until it learns of the new IRM.
    eight = irm_pb2.ReserveRequest(tenant="t", request_id="big", groups=[vms("x", 1, cores=8)])
    with pytest.raises(grpc.RpcError) as before:
        stub.Reserve(eight, timeout=30)
    assert before.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    suite.start("compute", name="compute-c", crs_address=below["a"][0].address, inventory=str(big),
                heartbeat_interval_s=0.3)

    def reserved() -> irm_pb2.Reservation | None:
        try:
            return stub.Reserve(eight, timeout=30)
        except grpc.RpcError as e:
            assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED), e
            return None
    res = eventually(reserved, timeout=30, what="the new IRM's 16-core host placeable from the top")
    assert [r.physical_id for g in res.groups for r in g.resources] == ["compute-c/big1"]


def test_a_group_a_crs_below_refuses_is_placed_again_clear_of_what_it_refused(suite, tmp_path):
    # Site a takes no batch work (a filter the top does not run): what the top puts there comes back refused,
    # naming every host of site a, and the top places it again on site b.
    top, below, stub = _stack(suite, tmp_path, **NO_BATCH)
    warm = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="warm", groups=[
        vms("warm", 2, cores=1, placement=["crs-a/compute-a/h1", "crs-a/compute-a/h2"])]), timeout=30)

    def used() -> dict[str, float]:
        return {r.id: r.used["cores"] for r in stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources}
    eventually(lambda: used() == {"compute-a/h1": 1.0, "compute-a/h2": 1.0, "compute-b/h1": 0.0,
                                  "compute-b/h2": 0.0}, what="site a's hosts in use at the top")
    # The pack weigher sends the batch to the fuller hosts, site a's, first.
    res = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="b1", groups=[vms("batch", 2)]), timeout=30)
    on = [r.physical_id for g in res.groups for r in g.resources]
    assert len(on) == 2 and set(on) <= {"compute-b/h1", "compute-b/h2"}
    assert {g.manager for g in res.groups} == {"crs-b"}
    assert any("a CRS below refused" in line for line in top.log_tail)
    stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=res.id), timeout=30)

    # Pinned at the top by its tenant: the refusal is the tenant's, in the top's keys, naming site a's hosts.
    with pytest.raises(grpc.RpcError) as pinned:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="b2", groups=[
            vms("batch", 1, placement=["crs-a/compute-a/h2"])]), timeout=30)
    assert pinned.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    reason, meta = error_info(pinned.value)
    assert reason == PIN_REFUSED and meta["pin"] == "crs-a/compute-a/h2" and meta["group"] == "batch"
    assert meta["refused"] == "crs-a/compute-a/h2\ncrs-a/*"      # the pin, then all of crs-a's vm resources
    assert "no_batch" in pinned.value.details()
    # A quote is refused alike there (it would price what Reserve cannot take), and placed clear of site a when
    # not pinned: priced, as Reserve then takes it.
    with pytest.raises(grpc.RpcError) as quoted:
        stub.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[
            vms("batch", 1, placement=["crs-a/compute-a/h2"])]), timeout=30)
    assert error_info(quoted.value)[0] == PIN_REFUSED
    assert stub.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[vms("batch", 2)]),
                           timeout=30).price_per_minute > 0

    # Three 3-core VMs: site b holds two; what the top offers site a is refused; it never fits as the sites are.
    with pytest.raises(grpc.RpcError) as never:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="b3", groups=[vms("batch", 3, cores=3)]),
                     timeout=30)
    assert never.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(never.value)[0] == NEVER_FITS and "refused_below removed" in never.value.details()
    # Nothing was left held: site b is free, site a holds only the warm VMs.
    eventually(lambda: used() == {"compute-a/h1": 1.0, "compute-a/h2": 1.0, "compute-b/h1": 0.0,
                                  "compute-b/h2": 0.0}, what="only the warm VMs held")
    # Other groups still go to site a: two 3-core VMs pinned there by the tenant are taken.
    other = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="o1", groups=[
        vms("web", 2, cores=3, placement=["crs-b/compute-b/h1", "crs-a/compute-a/h1"])]), timeout=30)
    assert sorted(r.physical_id for g in other.groups for r in g.resources) == ["compute-a/h1", "compute-b/h1"]
    assert warm.state == irm_pb2.Reservation.STATE_ACTIVE


def test_an_irm_below_restarted_on_a_fresh_database_shows_its_hosts_free_at_the_top(suite, tmp_path):
    # Its generations start again from 1: the CRS below takes its new snapshot as its state now, and the top must
    # too, though every generation it hears is older than those it holds (within the heartbeat timeout: never down).
    top = suite.start("crs", name="top", database=f"sqlite:///{tmp_path / 'top.db'}", **HB)
    below = suite.start("crs", name="crs-a", crs_address=top.address, database=f"sqlite:///{tmp_path / 'a.db'}",
                        heartbeat_interval_s=0.3, heartbeat_timeout_s=30.0)
    inv = tmp_path / "a.yaml"
    inv.write_text(inventory("site-a"))
    settings = dict(name="compute-a", crs_address=below.address, inventory=str(inv), heartbeat_interval_s=0.3)
    compute = suite.start("compute", database=f"sqlite:///{tmp_path / 'compute-1.db'}", **settings)
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(top.address))

    def used() -> dict[str, float]:
        return {r.id: r.used["cores"] for r in stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources}
    eventually(lambda: len(used()) == 2, timeout=30, what="the two hosts at the top")
    # Generations go up with each reservation and release.
    for i in range(3):
        res = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=f"r{i}", groups=[vms("x", 2, cores=3)]),
                           timeout=30)
        if i < 2:
            stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=res.id),
                                    timeout=30)
    eventually(lambda: used() == {"compute-a/h1": 3.0, "compute-a/h2": 3.0}, what="both hosts in use at the top")
    compute.stop()
    start_again(lambda: suite.start("compute", address=compute.address,
                                    database=f"sqlite:///{tmp_path / 'compute-2.db'}", **settings), "the compute IRM")
    eventually(lambda: used() == {"compute-a/h1": 0.0, "compute-a/h2": 0.0}, timeout=30,
               what="the fresh IRM's free hosts at the top")


def test_an_irm_down_below_a_live_crs_is_retry_later_at_the_top_not_never_fits(suite, tmp_path):
    # The CRS below removed a down manager's resources from its stream: the top, its CRS below up, proved "never
    # fits" on what was left and told the tenant to change a request that fits (a multi-site operator's review).
    from services.errors import MANAGER_DOWN

    top, below, stub = _stack(suite, tmp_path)
    spread = irm_pb2.GroupConstraint(kind=irm_pb2.GroupConstraint.KIND_DIFFERENT_HOST, group_a="x", group_b="x")
    four = irm_pb2.ReserveRequest(tenant="t", request_id="four", groups=[vms("x", 4)], constraints=[spread])
    crs_a, compute_a = below["a"]
    compute_a.kill()                                           # compute-a down; crs-a lives on
    eventually(lambda: "compute-a/h1" not in {r.id for r in stub.DiscoverResources(
        irm_pb2.DiscoverResourcesRequest()).resources}, timeout=30, what="the top to take compute-a's hosts out")
    with pytest.raises(grpc.RpcError) as e:
        stub.Reserve(four, timeout=30)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value.details()
    reason, meta = error_info(e.value)
    assert reason == MANAGER_DOWN and meta["manager"] == "crs-a/compute-a", meta
    # A pin to one of its hosts: its manager below is down (not "unknown").
    pinned = irm_pb2.ReserveRequest(tenant="t", request_id="pin", groups=[vms("y", 1, placement=["crs-a/compute-a/h1"])])
    with pytest.raises(grpc.RpcError) as e:
        stub.Reserve(pinned, timeout=30)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE and error_info(e.value)[0] == MANAGER_DOWN
    # What site b holds alone is placed meanwhile, and once compute-a is back the four fit again.
    two = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="two", groups=[vms("z", 2)],
                                              constraints=[irm_pb2.GroupConstraint(
                                                  kind=irm_pb2.GroupConstraint.KIND_DIFFERENT_HOST,
                                                  group_a="z", group_b="z")]), timeout=30)
    assert {r.physical_id.split("/")[0] for g in two.groups for r in g.resources} == {"compute-b"}
    stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=two.id), timeout=30)
    start_again(lambda: suite.start("compute", name="compute-a", address=compute_a.address,
                                    crs_address=crs_a.address, inventory=str(tmp_path / "a.yaml"),
                                    heartbeat_interval_s=0.3), "compute-a")
    def placed() -> bool:
        try:
            return stub.Reserve(four, timeout=30).state == irm_pb2.Reservation.STATE_ACTIVE
        except grpc.RpcError as e:        # still down at the top, until compute-a's heartbeat reaches it
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e.details()
            return False
    eventually(placed, timeout=30, what="the four VMs placed once compute-a is back")
