"""Through gRPC, a real CRS and compute IRM: a constrained request the greedy can corner is reserved on an
empty cloud every time, and a max price steers placement to cheaper hosts before it refuses."""

from __future__ import annotations

import grpc

from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc
from irm_compute.cost import CostModel
from services.tls import plain_channel
from tests.conftest import eventually

CORNER = """
hosts:
  - {id: big1, site: s, rack: r1, cores: 8, memory_gb: 32}
  - {id: small1, site: s, rack: r1, cores: 2, memory_gb: 32}
  - {id: big2, site: s, rack: r2, cores: 8, memory_gb: 32}
  - {id: big3, site: s, rack: r2, cores: 8, memory_gb: 32}
  - {id: small2a, site: s, rack: r2, cores: 2, memory_gb: 32}
  - {id: small2b, site: s, rack: r2, cores: 2, memory_gb: 32}
"""


def vm(name: str, count: int, cores: float, memory: float) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=count, attributes={
        "cores": common_pb2.AttributeRequest(number=cores), "memory_gb": common_pb2.AttributeRequest(number=memory)})


def _resources(stub: irm_pb2_grpc.ResourceManagerStub) -> list:
    return list(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources)


def test_a_cornering_request_is_reserved_on_an_empty_cloud_every_time(suite, tmp_path) -> None:
    crs = suite.start("crs", heartbeat_interval_s=0.3, heartbeat_timeout_s=1.5)
    inv = tmp_path / "i.yaml"
    inv.write_text(CORNER)
    suite.start("compute", name="c", crs_address=crs.address, heartbeat_interval_s=0.3, inventory=str(inv))
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: len(_resources(stub)) == 6)
    constraints = [irm_pb2.GroupConstraint(expression=e)
                   for e in ("hops(a, b) <= 2", "different_host(a, a)", "different_host(b, b)")]
    for i in range(15):
        r = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=f"q{i}", constraints=constraints,
                                                groups=[vm("a", 2, 2, 1), vm("b", 2, 8, 1)]), timeout=30)
        assert sorted(x.physical_id for g in r.groups if g.name == "b" for x in g.resources) == ["big2", "big3"]
        stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=r.id))
        eventually(lambda: all(h.used["cores"] == 0 for h in _resources(stub)))


def test_a_max_price_picks_cheaper_hosts_before_refusing(suite) -> None:
    crs = suite.start("crs", heartbeat_interval_s=0.3, heartbeat_timeout_s=1.5)
    suite.start("compute", name="compute-a", crs_address=crs.address, heartbeat_interval_s=0.3)
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: len(_resources(stub)) == 6)
    cost = CostModel()
    cheapest, dearest = cost.price_per_minute(4, 8, 2.0), cost.price_per_minute(4, 8, 3.0)
    cap = (cheapest + dearest) / 2  # the pack weigher alone picks a dearer host than this
    r = stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="cheap", groups=[vm("g", 1, 4, 8)],
                                            max_price_per_minute=cap), timeout=30)
    assert r.price_per_minute <= cap + 1e-9
    # Under the cheapest host's price it is refused, saying so.
    try:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="too-cheap", groups=[vm("g", 1, 4, 8)],
                                            max_price_per_minute=cheapest / 2), timeout=30)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "the cheapest placement found is quoted" in e.details()
    else:
        raise AssertionError("a cap under every host's price was not refused")
