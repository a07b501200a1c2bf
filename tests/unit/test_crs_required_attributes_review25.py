"""An attribute every manager of a type requires, left out of a group, is INVALID_ARGUMENT at the CRS naming it
(review 25). Before, the CRS placed without it: a group with a trait no resource has was "never fits"
(FAILED_PRECONDITION), and one that fitted was refused by the manager after delegation."""

from __future__ import annotations

import pytest

from cross_resource_scheduler import parsing
from harness.v1 import common_pb2, irm_pb2
from services.errors import InvalidArgument

NUMBER = irm_pb2.AttributeSpec.KIND_NUMBER


def _spec(name: str, required: bool) -> irm_pb2.AttributeSpec:
    return irm_pb2.AttributeSpec(name=name, kind=NUMBER, unit="cores" if name == "cores" else "GB", consumable=True,
                                 required=required, domain=common_pb2.Range(min=0, max=64))


def _vm(**attrs: float) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name="g", resource_type="vm", count=1, required_traits=["gpu"], attributes={
        k: common_pb2.AttributeRequest(number=v) for k, v in attrs.items()})


def test_a_required_attribute_left_out_is_invalid_argument_naming_it():
    specs = {"vm": {"cores": _spec("cores", True), "memory_gb": _spec("memory_gb", True)}}
    with pytest.raises(InvalidArgument) as e:
        parsing.parse([_vm()], [], specs, lambda t: [], 0)
    assert [(x.field, x.description) for x in e.value.violations] == [
        ("groups[0].attributes[cores]", "required: every manager of 'vm' needs it (cores)"),
        ("groups[0].attributes[memory_gb]", "required: every manager of 'vm' needs it (GB)")]
    assert parsing.parse([_vm(cores=2, memory_gb=4)], [], specs, lambda t: [], 0).groups[0].demand == \
        {"cores": 2.0, "memory_gb": 4.0}


def test_an_attribute_one_manager_of_the_type_does_without_may_be_left_out():
    merged = parsing.merged_attribute(_spec("memory_gb", True), _spec("memory_gb", False))
    specs = {"vm": {"cores": _spec("cores", True), "memory_gb": merged}}
    assert parsing.parse([_vm(cores=2)], [], specs, lambda t: [], 0).groups[0].demand == {"cores": 2.0}


def test_a_fraction_of_a_whole_attribute_is_refused_at_the_crs():
    # Review 25: cores=1.5 passed the CRS's range check and was refused by the compute IRM after placement.
    specs = {"vm": {"cores": irm_pb2.AttributeSpec(name="cores", kind=NUMBER, unit="cores", consumable=True,
                                                    integer=True, domain=common_pb2.Range(min=1, max=32))}}
    g = irm_pb2.ResourceGroup(name="g", resource_type="vm", count=1,
                              attributes={"cores": common_pb2.AttributeRequest(number=1.5)})
    with pytest.raises(InvalidArgument) as e:
        parsing.parse([g], [], specs, lambda t: [], 0)
    assert [(x.field, x.description) for x in e.value.violations] == [
        ("groups[0].attributes[cores]", "a whole number of cores, got 1.5")]
