"""A CRS quote is what its Reserve charges (review 16): one request on an unchanged capacity view is placed on
the same hosts by QuotePrice and Reserve, even where equally weighed hosts differ in price. In-process CRS and
compute IRM over loopback gRPC."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cross_resource_scheduler import service as crs_mod
from cross_resource_scheduler.service import Crs, CrsConfig
from harness.v1 import common_pb2, irm_pb2
from irm_compute import service as comp_mod
from services import server as srv
from tests.conftest import eventually

# Same shape, same rack, both empty: placement weighs them alike; their frequencies price them apart.
INVENTORY = """hosts:
  - {id: slow, site: s, rack: r1, cores: 16, memory_gb: 64, frequency_ghz: 2.0}
  - {id: fast, site: s, rack: r1, cores: 16, memory_gb: 64, frequency_ghz: 3.6}
"""
GROUP = irm_pb2.ResourceGroup(name="g", resource_type="vm", count=1, attributes={
    "cores": common_pb2.AttributeRequest(number=4), "memory_gb": common_pb2.AttributeRequest(number=8)})


@pytest.fixture
def crs(tmp_path) -> Iterator[Crs]:
    (tmp_path / "hosts.yaml").write_text(INVENTORY)
    a_run = srv.start("127.0.0.1:0", [crs_mod.component(CrsConfig(database=f"sqlite:///{tmp_path}/crs.db",
                                                                  heartbeat_interval_s=0.3))])
    crs: Crs = a_run.components[0].extra["crs"]
    c_run = srv.start("127.0.0.1:0", [comp_mod.component(comp_mod.ComputeConfig(
        database=f"sqlite:///{tmp_path}/compute.db", state_dir=str(tmp_path), crs_address=f"127.0.0.1:{a_run.port}",
        heartbeat_interval_s=0.3, inventory=str(tmp_path / "hosts.yaml")))])

    def synced() -> bool:
        st = crs.registry.get("compute")
        return st is not None and st.up and st.synced.is_set() and bool(st.specs) and len(crs.view.nodes) == 2

    eventually(synced, what="the compute IRM's two hosts in the CRS's view")
    yield crs
    c_run.stop(0)
    a_run.stop(0)


def settled(crs: Crs) -> bool:
    """The CRS's view shows the compute IRM's every host at its latest generation, nothing assumed: no event of
    the last release is still on its way (one would change the view between a quote and the Reserve)."""
    state = crs.registry.get("compute")
    assert state is not None
    hosts = state.stub().DiscoverResources(irm_pb2.DiscoverResourcesRequest(), timeout=5).resources
    return all((n := crs.view.nodes.get(f"compute/{r.id}")) is not None and n.generation == r.generation
               and not any(n.assumed.values()) for r in hosts)


def quote(crs: Crs) -> float:
    return round(crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[GROUP]), None).price_per_minute, 9)


def test_quote_price_is_what_reserve_charges_for_the_same_request_on_an_unchanged_view(crs: Crs) -> None:
    charged = set()
    for i in range(20):
        eventually(lambda: settled(crs), what="the last release in the CRS's view")
        prices = {quote(crs) for _ in range(5)}
        assert len(prices) == 1, prices                     # the same request is quoted alike every time ...
        r = crs.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=f"r{i}", groups=[GROUP]), None)
        assert round(r.price_per_minute, 9) in prices, (i, r.price_per_minute, prices)   # ... and charged that
        charged.add(round(r.price_per_minute, 9))
        crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=r.id), None)
    # Both hosts were used over the rounds: identical requests placed one after another do not all start where the
    # first did (they would scan past every host the earlier ones filled).
    assert len(charged) == 2, charged
