"""Malformed manifests and SLOs are INVALID_ARGUMENT naming the field, never an INTERNAL crash.

Each case goes through what SubmitApplication calls: parse_manifest, parse_slo, from_manifest.
"""

from __future__ import annotations

import copy
import json
import math

import pytest

from application_manager import expr
from application_manager.manifest import parse_manifest
from application_manager.slo import parse_slo
from application_manager.space import from_manifest
from services.errors import InvalidArgument

TEMPLATE = {
    "Name": "Hello",
    "Modules": [{
        "ModuleName": "Main",
        "Parameters": [{"Var": "%arg1", "Name": "input", "Type": "INT", "Values": [10, 100], "Default": 100}],
        "Implementations": [{
            "ImplementationName": "CPU",
            "Resources": {
                "Groups": [
                    {"GroupID": "id0", "Role": "MASTER", "Type": "Machine",
                     "Attributes": {"Memory": {"Var": "%master_ram", "Values": [1024, 2048, 4096]},
                                    "Cores": {"Var": "%master_cores", "Range": [1, 4]}}},
                    {"GroupID": "id1", "Type": "Machine", "Attributes": {"Memory": 512, "Cores": 1}}],
                "Distances": [{"Source": "id0", "Target": "id1", "Constraints": ["hops < 1"]}]},
            "GlobalConstraints": [],
            "Command": ["%python", "%app_dir/app.py", "%arg1"]}]}]}
IMPL = "manifest.Modules[0].Implementations[0]"
GROUP0 = f"{IMPL}.Resources.Groups[0]"


def _template() -> dict:
    return copy.deepcopy(TEMPLATE)


def _impl(m: dict) -> dict:
    return m["Modules"][0]["Implementations"][0]


def _submit(manifest: dict | str, slo: str = "{}"):
    """The SubmitApplication path, in the handler's order."""
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)  # allow_nan: Python's json writes NaN
    parsed = parse_manifest(text)
    return from_manifest(parsed, parse_slo(slo, parsed).parameters, None)


def _violations(manifest: dict | str, slo: str = "{}") -> dict[str, str]:
    with pytest.raises(InvalidArgument) as e:
        _submit(manifest, slo)
    return {v.field: v.description for v in e.value.violations}


@pytest.mark.parametrize("attr,spec,where", [
    ("Cores", {"Var": "%master_cores", "Range": [1, math.inf]}, "Cores.Range"),
    ("Cores", {"Var": "%master_cores", "Range": [math.nan, 4]}, "Cores.Range"),
    ("Memory", {"Var": "%master_ram", "Values": [math.nan]}, "Memory.Values[0]"),
    ("Memory", {"Var": "%master_ram", "Values": [512, math.inf]}, "Memory.Values[1]"),
    ("Memory", {"Var": "%master_ram", "Values": [10 ** 400]}, "Memory.Values[0]"),
])
def test_infinite_nan_and_huge_numbers_are_rejected(attr, spec, where):
    m = _template()
    m["Modules"][0]["Implementations"][0]["Resources"]["Groups"][0]["Attributes"][attr] = spec
    v = _violations(m)
    assert "finite" in v[f"{GROUP0}.Attributes.{where}"]


def test_parameter_values_must_be_finite_numbers_or_scalars():
    m = _template()
    m["Modules"][0]["Parameters"] = [{"Var": "%arg1", "Type": "FLOAT", "Values": [1.5, math.inf]}]
    assert "finite" in _violations(m)["manifest.Modules[0].Parameters[0].Values"]
    m = _template()
    m["Modules"][0]["Parameters"].append({"Var": "%knob", "Values": [{"a": 1}, {"b": 2}], "Tunable": True})
    assert "{'a': 1}" in _violations(m)["manifest.Modules[0].Parameters[1].Values[0]"]


def test_fpga_attribute_values_must_be_scalars():
    m = _template()
    _impl(m)["Resources"]["Groups"].append(
        {"GroupID": "dfe", "Type": "FPGA", "Attributes": {"design": {"Var": "%design", "Values": [["a"], ["b"]]}}})
    v = _violations(m)
    assert "string or a finite number" in v[f"{IMPL}.Resources.Groups[2].Attributes.design.Values[0]"]


