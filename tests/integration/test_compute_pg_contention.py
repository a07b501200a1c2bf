"""The compute IRM on PostgreSQL under concurrent writers (a load review): every unpinned VM goes to the same
fullest host, and reservations of several VMs, their retries and their releases take host rows in different
orders. With the IRM's writers taking turns (services.db.Database one_writer) none waits on another's row lock:
no deadlock for PostgreSQL to break (each cost `deadlock_timeout`; 30 writers took a minute, and one left after
the retries was INTERNAL), and every call answers."""

from __future__ import annotations

import threading
from pathlib import Path

from harness.v1 import common_pb2, irm_pb2
from irm_compute.service import ComputeConfig, ComputeIrm

INVENTORY = "generate:\n  - {count: 40, prefix: h, sites: 1, racks_per_site: 2, cores: 4, memory_gb: 8, frequency_ghz: 2.4}\n"
THREADS, ROUNDS = 12, 6


def _request(tenant: str, rid: str) -> irm_pb2.ReserveRequest:
    return irm_pb2.ReserveRequest(tenant=tenant, request_id=rid, groups=[irm_pb2.ResourceGroup(
        name="g", resource_type="vm", count=3, attributes={
            "cores": common_pb2.AttributeRequest(number=1), "memory_gb": common_pb2.AttributeRequest(number=1)})])


def test_concurrent_reserves_retries_and_releases_on_postgresql_never_deadlock(tmp_path: Path,
                                                                               fresh_pg_url: str) -> None:
    (tmp_path / "hosts.yaml").write_text(INVENTORY)
    irm = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml"),
                                   database=fresh_pg_url))
    failures: list[BaseException] = []
    made: list[str] = []
    lock = threading.Lock()
    go = threading.Barrier(THREADS)

    def work(i: int) -> None:
        try:
            go.wait()
            for r in range(ROUNDS):
                # Pairs of threads share a request id: one's retry races the other's release.
                req = _request(f"t{i // 2}", f"r{r}")
                res = irm.Reserve(req, None)
                again = irm.Reserve(req, None)
                assert again.id == res.id
                irm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=req.tenant,
                                                                         reservation_id=res.id), None)
                with lock:
                    made.append(res.id)
        except BaseException as e:  # noqa: BLE001 - reported below
            with lock:
                failures.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert failures == []
        assert len(made) == THREADS * ROUNDS
        assert irm.db.conflicts == 0                    # no deadlock, no serialisation failure, not even retried
        assert all(h.used_cores == 0 and h.used_memory_mb == 0 for h in irm.store.hosts())
    finally:
        irm.watchers.close()
        irm.db.dispose()
