"""The CRS and the compute IRM agree on whether VMs fit a host's memory.

The CRS sums memory_gb as asked (floats) against a host's capacity (the IRM's whole MiB / 1024); the compute
IRM stores each VM in whole MiB (irm_compute.shapes.whole_mib). Whatever the CRS's capacity filter lets onto a
host, the IRM's MiB must fit too, or the IRM refuses the CRS's placement every time it is made.
"""

from __future__ import annotations

import math

import pytest

from cross_resource_scheduler.plugins import CapacityFilter, Context, GroupDemand
from cross_resource_scheduler.topology import TopologyModel
from cross_resource_scheduler.view import CapacityView
from harness.v1 import common_pb2, irm_pb2
from irm_compute.shapes import parse_groups
from services.errors import Violations


def crs_fits(host_mib: int, memory_gb: float, count: int) -> bool:
    """Whether the CRS's capacity filter lets `count` VMs of `memory_gb` onto one empty host of `host_mib`."""
    view = CapacityView()
    view.upsert("compute", common_pb2.PhysicalResource(
        id="h", resource_type="vm", capacity={"memory_gb": host_mib / 1024}, used={"memory_gb": 0.0},
        location=common_pb2.Location(site="s", rack="r", host="h"), generation=1))
    node = view.nodes["compute/h"]
    group = GroupDemand("w", "vm", count, {"memory_gb": memory_gb}, {}, frozenset(), frozenset())
    tentative: dict[str, dict[str, float]] = {}
    ctx = Context(group, [], {}, tentative, TopologyModel())
    for _ in range(count):
        if not CapacityFilter().checker(ctx)(node):
            return False
        mine = tentative.setdefault(node.key, {})
        mine["memory_gb"] = mine.get("memory_gb", 0.0) + memory_gb
    return True


def whole_mib(memory_gb: float) -> int:
    """The MiB the compute IRM stores for one VM of `memory_gb`, as it parses a request."""
    v = Violations()
    shapes = parse_groups([irm_pb2.ResourceGroup(name="w", resource_type="vm", count=1, attributes={
        "cores": common_pb2.AttributeRequest(number=1), "memory_gb": common_pb2.AttributeRequest(number=memory_gb)})],
        v)
    assert not v.items
    return shapes[0].memory_mb


def irm_fits(host_mib: int, memory_gb: float, count: int) -> bool:
    return count * whole_mib(memory_gb) <= host_mib


@pytest.mark.parametrize(("host_mib", "memory_gb", "count"), [
    (1024, 1 / 6, 6),          # the case found: 6 x 171 MiB rounded to the nearest would be 1026
    (1024, 1 / 3, 3),
    (1024, 0.1, 10),
    (2048, 0.3, 6),
    (1024, 1 / 1024, 1024),    # the smallest VM, as many as fit
    (4096, 4 / 7, 7),
    (1024, 1 / 12, 12),
])
def test_what_the_crs_places_on_a_host_the_compute_irm_takes(host_mib: int, memory_gb: float, count: int) -> None:
    assert crs_fits(host_mib, memory_gb, count)
    assert irm_fits(host_mib, memory_gb, count)


@pytest.mark.parametrize("memory_gb", [1 / 1024 * k + d for k in range(1, 3000, 37) for d in (0.0, 1e-7, 3e-4)])
def test_the_irm_never_needs_more_than_the_crs_counted(memory_gb: float) -> None:
    # As many VMs as the CRS would put on a 64 GB host: the IRM's sum of whole MiB is no more.
    host_mib = 64 * 1024
    count = int(host_mib / 1024 / memory_gb)
    while crs_fits(host_mib, memory_gb, count + 1):
        count += 1
    assert crs_fits(host_mib, memory_gb, count)
    assert irm_fits(host_mib, memory_gb, count)


@pytest.mark.parametrize(("memory_gb", "mib"), [
    (1 / 6, 170), (0.5, 512), (1.5, 1536), (0.3, 307), (0.1, 102), (1 / 1024, 1), (0.0006, 1), (2.0, 2048),
])
def test_whole_mib_rounds_down_from_one_mib_and_keeps_exact_sizes(memory_gb: float, mib: int) -> None:
    assert whole_mib(memory_gb) == mib
    assert whole_mib(memory_gb) <= max(1, math.ceil(memory_gb * 1024))
