"""The compute IRM (review 16): an inventory of non-finite numbers is refused in one line, and GetVm, which each
agent calls every few seconds per VM, writes only the first time an agent sees a VM."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.v1 import common_pb2, compute_pb2, irm_pb2
from irm_compute import inventory as inv
from irm_compute.inventory import InventoryError
from irm_compute.service import ComputeConfig, ComputeIrm

# -- item 6: non-finite numbers in the inventory ---------------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [
    ("memory_gb", float("inf")), ("memory_gb", float("nan")), ("cores", float("inf")), ("cores", float("nan")),
    ("frequency_ghz", float("nan")), ("frequency_ghz", float("inf")), ("frequency_ghz", "nan"),
])
def test_a_host_of_a_non_finite_number_is_refused_naming_it(key: str, value: object) -> None:
    host = {"id": "h1", "cores": 4, "memory_gb": 8, "frequency_ghz": 2.2, key: value}
    with pytest.raises(InventoryError) as e:
        inv.from_dict({"hosts": [host]})
    assert str(e.value) == f"inventory: hosts[0]: {key} must be a finite number, got {value!r}"


def test_a_host_larger_than_the_database_counts_is_refused() -> None:
    with pytest.raises(InventoryError, match=r"hosts\[0\]: at most 2147483647 cores"):
        inv.from_dict({"hosts": [{"id": "h1", "cores": 4, "memory_gb": 1e300}]})
    with pytest.raises(InventoryError, match=r"generate\[0\]: count, sites and racks_per_site must be integers"):
        inv.from_dict({"generate": [{"count": float("inf"), "cores": 4, "memory_gb": 8}]})


def test_serve_compute_with_an_infinite_memory_host_exits_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "hosts.yaml").write_text("hosts:\n  - {id: h1, cores: 4, memory_gb: .inf}\n")
    out = subprocess.run([sys.executable, "-m", "services.cli", "serve", "compute", "--address", "127.0.0.1:0",
                          "--set", f"state_dir={tmp_path}", "--set", f"inventory={tmp_path / 'hosts.yaml'}"],
                         capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert "hosts[0]: memory_gb must be a finite number, got inf" in out.stderr
    assert not list(tmp_path.glob("*.db")), "a database was made for an inventory that was refused"


def test_serve_compute_with_a_missing_inventory_makes_no_database(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "services.cli", "serve", "compute", "--address", "127.0.0.1:0",
                          "--set", f"state_dir={tmp_path}", "--set", f"inventory={tmp_path / 'nope.yaml'}"],
                         capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert out.returncode == 2 and "nope.yaml" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not list(tmp_path.glob("*.db"))


# -- item 7: GetVm writes once ---------------------------------------------------------------------------------

@pytest.fixture
def irm(tmp_path: Path) -> Iterator[ComputeIrm]:
    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n  - {id: h1, site: s, rack: r, cores: 4, memory_gb: 8, agent: '127.0.0.1:1'}\n")
    c = ComputeIrm(ComputeConfig(state_dir=str(tmp_path), inventory=str(tmp_path / "hosts.yaml")))
    yield c
    c.watchers.close()
    c.db.dispose()


def test_get_vm_writes_only_when_an_agent_first_sees_the_vm(irm: ComputeIrm, monkeypatch) -> None:
    r = irm.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="r1", groups=[irm_pb2.ResourceGroup(
        name="g", resource_type="vm", count=1, attributes={"cores": common_pb2.AttributeRequest(number=1),
                                                           "memory_gb": common_pb2.AttributeRequest(number=1)})]),
        None)
    vm_id = r.groups[0].resources[0].id
    writes: list[str] = []
    for name in ("run", "execute", "transact"):
        real = getattr(irm.db, name)
        monkeypatch.setattr(irm.db, name, lambda *a, real=real, name=name, **kw: writes.append(name) or real(*a, **kw))

    def get_vm() -> int:
        return irm.GetVm(compute_pb2.GetVmRequest(vm_id=vm_id), None).state

    assert get_vm() == compute_pb2.Vm.STATE_ACTIVE and len(writes) == 1       # the agent sees it: marked
    for _ in range(3):
        assert get_vm() == compute_pb2.Vm.STATE_ACTIVE                         # re-confirmed: nothing written
    assert len(writes) == 1, writes
    irm.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant="t", reservation_id=r.id), None)
    assert irm._release_queue.get(timeout=5) == ("127.0.0.1:1", vm_id)         # seen: its agent is told
    assert get_vm() == compute_pb2.Vm.STATE_RELEASED
