"""JSON a request carries is refused where it holds a string no database or protobuf message takes (a lone UTF-16
surrogate from an escape such as \\ud800, a NUL from \\u0000), naming the string's path: a manifest with one was
INTERNAL at SubmitApplication, or stored and then broke every ListExecutions of the tenant (a tenant's review)."""

from __future__ import annotations

import base64
import json

import pytest

import examples
from application_manager.manifest import parse_manifest
from application_manager.slo import parse_slo
from harness.v1 import application_manager_pb2 as pb
from services import json_text, paging
from services.errors import InvalidArgument
from tests.unit.test_am_inputs import _am, _Ctx


@pytest.mark.parametrize(("text", "field", "problem"), [
    ('{"Name": "a\\ud800b"}', "m.Name", "lone UTF-16 surrogate"),
    ('{"a": [1, {"b\\udfff": 2}]}', "m.a[1]", "a key holds a lone UTF-16 surrogate"),
    ('{"a": ["x", "y\\u0000"]}', "m.a[1]", "NUL"),
    ('["\\ud83d"]', "m[0]", "lone UTF-16 surrogate"),
])
def test_an_unstorable_string_is_refused_at_its_path(text, field, problem):
    with pytest.raises(InvalidArgument) as e:
        json_text.loads(text, "m")
    assert [v.field for v in e.value.violations] == [field]
    assert problem in e.value.violations[0].description


def test_storable_text_and_surrogate_pairs_decode():
    assert json_text.loads('{"a": ["\\ud83d\\ude00", "é", 1.5, null]}', "m") == {"a": ["\U0001F600", "é", 1.5, None]}
    for bad, why in (("{", "not valid JSON"), ("[" * 100_000, "nested too deeply")):
        with pytest.raises(InvalidArgument, match=why):
            json_text.loads(bad, "m")


def test_a_decoded_manifest_or_slo_is_checked_too():
    manifest = json.loads(examples.manifest("rtm"))
    manifest["Name"] = "a\ud800"
    with pytest.raises(InvalidArgument) as e:
        parse_manifest(manifest, "manifest_json")
    assert [v.field for v in e.value.violations] == ["manifest_json.Name"]
    with pytest.raises(InvalidArgument) as e:
        parse_slo({"Manifest": "x", "Objective": "\x00"}, None, "slo_json")
    assert [v.field for v in e.value.violations] == ["slo_json.Objective"]


@pytest.mark.parametrize("where", ["Name", "ImplementationName"])
def test_the_application_manager_refuses_a_surrogate_and_its_listings_stay_served(tmp_path, monkeypatch, where):
    am = _am(tmp_path, monkeypatch)
    try:
        manifest = json.loads(examples.manifest("rtm"))
        slo = json.loads(examples.slo("rtm", rows=200, steps=20))
        if where == "Name":
            manifest["Name"] = slo["Manifest"] = "a\ud800b"
        else:
            manifest["Modules"][0]["Implementations"][0]["ImplementationName"] = "cpu\ud800"
        with pytest.raises(InvalidArgument) as e:
            am.SubmitApplication(pb.SubmitApplicationRequest(
                tenant="t", manifest_json=json.dumps(manifest), slo_json=json.dumps(slo), app_dir="/x"), _Ctx())
        path = "manifest_json.Name" if where == "Name" else \
            "manifest_json.Modules[0].Implementations[0].ImplementationName"
        assert [v.field for v in e.value.violations] == [path]
        assert am.ListApplications(pb.ListApplicationsRequest(tenant="t"), _Ctx()).applications == []
        assert list(am.ListExecutions(pb.ListExecutionsRequest(tenant="t"), _Ctx()).executions) == []
    finally:
        am.stop()


@pytest.mark.parametrize("key", ["\ud800", "a\x00"])
def test_a_page_token_with_an_unstorable_string_is_not_a_token(key):
    from application_manager.models import Application
    token = base64.b64encode(json.dumps([1.0, key]).encode(), altchars=b"-_").decode()
    with pytest.raises(InvalidArgument) as e:
        paging._position(token, [Application.created_at, Application.id])
    assert [v.field for v in e.value.violations] == ["page_token"]


def test_an_integer_beyond_pythons_digit_limit_is_refused_without_pythons_advice():
    # Python's message told a tenant (of any language) to call sys.set_int_max_str_digits().
    with pytest.raises(InvalidArgument) as e:
        json_text.loads('{"Memory": [' + "9" * 5000 + "]}", "manifest_json")
    (v,) = e.value.violations
    assert v.field == "manifest_json" and "integer of more than 4300 digits" in v.description
    assert "sys." not in v.description