def test_a_deeply_nested_bad_value_is_quoted_briefly():
    deep: list = []
    inner = deep
    for _ in range(800):
        inner.append([])
        inner = inner[0]
    m = _template()
    _impl(m)["Resources"]["Groups"][0]["Attributes"]["Memory"] = {"Var": "%master_ram", "Values": [deep]}
    description = _violations(m)[f"{GROUP0}.Attributes.Memory.Values[0]"]
    assert "expected a number" in description and len(description) < 200


@pytest.mark.parametrize("change,where", [
    (lambda m: _impl(m)["Resources"].__setitem__("Distances", 5), f"{IMPL}.Resources.Distances"),
    (lambda m: _impl(m)["Resources"]["Distances"][0].__setitem__("Source", ["id0"]),
     f"{IMPL}.Resources.Distances[0].Source"),
    (lambda m: m["Modules"][0].__setitem__("Parameters", 7), "manifest.Modules[0].Parameters"),
    (lambda m: m["Modules"][0].__setitem__("Implementations", 7), "manifest.Modules[0].Implementations"),
    (lambda m: _impl(m)["Resources"].__setitem__("Groups", 5), f"{IMPL}.Resources.Groups"),
])
def test_containers_of_the_wrong_type_are_rejected(change, where):
    m = _template()
    change(m)
    assert where in _violations(m)


@pytest.mark.parametrize("bound", ["hops < 1.2.3", "hops < .", "hops < " + "9" * 400])
def test_distance_bounds_must_be_numbers(bound):
    m = _template()
    _impl(m)["Resources"]["Distances"][0]["Constraints"] = [bound]
    assert f"{IMPL}.Resources.Distances[0].Constraints[0]" in _violations(m)


@pytest.mark.parametrize("text", ["[" * 50000 + "]" * 50000, '{"Name": "x", "Modules": ' + "[" * 50000 + "]" * 50000 + "}"])
def test_deeply_nested_json_is_rejected(text):
    assert "nested too deeply" in _violations(text)["manifest"]
    with pytest.raises(InvalidArgument) as e:
        parse_slo(text, parse_manifest(TEMPLATE))
    assert "nested too deeply" in e.value.violations[0].description


@pytest.mark.parametrize("text,says", [
    ("(" * 3000 + "%master_cores" + ")" * 3000 + " > 0", "too long"),
    (" + ".join(["%master_cores"] * 1500) + " > 0", "too long"),
    ("(" * 300 + "%master_cores" + ")" * 300 + " > 0", "nested too deeply"),
    ("-" * 300 + "%master_cores < 0", "nested too deeply"),
    ("not " * 100 + "%master_cores > 0", "nested too deeply"),
    ("+".join(["%arg1"] * 150) + " > 0", "too many operators"),
])
def test_expression_size_is_bounded(text, says):
    with pytest.raises(expr.ExprError) as e:
        expr.parse(text)
    assert says in str(e.value)
    m = _template()
    _impl(m)["GlobalConstraints"] = [text]
    assert says in _violations(m)[f"{IMPL}.GlobalConstraints[0]"]


def test_expressions_within_the_bounds_still_parse():
    node = expr.parse("(" * expr.MAX_NESTING + "1" + ")" * expr.MAX_NESTING + " > 0")
    assert expr.holds(node, {})
    assert expr.evaluate(expr.parse("+".join(["1"] * expr.MAX_DEPTH)), {}) == expr.MAX_DEPTH


def test_slo_bounds_are_bounded_and_finite():
    manifest = parse_manifest(TEMPLATE)
    for bound, says in [("(" * 3000 + "1" + ")" * 3000, "too long"), ("+".join(["1"] * 150), "too many operators"),
                        ("1 / 0", "finite")]:
        with pytest.raises(InvalidArgument) as e:
            parse_slo(json.dumps({"Objective": {"Constraints": [f"%cost <= {bound}"]}}), manifest)
        assert says in e.value.violations[0].description
        assert e.value.violations[0].field == "slo.Objective.Constraints[0]"


def test_modulo_of_infinity_is_nan_and_not_satisfied():
    assert math.isnan(expr.evaluate(expr.parse("(1 / 0) % 2"), {}))
    assert not expr.holds(expr.parse("(1 / 0) % 2"), {})
    assert not expr.holds(expr.parse("(1 / 0) % 2 or 0 > 1"), {})
    m = _template()
    _impl(m)["GlobalConstraints"] = ["(%master_ram / 0) % 2 == 0 or %master_cores < 3"]
    space = _submit(m)
    assert {c["%master_cores"] for c in space.configs} == {1, 2}
    _impl(m)["GlobalConstraints"] = ["(%master_ram / 0) % 2 == 0"]
    assert "no configuration satisfies" in _violations(m)["manifest"]


