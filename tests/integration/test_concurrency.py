"""Many concurrent reservations through two CRSs onto one compute IRM: never overbooked.

Two CRS processes each hold their own (possibly stale) capacity view of the
same IRM, so they race for the same hosts; only the IRM's transactional
check stands between them and double booking. Run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import grpc
import pytest

from harness.v1 import irm_pb2, irm_pb2_grpc
from irm_compute.cost import CostModel
from irm_compute.store import ComputeStore
from services.clock import WallClock
from services.db import Database, default_url
from services.tls import plain_channel
from tests.conftest import eventually
from tests.integration.test_crs_flow import vm_group

SMALL = """
hosts:
  - {id: h1, rack: r1, cores: 8, memory_gb: 16}
  - {id: h2, rack: r1, cores: 8, memory_gb: 16}
  - {id: h3, rack: r2, cores: 4, memory_gb: 32}
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_no_overbooking_under_concurrent_clients(suite, tmp_path, request, backend):
    db_url = request.getfixturevalue("fresh_pg_url") if backend == "postgresql" else default_url(
        tmp_path, "compute-shared")
    inv = tmp_path / "small.yaml"
    inv.write_text(SMALL)
    crs1 = suite.start("crs", name="crs1", database=f"sqlite:///{tmp_path}/crs1.db", heartbeat_interval_s=0.5)
    crs2 = suite.start("crs", name="crs2", database=f"sqlite:///{tmp_path}/crs2.db", heartbeat_interval_s=0.5)
    suite.start("compute", name="compute", crs_address=f"{crs1.address},{crs2.address}", database=db_url,
                inventory=str(inv), heartbeat_interval_s=0.5)
    stubs = [irm_pb2_grpc.ResourceManagerStub(plain_channel(c.address)) for c in (crs1, crs2)]
    for s in stubs:
        eventually(lambda s=s: len(s.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) == 3)

    outcomes: Counter = Counter()
    lock = threading.Lock()
    errors: list[str] = []

    def client(i: int) -> None:
        rng = random.Random(i)
        stub = stubs[i % 2]
        held: list[str] = []
        for n in range(30):
            if held and rng.random() < 0.4:
                stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(
                    tenant=f"t{i}", reservation_id=held.pop(rng.randrange(len(held)))))
                continue
            groups = [vm_group("g", rng.randint(1, 2), rng.choice([1, 2, 3]), rng.choice([1, 2, 4]))]
            try:
                res = stub.Reserve(irm_pb2.ReserveRequest(tenant=f"t{i}", request_id=f"c{i}-{n}", groups=groups),
                                   timeout=60)
                held.append(res.id)
                kind = "ok"
            except grpc.RpcError as e:
                kind = e.code().name
                if e.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED,):
                    with lock:
                        errors.append(f"{e.code().name}: {e.details()}")
            with lock:
                outcomes[kind] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert outcomes["ok"] > 20
    assert outcomes["RESOURCE_EXHAUSTED"] > 0  # the cloud really was full at times: contention happened

    # Independent check on the database: no host holds more than it has, counters match the VMs.
    db = Database(db_url)
    try:
        assert ComputeStore(db, CostModel(), WallClock()).overbooking() == []
    finally:
        db.dispose()
