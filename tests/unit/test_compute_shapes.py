"""VM groups from the wire (irm_compute.shapes): impossible numbers and names are bad input naming the field."""

from __future__ import annotations

import math

import pytest

from harness.v1 import common_pb2, irm_pb2
from irm_compute.shapes import MAX_CORES, MAX_NAME, parse_groups
from services.errors import Violations


def group(cores: float = 2, memory_gb: float = 4, name: str = "g", **attrs: common_pb2.AttributeRequest
          ) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=1, attributes={
        "cores": common_pb2.AttributeRequest(number=cores), "memory_gb": common_pb2.AttributeRequest(number=memory_gb),
        **attrs})


@pytest.mark.parametrize(("g", "field"), [
    (group(cores=math.nan), "groups[0].attributes[cores]"),
    (group(cores=math.inf), "groups[0].attributes[cores]"),       # int(inf) raised: INTERNAL
    (group(cores=1e30), "groups[0].attributes[cores]"),            # quoted 4e28/min, overflowed the store
    (group(cores=MAX_CORES + 1), "groups[0].attributes[cores]"),
    (group(memory_gb=math.nan), "groups[0].attributes[memory_gb]"),
    (group(memory_gb=1e30), "groups[0].attributes[memory_gb]"),
    (group(memory_gb=0.0004), "groups[0].attributes[memory_gb]"),    # rounded to 0 MiB: a VM with no memory
    (group(frequency_ghz=common_pb2.AttributeRequest(number=math.nan)), "groups[0].attributes[frequency_ghz]"),
    (group(name="x" * (MAX_NAME + 1)), "groups[0].name"),            # the store's column: INTERNAL on PostgreSQL
])
def test_impossible_numbers_and_names_are_bad_input(g: irm_pb2.ResourceGroup, field: str) -> None:
    v = Violations()
    parse_groups([g], v)
    assert [x.field for x in v.items] == [field]


def test_the_largest_allowed_shape_parses() -> None:
    v = Violations()
    (shape,) = parse_groups([group(cores=MAX_CORES, memory_gb=65536, name="x" * MAX_NAME)], v)
    assert not v.items and shape.cores == MAX_CORES and shape.memory_mb == 65536 * 1024


def test_memory_below_one_mib_after_rounding_is_bad_input_even_as_a_range_minimum() -> None:
    v = Violations()
    as_range = group(name="r")
    as_range.attributes["memory_gb"].CopyFrom(common_pb2.AttributeRequest(range=common_pb2.Range(min=0.0004, max=1)))
    assert parse_groups([group(memory_gb=0.0004), as_range], v) == []
    assert [x.field for x in v.items] == ["groups[0].attributes[memory_gb]", "groups[1].attributes[memory_gb]"]
    assert "at least 1 MiB" in v.items[0].description and "0.0004" in v.items[0].description


@pytest.mark.parametrize(("memory_gb", "mb"), [(1 / 1024, 1), (0.0006, 1), (1.5, 1536)])
def test_memory_rounds_to_whole_mib_of_at_least_one(memory_gb: float, mb: int) -> None:
    v = Violations()
    (shape,) = parse_groups([group(memory_gb=memory_gb)], v)
    assert not v.items and shape.memory_mb == mb


def test_an_unpinned_group_below_the_advertised_minimum_is_refused_as_at_the_crs() -> None:
    # The README review of session 24: 0.0005 GB (0.512 MiB) was rounded up to 1 MiB and reserved, while the CRS
    # refused it as outside the advertised [1/1024, ...]; a pinned group is still judged on its host (rounded).
    from irm_compute.shapes import Domain

    v = Violations()
    assert parse_groups([group(memory_gb=0.0005)], v, domain=Domain(32, 256, 2.0, 3.0)) == []
    [x] = v.items
    assert x.field == "groups[0].attributes[memory_gb]"
    assert x.description == ("0.0005 GB is outside [0.000976562, 256]: a VM has at least 1 MiB "
                             "(DescribeAllocationSpec lists the ranges)")
    v = Violations()
    (shape,) = parse_groups([group(memory_gb=1 / 1024)], v, domain=Domain(32, 256, 2.0, 3.0))
    assert not v.items and shape.memory_mb == 1
