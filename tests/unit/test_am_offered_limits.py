"""A manifest asking for attribute values no manager offers (session 24's review: Cores 1e300, Memory 1e-300 or
Frequency 1e9 were accepted, then every run failed at the CRS): the configurations asking for them are left out of
the search space, saying so, an implementation none of whose values is offered is left out, and a manifest with
nothing left is INVALID_ARGUMENT naming what to change. The ranges are the CRS's DescribeAllocationSpec's, the
union over a type's managers."""

from __future__ import annotations

import copy
import json

import pytest

from application_manager.manifest import parse_manifest
from application_manager.service import Offered
from application_manager.slo import parse_slo
from harness.v1 import common_pb2, irm_pb2
from services.errors import InvalidArgument
from tests.unit.test_am_bad_input import TEMPLATE

Kind = irm_pb2.AttributeSpec


def _spec(*managers: tuple[float, float, float]) -> irm_pb2.DescribeAllocationSpecResponse:
    """One "vm" type per manager, each with its (most cores, most memory GB, highest GHz)."""
    return irm_pb2.DescribeAllocationSpecResponse(resource_types=[irm_pb2.ResourceTypeSpec(name="vm", attributes=[
        Kind(name="cores", kind=Kind.KIND_NUMBER, unit="cores", domain=common_pb2.Range(min=1, max=cores)),
        Kind(name="memory_gb", kind=Kind.KIND_NUMBER, unit="GB", domain=common_pb2.Range(min=1 / 1024, max=mem)),
        Kind(name="frequency_ghz", kind=Kind.KIND_NUMBER, unit="GHz", domain=common_pb2.Range(max=ghz)),
        Kind(name="flavour", kind=Kind.KIND_TEXT, allowed_values=["a"])]) for cores, mem, ghz in managers])


def _space(manifest: dict, offered: Offered):  # noqa: ANN202
    from application_manager.service import _space as space

    m = parse_manifest(json.dumps(manifest))
    return space(m, parse_slo("{}", m), offered)


def test_the_offered_ranges_are_the_union_over_a_types_managers() -> None:
    offered = Offered.of(_spec((4, 8, 2.5), (16, 4, 3.0)))
    assert offered == {"vm"}
    assert offered.limits["vm"]["cores"] == (1, 16, "cores") and offered.limits["vm"]["memory_gb"][1:] == (8, "GB")
    assert offered.limits["vm"]["frequency_ghz"] == (None, 3.0, "GHz") and "flavour" not in offered.limits["vm"]


def test_configurations_asking_beyond_every_manager_are_left_out_saying_why() -> None:
    m = copy.deepcopy(TEMPLATE)     # Memory 1024, 2048, 4096 MB x Cores 1..4, a second group of 512 MB, 1 core
    space = _space(m, Offered.of(_spec((2, 2, 3.0), (3, 3, 3.0))))     # at most 3 cores, 3 GB
    assert sorted({(c["%master_cores"], c["%master_ram"]) for c in space.configs}) == [
        (c, r) for c in (1, 2, 3) for r in (1024, 2048)]
    [note] = space.notes
    assert note.startswith("implementation 'CPU': 6 configuration(s) left out, asking for what no manager offers")
    assert "group 'id0': Cores 4 is outside what the managers offer (1..3 cores)" in note
    assert "group 'id0': Memory 4096 is outside what the managers offer (1..3072 MB)" in note


@pytest.mark.parametrize("attr,spec,says", [
    ("Cores", {"Value": 1e300}, "Cores 1e+300 is outside"),
    ("Cores", {"Var": "%master_cores", "Values": [64, 10 ** 40]}, "Cores 64, 1e+40 is outside"),
    ("Memory", {"Value": 1e-300}, "Memory 1e-300 is outside what the managers offer (1..65536 MB)"),
    ("Frequency", {"Value": 1e9}, "Frequency 1e+09 is outside what the managers offer (..3 GHz)"),
])
def test_a_manifest_with_nothing_any_manager_offers_is_invalid_argument_naming_it(attr, spec, says) -> None:
    m = copy.deepcopy(TEMPLATE)
    m["Modules"][0]["Implementations"][0]["Resources"]["Groups"][0]["Attributes"][attr] = spec
    with pytest.raises(InvalidArgument) as e:
        _space(m, Offered.of(_spec((16, 64, 3.0))))
    [v] = e.value.violations
    assert v.field == "manifest" and "the search space is empty: implementation 'CPU' cannot run: group 'id0'" \
        in v.description and says in v.description, v.description


def test_without_ranges_the_space_is_as_before() -> None:
    assert len(_space(copy.deepcopy(TEMPLATE), {"vm"})) == 12      # a plain set: nothing known of the ranges
