"""Pure parts of the compute IRM: cost model (thesis §4.5.1), inventory, VM group parsing
(irm_compute.cost, irm_compute.inventory, irm_compute.shapes)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.v1 import common_pb2, irm_pb2
from irm_compute import inventory as inv
from irm_compute.cost import CostModel
from irm_compute.inventory import InventoryError
from irm_compute.shapes import MAX_COUNT, VmGroup, parse_groups
from services.errors import Violations

# -- cost ----------------------------------------------------------------------


@pytest.mark.parametrize(("cores", "gb", "freq", "expected"), [
    (1, 1, None, 0.0396 + 0.0186 + 0.0417),
    (4, 16, 2.2, 0.0396 * 4 + 0.0186 * 16 + 0.0417),
    (8, 32, 3.0, 0.0396 * 8 * (3.0 / 2.2) + 0.0186 * 32 + 0.0417),
    (2, 0.5, 1.1, 0.0396 * 2 * 0.5 + 0.0186 * 0.5 + 0.0417),
    (0, 0, None, 0.0417),
])
def test_thesis_linear_price(cores: float, gb: float, freq: float | None, expected: float) -> None:
    assert CostModel().price_per_minute(cores, gb, freq) == pytest.approx(expected, rel=1e-12)


def test_price_grows_with_each_dimension() -> None:
    m = CostModel()
    base = m.price_per_minute(4, 8, 2.2)
    assert m.price_per_minute(5, 8, 2.2) - base == pytest.approx(0.0396)
    assert m.price_per_minute(4, 9, 2.2) - base == pytest.approx(0.0186)
    assert m.price_per_minute(4, 8, 4.4) - base == pytest.approx(0.0396 * 4)  # double frequency: double core cost


def test_custom_coefficients() -> None:
    m = CostModel(per_core=1.0, per_gb=0.1, base=5.0, reference_frequency_ghz=2.0)
    assert m.price_per_minute(3, 10, 4.0) == pytest.approx(1.0 * 3 * 2 + 0.1 * 10 + 5.0)


# -- inventory -----------------------------------------------------------------

def test_load_hosts_from_yaml(tmp_path: Path) -> None:
    p = tmp_path / "inv.yaml"
    p.write_text(
        "hosts:\n"
        "  - {id: a1, site: east, rack: r1, cores: 32, memory_gb: 128, frequency_ghz: 2.4, traits: [ssd, avx512],"
        " agent: '10.0.0.1:1'}\n"
        "  - {id: a2, cores: 4, memory_gb: 1.5}\n")
    hosts = inv.load(str(p), default_agent="dflt:2").hosts
    assert [h.id for h in hosts] == ["a1", "a2"]
    a1, a2 = hosts
    assert (a1.site, a1.rack, a1.cores, a1.memory_mb, a1.frequency_ghz) == ("east", "r1", 32, 128 * 1024, 2.4)
    assert a1.traits == ("avx512", "ssd") and a1.agent == "10.0.0.1:1"
    assert (a2.site, a2.rack, a2.frequency_ghz, a2.memory_mb, a2.agent) == ("site-a", "rack-1", 2.2, 1536, "dflt:2")


def test_generate_spreads_hosts_over_sites_and_racks() -> None:
    hosts = inv.from_dict({"generate": [{"count": 12, "prefix": "h", "sites": 2, "racks_per_site": 3,
                                         "cores": 16, "memory_gb": 64, "traits": ["ssd"]}]}).hosts
    assert [h.id for h in hosts] == [f"h{i}" for i in range(12)]
    assert {h.site for h in hosts} == {"site-0", "site-1"}
    racks = {(h.site, h.rack) for h in hosts}
    assert len(racks) == 6
    assert all(h.rack.startswith(f"rack-{h.site[-1]}-") for h in hosts)  # rack names are unique per site
    per_rack = {r: sum(1 for h in hosts if (h.site, h.rack) == r) for r in racks}
    assert set(per_rack.values()) == {2}
    assert all(h.cores == 16 and h.memory_mb == 65536 and h.traits == ("ssd",) for h in hosts)


def test_hosts_and_generate_together() -> None:
    hosts = inv.from_dict({"hosts": [{"id": "x", "cores": 1, "memory_gb": 1}],
                           "generate": [{"count": 2, "cores": 2, "memory_gb": 2}]}).hosts
    assert [h.id for h in hosts] == ["x", "g0-h0", "g0-h1"]


@pytest.mark.parametrize(("data", "fragment"), [
    ({"hosts": [{"id": "a", "cores": 1, "memory_gb": 1}, {"id": "a", "cores": 2, "memory_gb": 2}]},
     "duplicate host id 'a'"),
    ({"hosts": [{"id": "h0", "cores": 1, "memory_gb": 1}], "generate": [{"count": 1, "prefix": "h", "cores": 1,
                                                                          "memory_gb": 1}]},
     "duplicate host id 'h0'"),
    ({"hosts": [{"cores": 1, "memory_gb": 1}]}, "hosts[0]: missing id"),
    ({"hosts": [{"id": "a", "memory_gb": 1}]}, "missing cores"),
    ({"hosts": [{"id": "a", "cores": 1}]}, "missing memory_gb"),
    ({"generate": [{"count": 2, "memory_gb": 1}]}, "generate[0]: missing cores"),
    ({"hosts": [{"id": "a", "cores": "many", "memory_gb": 1}]}, "hosts[0]"),
    ({"hosts": [{"id": "a", "cores": 0, "memory_gb": 1}]}, "must be positive"),
    ({"hosts": [{"id": "a", "cores": 1, "memory_gb": -1}]}, "must be positive"),
    ({"hosts": [{"id": "a", "cores": 1, "memory_gb": 1, "frequency_ghz": 0}]}, "must be positive"),
    ({}, "no hosts"),
    ({"hosts": []}, "no hosts"),
])
def test_inventory_rejections(data: dict, fragment: str) -> None:
    with pytest.raises(InventoryError) as info:
        inv.from_dict(data)
    assert fragment in str(info.value)


def test_load_rejects_non_mapping_yaml_and_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("- just\n- a list\n")
    with pytest.raises(InventoryError, match="bad.yaml"):
        inv.load(str(p))
    p.write_text("hosts:\n  - {id: a, cores: 1}\n")
    with pytest.raises(InventoryError) as info:
        inv.load(str(p))
    assert "bad.yaml" in str(info.value) and "missing memory_gb" in str(info.value)


def test_default_inventory() -> None:
    d = inv.load(None, default_agent="a:1")
    assert len(d.hosts) == 6 and len({h.id for h in d.hosts}) == 6
    assert {h.rack for h in d.hosts} == {"rack-1", "rack-2"}
    assert all(h.agent == "a:1" and h.cores > 0 and h.memory_mb > 0 for h in d.hosts)


# -- shapes.parse_groups ---------------------------------------------------------

def num(x: float) -> common_pb2.AttributeRequest:
    return common_pb2.AttributeRequest(number=x)


def rng(lo: float | None = None, hi: float | None = None) -> common_pb2.AttributeRequest:
    r = common_pb2.Range()
    if lo is not None:
        r.min = lo
    if hi is not None:
        r.max = hi
    return common_pb2.AttributeRequest(range=r)


def vm(name: str = "g", count: int = 1, **attrs: common_pb2.AttributeRequest) -> irm_pb2.ResourceGroup:
    attrs.setdefault("cores", num(2))
    attrs.setdefault("memory_gb", num(4))
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=count, attributes=attrs)


def parse(groups: list[irm_pb2.ResourceGroup]) -> tuple[list[VmGroup], list[tuple[str, str]]]:
    v = Violations()
    out = parse_groups(groups, v)
    return out, [(x.field, x.description) for x in v.items]


def test_parse_a_valid_group() -> None:
    g = vm("web", 3, frequency_ghz=rng(2.0, 3.0))
    g.required_traits.append("ssd")
    g.forbidden_traits.append("gpu")
    out, errs = parse([g])
    assert errs == []
    assert out == [VmGroup("web", 3, 2, 4096, 2.0, 3.0, frozenset({"ssd"}), frozenset({"gpu"}), ())]


def test_ranges_take_the_lower_bound_for_consumables_and_bounds_for_frequency() -> None:
    out, errs = parse([vm(cores=rng(4, 8), memory_gb=rng(0.5), frequency_ghz=num(2.4))])
    assert errs == []
    g = out[0]
    assert (g.cores, g.memory_mb, g.freq_min, g.freq_max) == (4, 512, 2.4, 2.4)
    out, _ = parse([vm(frequency_ghz=rng(hi=3.0))])
    assert (out[0].freq_min, out[0].freq_max) == (0.0, 3.0)
    out, _ = parse([vm(frequency_ghz=rng(lo=2.5))])
    assert (out[0].freq_min, out[0].freq_max) == (2.5, math.inf)


def test_host_matches() -> None:
    g = VmGroup("g", 1, 1, 1, 2.0, 3.0, frozenset({"ssd"}), frozenset({"gpu"}))
    assert g.host_matches(2.0, {"ssd"}) and g.host_matches(3.0, {"ssd", "x"})
    assert not g.host_matches(1.9, {"ssd"}) and not g.host_matches(3.1, {"ssd"})
    assert not g.host_matches(2.5, set()) and not g.host_matches(2.5, {"ssd", "gpu"})


@pytest.mark.parametrize(("group", "field", "fragment"), [
    (vm(name=""), "groups[0].name", "required"),
    (irm_pb2.ResourceGroup(name="g", resource_type="fpga", count=1, attributes={"cores": num(1), "memory_gb": num(1)}),
     "groups[0].resource_type", "provides 'vm', not 'fpga'"),
    (vm(count=0), "groups[0].count", "between 1 and"),
    (vm(count=MAX_COUNT + 1), "groups[0].count", "between 1 and"),
    (vm(gpus=num(1)), "groups[0].attributes[gpus]", "unknown attribute"),
    (vm(cores=num(0)), "groups[0].attributes[cores]", "whole number >= 1"),
    (vm(cores=num(1.5)), "groups[0].attributes[cores]", "whole number >= 1, got 1.5"),
    (vm(cores=rng(hi=4)), "groups[0].attributes[cores].range.min", "lower bound"),
    (vm(cores=common_pb2.AttributeRequest(text="four")), "groups[0].attributes[cores]", "number or a range"),
    (vm(memory_gb=num(0)), "groups[0].attributes[memory_gb]", "must be > 0"),
    (vm(memory_gb=num(math.inf)), "groups[0].attributes[memory_gb]", "must be > 0"),
    (vm(memory_gb=num(math.nan)), "groups[0].attributes[memory_gb]", "must be > 0"),
    (vm(frequency_ghz=rng(3.0, 2.0)), "groups[0].attributes[frequency_ghz].range", "min must not exceed max"),
    (vm(frequency_ghz=common_pb2.AttributeRequest(text="fast")), "groups[0].attributes[frequency_ghz]", "GHz"),
])
def test_parse_group_violations(group: irm_pb2.ResourceGroup, field: str, fragment: str) -> None:
    _, errs = parse([group])
    matching = [d for f, d in errs if f == field]
    assert matching, errs
    assert any(fragment in d for d in matching), matching


def test_missing_required_attributes() -> None:
    g = irm_pb2.ResourceGroup(name="g", resource_type="vm", count=1)
    out, errs = parse([g])
    assert out == []
    assert ("groups[0].attributes[cores]", "required: the number of cores per VM") in errs
    assert ("groups[0].attributes[memory_gb]", "required: the memory per VM in GB") in errs


def test_no_groups_duplicates_placement_and_trait_clash() -> None:
    _, errs = parse([])
    assert errs == [("groups", "at least one group is required")]
    a = vm("a", 2)
    a.placement.extend(["h1"])  # one host for two instances
    b = vm("a")
    b.required_traits.append("ssd")
    b.forbidden_traits.append("ssd")
    _, errs = parse([a, b])
    fields = [f for f, _ in errs]
    assert "groups[0].placement" in fields
    assert ("groups[1].name", "duplicate group name 'a'") in errs
    assert any(f == "groups[1].forbidden_traits" and "['ssd']" in d for f, d in errs)


def test_every_problem_of_every_group_is_reported() -> None:
    groups = [vm("ok"), vm("bad1", 0, cores=num(0)), vm("bad2", memory_gb=num(-1), extra=num(1))]
    out, errs = parse(groups)
    fields = {f for f, _ in errs}
    assert {"groups[1].count", "groups[1].attributes[cores]", "groups[2].attributes[memory_gb]",
            "groups[2].attributes[extra]"} <= fields
    assert not any(f.startswith("groups[0]") for f in fields)
    assert [g.name for g in out] == ["ok"]  # groups without a usable shape are not returned


def test_pinned_placement_is_kept_in_order() -> None:
    g = vm("g", 3)
    g.placement.extend(["h2", "h1", "h2"])
    out, errs = parse([g])
    assert errs == [] and out[0].placement == ("h2", "h1", "h2")


def test_a_range_of_cores_takes_its_smallest_whole_number() -> None:
    # The CRS counts a range of an integer attribute at its smallest whole number: the IRM takes the same (1.2
    # cores was refused as not whole, though the range holds 2).
    out, errs = parse([vm(cores=rng(1.2, 3)), vm("b", cores=rng(0.5))])
    assert errs == [] and [g.cores for g in out] == [2, 1]
    _, errs = parse([vm(cores=rng(1.2, 1.8))])
    assert errs == [("groups[0].attributes[cores].range", "no whole number in [1.2, 1.8]")]
