"""A range of an integer consumable attribute (cores, devices) counts at its smallest whole number at the CRS, as
its managers take it: counted at the range's fractional minimum, three virtual FPGAs of [1.2, 3] devices looked
like 3.6 devices and were all placed on a 4-device server that needs 6 (a review's finding)."""

from __future__ import annotations

import pytest

from cross_resource_scheduler import parsing
from harness.v1 import common_pb2, irm_pb2
from services.errors import InvalidArgument

SPECS = {"vfpga": {
    "devices": irm_pb2.AttributeSpec(name="devices", kind=irm_pb2.AttributeSpec.KIND_NUMBER, unit="devices",
                                     consumable=True, integer=True, domain=common_pb2.Range(min=1, max=8)),
    "load": irm_pb2.AttributeSpec(name="load", kind=irm_pb2.AttributeSpec.KIND_NUMBER, unit="units",
                                  consumable=True, domain=common_pb2.Range(min=0, max=8)),
}}


def _group(**attrs: common_pb2.AttributeRequest) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name="f", resource_type="vfpga", count=3, attributes=attrs)


def _range(lo: float, hi: float) -> common_pb2.AttributeRequest:
    return common_pb2.AttributeRequest(range=common_pb2.Range(min=lo, max=hi))


def test_an_integer_range_counts_at_its_smallest_whole_number_and_others_at_their_minimum():
    req = parsing.parse([_group(devices=_range(1.2, 3), load=_range(0.5, 2))], [], SPECS, lambda t: [], 0)
    assert req.groups[0].demand == {"devices": 2.0, "load": 0.5}


def test_an_integer_range_without_a_whole_number_is_refused():
    with pytest.raises(InvalidArgument) as e:
        parsing.parse([_group(devices=_range(1.2, 1.8))], [], SPECS, lambda t: [], 0)
    assert [(x.field, x.description) for x in e.value.violations] == [
        ("groups[0].attributes[devices]", "no whole number in the range [1.2, 1.8] (devices)")]
