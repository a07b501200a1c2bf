"""Review 19: a compute IRM registering with the CRS again without restarting (a heartbeat lost in a network blip)
keeps what the CRS knows about where its VMs are: a read does not ask it again (here: a read while it is stopped
shows the VMs as known, with no note that it could not be asked). Restarted, it registers as a new instance, and
the next read asks it (stopped again: the read says the addresses are as last known). Real CRS, compute IRM and
agent processes; the compute IRM reaches the CRS through a registry proxy in the test, which records the
registrations and can lose a heartbeat."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from harness.v1 import common_pb2, irm_pb2, irm_pb2_grpc, registry_pb2_grpc
from services.tls import plain_channel
from tests.conftest import eventually, start_again

TENANT = "t"


class _Proxy(registry_pb2_grpc.ManagerRegistryServicer):
    """The CRS's ManagerRegistry, forwarded; each RegisterManager's instance id recorded; `blip()` fails the next
    heartbeat UNAVAILABLE (the manager then registers again)."""

    def __init__(self, crs_address: str) -> None:
        self.channel = plain_channel(crs_address)
        self.stub = registry_pb2_grpc.ManagerRegistryStub(self.channel)
        self.lock = threading.Lock()
        self.ids: list[str] = []
        self._lose = threading.Event()

    @staticmethod
    def _metadata(context) -> list[tuple[str, str]]:  # noqa: ANN001
        return [(k, v) for k, v in context.invocation_metadata()
                if not k.startswith((":", "grpc-")) and k != "user-agent"]

    def registered(self) -> list[str]:
        with self.lock:
            return list(self.ids)

    def blip(self) -> None:
        self._lose.set()

    def RegisterManager(self, request, context):  # noqa: N802, ANN001, ANN201
        reply = self.stub.RegisterManager(request, metadata=self._metadata(context), timeout=5)
        with self.lock:
            self.ids.append(request.instance_id)
        return reply

    def Heartbeat(self, request, context):  # noqa: N802, ANN001, ANN201
        if self._lose.is_set():
            self._lose.clear()
            context.abort(grpc.StatusCode.UNAVAILABLE, "a network blip (the test's proxy)")
        return self.stub.Heartbeat(request, metadata=self._metadata(context), timeout=5)


@pytest.fixture
def proxy_for() -> Iterator:
    started: list[tuple[grpc.Server, _Proxy]] = []

    def make(crs_address: str) -> tuple[str, _Proxy]:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        proxy = _Proxy(crs_address)
        registry_pb2_grpc.add_ManagerRegistryServicer_to_server(proxy, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        started.append((server, proxy))
        return f"127.0.0.1:{port}", proxy

    yield make
    for server, proxy in started:
        server.stop(None)
        proxy.channel.close()


def _addresses(res: irm_pb2.Reservation) -> list[str]:
    return [x.address for g in res.groups for x in g.resources]


def test_a_compute_irm_registering_again_is_not_asked_again_and_one_restarted_is(suite, proxy_for) -> None:
    crs = suite.start("crs", name="crs", heartbeat_interval_s=0.3)
    via, proxy = proxy_for(crs.address)
    settings = dict(crs_address=via, heartbeat_interval_s=0.3)
    compute, agent = suite.compute_and_agent(compute=settings)
    stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
    eventually(lambda: stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources,
               what="the compute IRM's hosts in the CRS")
    res = stub.Reserve(irm_pb2.ReserveRequest(tenant=TENANT, request_id="r1", groups=[irm_pb2.ResourceGroup(
        name="w", resource_type="vm", count=1, attributes={"cores": common_pb2.AttributeRequest(number=1),
                                                           "memory_gb": common_pb2.AttributeRequest(number=0.25)})]),
        timeout=30)
    assert _addresses(res) == [agent.address]

    def read() -> irm_pb2.Reservation:
        return stub.GetReservation(irm_pb2.GetReservationRequest(tenant=TENANT, reservation_id=res.id), timeout=10)

    # A heartbeat lost: the compute IRM registers again, the same process.
    before = proxy.registered()
    assert before and set(before) == {before[0]} and before[0]
    proxy.blip()
    eventually(lambda: len(proxy.registered()) > len(before), what="the compute IRM to register again")
    assert set(proxy.registered()) == {before[0]}
    compute.stop()                                  # a read now that asked it would say it could not
    got = read()
    assert _addresses(got) == [agent.address] and list(got.notes) == []

    # Restarted: a new instance, which may have moved its VMs -- the next read asks it.
    again = start_again(lambda: suite.start("compute", address=compute.address, agent_address=agent.address,
                                            **settings), "the compute IRM")
    eventually(lambda: proxy.registered()[-1] != before[0], what="the restarted compute IRM to register")
    again.stop()
    got = read()
    assert _addresses(got) == [agent.address]
    assert any(n.startswith("compute: the addresses of its resources are as last known") for n in got.notes), \
        got.notes
