"""Manifest, SLO, expression grammar and search space: hand-checkable cases."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from application_manager import expr
from application_manager.manifest import parse_manifest, substitute
from application_manager.slo import parse_slo
from application_manager.space import from_manifest
from services.errors import InvalidArgument

TEMPLATE = {
    "Name": "Hello", "Author": "User",
    "Modules": [{
        "ModuleName": "Main",
        "Parameters": [{"Var": "%arg1", "Name": "input", "Type": "INT", "Values": [10, 100], "Default": 100,
                        "Benchmark": 10}],
        "Implementations": [{
            "ImplementationName": "CPU",
            "Resources": {
                "Groups": [
                    {"GroupID": "id0", "Role": "MASTER", "Type": "Machine", "NumInstances": {"Value": 1},
                     "Attributes": {"Memory": {"Var": "%master_ram", "Values": [1024, 2048, 4096, 8192]},
                                    "Cores": {"Var": "%master_cores", "Range": [1, 7]}}},
                    {"GroupID": "id1", "Role": "SLAVE", "Type": "Machine",
                     "NumInstances": {"Var": "%slaves", "Values": [1, 2]},
                     "Attributes": {"Memory": {"Value": 512}, "Cores": {"Value": 1}}}],
                "Distances": [{"Source": "id0", "Target": "id1", "Constraints": ["hops < 1"]}]},
            "GlobalConstraints": ["%master_ram > 1024 * %master_cores"],
            "EnvironmentVars": {"THREADS": "%master_cores"},
            "Command": ["%python", "%app_dir/app.py", "%arg1"],
            "ExecutionArgs": "%arg1"}]}]}


def violations(exc: pytest.ExceptionInfo) -> dict[str, str]:
    return {v.field: v.description for v in exc.value.violations}


def test_expression_grammar_parses_and_evaluates_without_eval():
    node = expr.parse("%master_ram > 1024 * %master_cores")
    assert expr.variables(node) == {"%master_ram", "%master_cores"}
    assert expr.holds(node, {"%master_ram": 4096, "%master_cores": 3})
    assert not expr.holds(node, {"%master_ram": 4096, "%master_cores": 4})
    assert expr.evaluate(expr.parse("-(2 + 3) * 4 / 2"), {}) == -10
    assert expr.holds(expr.parse("%a >= 2 and not %b == 1 or false"), {"%a": 2, "%b": 0})
    assert expr.evaluate(expr.parse("7 % 4"), {}) == 3
    assert expr.holds(expr.parse("%x != 1 && %x < 3"), {"%x": 2})


@pytest.mark.parametrize("text,where", [
    ("%a > ", 5), ("__import__('os')", 0), ("%a < 1 < 2", 7), ("(1 + 2", 6), ("1 $ 2", 2), ("", 0)])
def test_expression_errors_say_where(text, where):
    with pytest.raises(expr.ExprError) as e:
        expr.parse(text)
    assert e.value.position == where


def test_manifest_parses_appendix_a_shape():
    m = parse_manifest(TEMPLATE)
    impl = m.main.implementations[0]
    assert [g.id for g in impl.groups] == ["id0", "id1"]
    assert impl.groups[0].attributes["Cores"].values == tuple(range(1, 8))
    assert impl.distances[0].constraints == ("hops(id0, id1) <= 0",)
    assert m.parameter("%arg1").benchmark == 10
    assert set(impl.choices()) == {"%master_ram", "%master_cores", "%slaves"}
    assert substitute("%arg1 %arg10 %arg1x", {"%arg1": "A", "%arg10": "B"}) == "A B %arg1x"


def test_manifest_errors_name_every_field():
    bad = copy.deepcopy(TEMPLATE)
    impl = bad["Modules"][0]["Implementations"][0]
    impl["Resources"]["Groups"][0]["Attributes"]["Memory"] = {"Var": "%master_ram", "Values": [1024, "lots"]}
    impl["Resources"]["Groups"][0]["Attributes"]["Cores"]["Range"] = [8, 2]
    impl["Resources"]["Groups"][1]["Type"] = "Toaster"
    impl["GlobalConstraints"] = ["%master_ram > 1024 * %gpus"]
    impl["Resources"]["Distances"][0]["Target"] = "id9"
    del impl["Command"]
    with pytest.raises(InvalidArgument) as e:
        parse_manifest(bad)
    v = violations(e)
    p = "manifest.Modules[0].Implementations[0]"
    assert "expected a number" in v[f"{p}.Resources.Groups[0].Attributes.Memory.Values[1]"]
    assert "above highest" in v[f"{p}.Resources.Groups[0].Attributes.Cores.Range"]
    assert "Machine" in v[f"{p}.Resources.Groups[1].Type"]
    assert "%gpus" in v[f"{p}.GlobalConstraints[0]"]
    assert "id9" in v[f"{p}.Resources.Distances[0].Target"]
    assert "command line" in v[f"{p}.Command"]


def test_manifest_not_json_and_missing_modules():
    with pytest.raises(InvalidArgument) as e:
        parse_manifest("{nope")
    assert "not valid JSON" in violations(e)["manifest"]
    with pytest.raises(InvalidArgument) as e:
        parse_manifest({"Name": "x"})
    assert "manifest.Modules" in violations(e)


def test_search_space_is_filtered_product_mapped_on_unit_interval():
    m = parse_manifest(TEMPLATE)
    space = from_manifest(m, {"%arg1": 100})
    # ram > 1024 * cores: ram 2048 -> cores 1; 4096 -> 1..3; 8192 -> 1..7 (1024 allows none); x 2 slave counts.
    assert len(space) == (1 + 3 + 7) * 2
    assert all(c["%master_ram"] > 1024 * c["%master_cores"] for c in space.configs)
    ram = space.dim("%master_ram")
    assert ram.values == (2048, 4096, 8192)  # 1024 never satisfies the constraint
    assert ram.position(2048) == pytest.approx(1 / 6) and ram.position(8192) == pytest.approx(5 / 6)
    assert ram.index_at(0.0) == 0 and ram.index_at(0.999) == 2
    i = space.snap([1.0, 1.0, 1.0])
    cfg = space.configs[i]
    assert cfg["%master_ram"] == 8192 and cfg["%master_cores"] == 7 and cfg["%slaves"] == 2
    j = space.step(i, "%master_ram", -1)
    assert space.configs[j]["%master_ram"] == 4096 and space.configs[j]["%master_cores"] == 3
    assert space.step(i, "%master_ram", +1) is None
    assert np.all((space.units > 0) & (space.units < 1))


def test_categorical_implementation_dimension_and_unoffered_types():
    m = copy.deepcopy(TEMPLATE)
    fpga = copy.deepcopy(m["Modules"][0]["Implementations"][0])
    fpga["ImplementationName"] = "FPGA"
    fpga["Resources"]["Groups"].append({"GroupID": "dfe", "Role": "ACCEL", "Type": "FPGA",
                                        "Attributes": {"Design": {"Value": "black_scholes"}}})
    m["Modules"][0]["Implementations"].append(fpga)
    manifest = parse_manifest(m)
    both = from_manifest(manifest)
    assert both.dims[0].name == "implementation" and both.dims[0].categorical
    assert {c["implementation"] for c in both.configs} == {"CPU", "FPGA"}
    vm_only = from_manifest(manifest, offered_types={"vm"})
    assert {c["implementation"] for c in vm_only.configs} == {"CPU"}
    assert "FPGA" in vm_only.notes[0] and "fpga" in vm_only.notes[0]


def test_slo_parses_bounds_and_names_bad_fields():
    m = parse_manifest(TEMPLATE)
    s = parse_slo({"Manifest": "Hello", "Parameters": {"%arg1": 10},
                   "Objective": {"Constraints": ["%cost <= 0.30"], "Optimize": "%execution_time"}}, m)
    assert s.cost_bound == 0.30 and s.time_bound is None and s.parameters == {"%arg1": 10}
    assert s.holds(100, 0.3) and not s.holds(1, 0.31)
    s2 = parse_slo({"Objective": {"Constraints": ["60 >= %execution_time"]}}, m)
    assert s2.time_bound == 60 and s2.optimize == "%cost" and s2.parameters == {"%arg1": 100}
    with pytest.raises(InvalidArgument) as e:
        parse_slo({"Manifest": "Other", "Parameters": {"%arg1": 5, "%zz": 1},
                   "Objective": {"Constraints": ["%cost >= 1", "%energy <= 3", "%cost <= %execution_time"],
                                 "Optimize": "%fun"}}, m)
    v = violations(e)
    assert "Hello" in v["slo.Manifest"]
    assert "expected one of [10, 100]" in v["slo.Parameters.%arg1"]
    assert "not a parameter" in v["slo.Parameters.%zz"]
    assert "upper bound" in v["slo.Objective.Constraints[0]"]
    assert "unknown metric" in v["slo.Objective.Constraints[1]"]
    assert "expected" in v["slo.Objective.Constraints[2]"]
    assert "%fun" in v["slo.Objective.Optimize"]


def _module(name: str, impls: list[tuple[str, str, dict]], params: list | None = None) -> dict:
    return {"ModuleName": name, "Parameters": params or [], "Implementations": [
        {"ImplementationName": iname, "Command": ["run", name],
         "Resources": {"Groups": [{"GroupID": gid, "Role": "MASTER", "Type": "Machine", "Attributes": attrs}]}}
        for iname, gid, attrs in impls]}


def test_modules_combine_into_variants_with_the_main_module_first():
    small = {"Cores": {"Value": 1}, "Memory": {"Value": 256}}
    data = {"Name": "Shop", "Modules": [
        _module("Cache", [("Redis", "cache", {"Cores": {"Var": "%cache_cores", "Values": [1, 2]},
                                              "Memory": {"Value": 512}}),
                          ("Memcached", "mc", small)]),
        _module("Main", [("Web", "web", {"Cores": {"Var": "%cores", "Values": [1, 2, 4]},
                                         "Memory": {"Value": 1024}})],
                params=[{"Var": "%users", "Values": [10, 100]}])]}
    data["Modules"][1]["Implementations"][0]["GlobalConstraints"] = ["%cores >= %cache_cores"]
    m = parse_manifest(data)
    assert [mod.name for mod in m.modules] == ["Main", "Cache"]  # Main runs last but is the application
    assert [v.name for v in m.variants] == ["Main/Web + Cache/Redis", "Main/Web + Cache/Memcached"]
    redis = m.variants[0]
    assert [g.id for g in redis.groups] == ["web", "cache"] and redis.master().id == "web"
    assert [p.module for p in redis.parts] == ["Main", "Cache"]
    assert m.parameter("%users") is not None
    space = from_manifest(m, {"%users": 10})
    # Redis: cores x cache cores with cores >= cache cores (3 + 2 = 5). Memcached has no %cache_cores, so
    # the constraint says nothing about it: all its 3 core counts stay, %cache_cores not applicable.
    pairs = sorted(((c["implementation"] == redis.name, c["%cores"], c.get("%cache_cores")) for c in space.configs),
                   key=str)
    assert pairs == sorted([(True, 1, 1), (True, 2, 1), (True, 2, 2), (True, 4, 1), (True, 4, 2),
                            (False, 1, None), (False, 2, None), (False, 4, None)], key=str)
    assert space.dim("implementation").categorical and space.dim("%cache_cores").values[0] is None


def test_modules_must_not_share_group_ids_parameters_or_disagree_on_a_variable():
    attrs = {"Cores": {"Var": "%cores", "Values": [1, 2]}, "Memory": {"Value": 256}}
    other = {"Cores": {"Var": "%cores", "Values": [1, 8]}, "Memory": {"Value": 256}}
    p = [{"Var": "%n", "Values": [1]}]
    data = {"Name": "X", "Modules": [_module("Main", [("A", "g", attrs)], p),
                                     _module("Side", [("B", "g", other)], p),
                                     _module("main", [("C", "h", attrs)])]}
    with pytest.raises(InvalidArgument) as e:
        parse_manifest(data)
    v = violations(e)
    assert "also a group of module 'Main'" in v["manifest.Modules[1].Implementations[0].Resources.Groups"]
    assert "already a parameter of module 'Main'" in v["manifest.Modules[1].Parameters"]
    assert "a shared variable is one choice" in v["manifest.Modules[1].Implementations[0]"]
    assert "duplicate module name" in v["manifest.Modules[2].ModuleName"]


def test_a_module_may_address_another_modules_group():
    data = {"Name": "X", "Modules": [
        _module("Main", [("A", "web", {"Cores": {"Value": 1}, "Memory": {"Value": 256}})]),
        _module("Db", [("B", "db", {"Cores": {"Value": 1}, "Memory": {"Value": 256}})])]}
    data["Modules"][0]["Implementations"][0]["EnvironmentVars"] = {"DB": "%db_address"}
    assert parse_manifest(data).variants[0].parts[0].env == {"DB": "%db_address"}
    data["Modules"][0]["Implementations"][0]["EnvironmentVars"] = {"DB": "%nope_address"}
    with pytest.raises(InvalidArgument) as e:
        parse_manifest(data)
    assert "%nope_address is used but never defined" in violations(e)["manifest.Modules[0].Implementations[0]"]


def test_tunable_parameters_are_search_dimensions_the_slo_cannot_fix():
    data = copy.deepcopy(TEMPLATE)
    data["Modules"][0]["Parameters"].append({"Var": "%provider", "Type": "STR", "Values": ["aws", "gcp"],
                                             "Tunable": True})
    m = parse_manifest(data)
    assert m.parameter("%provider").tunable and not m.parameter("%arg1").tunable
    slo = parse_slo({"Parameters": {"%arg1": 10}}, m)
    assert "%provider" not in slo.parameters
    space = from_manifest(m, slo.parameters)
    assert space.dim("%provider").categorical and {c["%provider"] for c in space.configs} == {"aws", "gcp"}
    assert len(space) == 2 * len(from_manifest(parse_manifest(TEMPLATE), slo.parameters))
    with pytest.raises(InvalidArgument) as e:
        parse_slo({"Parameters": {"%provider": "aws"}}, m)
    assert "the manager chooses it" in violations(e)["slo.Parameters.%provider"]
    data["Modules"][0]["Parameters"][1].update(Tunable="yes")
    with pytest.raises(InvalidArgument) as e:
        parse_manifest(data)
    assert "expected true or false" in violations(e)["manifest.Modules[0].Parameters[1].Tunable"]