@pytest.mark.parametrize("spec", [{"Var": "%design", "Value": "black_scholes"},
                                  {"Var": "%design", "Values": ["black_scholes", "heston"]}])
def test_a_constraint_on_a_text_attribute_names_the_variable(spec):
    m = _template()
    _impl(m)["Resources"]["Groups"].append({"GroupID": "dfe", "Type": "FPGA", "Attributes": {"design": spec}})
    _impl(m)["GlobalConstraints"] = ["%master_cores >= 2", "%design == 1"]
    v = _violations(m)
    assert "%design" in v[f"{IMPL}.GlobalConstraints[1]"] and "text" in v[f"{IMPL}.GlobalConstraints[1]"]
    assert f"{IMPL}.GlobalConstraints[0]" not in v
    _impl(m)["GlobalConstraints"] = ["%master_cores >= 2"]
    space = _submit(m)
    assert {c["%master_cores"] for c in space.configs} == {2, 3, 4}


def test_a_constraint_on_a_text_parameter_names_the_variable():
    m = _template()
    m["Modules"][0]["Parameters"].append({"Var": "%size", "Values": ["small", "large"]})
    _impl(m)["GlobalConstraints"] = ["%size > 1"]
    assert "%size" in _violations(m)[f"{IMPL}.GlobalConstraints[0]"]


def _renamed(obj: dict, old: str, new: str) -> None:
    obj[new] = obj.pop(old)


@pytest.mark.parametrize("edit,where,meant", [
    (lambda m: _renamed(_impl(m), "GlobalConstraints", "GlobalConstraint"), f"{IMPL}.GlobalConstraint",
     "GlobalConstraints"),
    (lambda m: _renamed(_impl(m)["Resources"], "Distances", "Distance"), f"{IMPL}.Resources.Distance", "Distances"),
    (lambda m: _renamed(_impl(m)["Resources"]["Groups"][0], "Attributes", "Atributes"), f"{GROUP0}.Atributes",
     "Attributes"),
    (lambda m: _renamed(_impl(m)["Resources"]["Groups"][0]["Attributes"]["Memory"], "Values", "Value_s"),
     f"{GROUP0}.Attributes.Memory.Value_s", "Values"),
    (lambda m: _renamed(m["Modules"][0]["Parameters"][0], "Default", "Defualt"),
     "manifest.Modules[0].Parameters[0].Defualt", "Default"),
    (lambda m: _renamed(m["Modules"][0], "Implementations", "Implementation"), "manifest.Modules[0].Implementation",
     "Implementations"),
])
def test_a_misspelt_manifest_key_is_refused_naming_the_key_meant(edit, where, meant):
    m = _template()
    edit(m)
    v = _violations(m)
    assert v[where] == f"unknown key: did you mean {meant!r}? (as written it would be ignored)", v


@pytest.mark.parametrize("slo,where,meant", [
    ({"Objective": {"Constraint": ["%cost <= 0.0000001"], "Optimize": "%execution_time"}}, "slo.Objective.Constraint",
     "Constraints"),
    ({"Objectives": {"Constraints": ["%cost <= 1"]}}, "slo.Objectives", "Objective"),
    ({"Objective": {"Optimise": "%execution_time"}}, "slo.Objective.Optimise", "Optimize"),
    ({"Parameter": {"%arg1": 10}}, "slo.Parameter", "Parameters"),
])
def test_a_misspelt_slo_key_is_refused_rather_than_its_bound_dropped(slo, where, meant):
    v = _violations(_template(), json.dumps(slo))
    assert v[where] == f"unknown key: did you mean {meant!r}? (as written it would be ignored)", v


def test_keys_unlike_any_known_one_and_any_letter_case_stay_accepted():
    m = _template()
    m["Description"] = "an annotation Harness has no use for"
    _impl(m)["Notes"] = ["kept as written"]
    _renamed(_impl(m), "GlobalConstraints", "globalconstraints")
    assert len(_submit(m, json.dumps({"objective": {"optimize": "%cost"}, "Comment": "x"}))) == 4 * 3
