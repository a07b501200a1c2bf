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
