"""Manifests and SLOs have a size limit and ListApplications pages: every Application message carries them, so
unbounded ones, all in one message, would soon exceed a client's receive limit.

The Application Manager runs in-process on SQLite; the CRS is out of reach, its offered types stood in for.
"""

from __future__ import annotations

import json

import pytest

import examples
from application_manager import service as svc
from harness.v1 import application_manager_pb2 as pb
from services.errors import InvalidArgument


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001 - the RPC never ends in these tests
        return True


@pytest.fixture
def am(tmp_path, monkeypatch):
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    yield am
    am.stop()


def _manifest_of(size: int, pad: str = "x") -> str:
    """The rtm example, padded through its Author to exactly `size` bytes of UTF-8."""
    data = json.loads(examples.manifest("rtm"))
    data["Author"] = ""
    base = len(json.dumps(data, ensure_ascii=False).encode())
    width = len(pad.encode())
    data["Author"] = pad * ((size - base) // width) + "x" * ((size - base) % width)
    text = json.dumps(data, ensure_ascii=False)
    assert len(text.encode()) == size
    return text


def _submit(am, manifest: str, slo: str = "") -> pb.Application:  # type: ignore[no-untyped-def]
    return am.SubmitApplication(pb.SubmitApplicationRequest(tenant="t", manifest_json=manifest, slo_json=slo,
                                                            app_dir="/x"), _Ctx())


def test_a_manifest_up_to_the_limit_is_accepted_and_one_byte_more_is_refused_naming_the_limit(am):
    limit = svc.MAX_MANIFEST_BYTES
    assert limit == 256 * 1024
    app = _submit(am, _manifest_of(limit))
    assert len(app.manifest_json.encode()) == limit
    with pytest.raises(InvalidArgument) as e:
        _submit(am, _manifest_of(limit + 1))
    (v,) = e.value.violations
    assert v.field == "manifest_json" and str(limit) in v.description and "256 KiB" in v.description
    assert [a.id for a in am.ListApplications(pb.ListApplicationsRequest(tenant="t"), _Ctx()).applications] \
        == [app.id]


def test_the_limit_counts_bytes_not_characters(am):
    # Fewer characters than the limit, more bytes (two per "é"): what a message's size counts.
    text = _manifest_of(svc.MAX_MANIFEST_BYTES + 2, pad="é")
    assert len(text) < svc.MAX_MANIFEST_BYTES
    with pytest.raises(InvalidArgument) as e:
        _submit(am, text)
    assert [v.field for v in e.value.violations] == ["manifest_json"]


def test_an_oversized_slo_is_refused_on_submission_and_on_execution(am):
    slo = {"Manifest": "RTM", "Objective": {"Optimize": "%execution_time"}, "Note": "x" * svc.MAX_SLO_BYTES}
    with pytest.raises(InvalidArgument) as e:
        _submit(am, examples.manifest("rtm"), json.dumps(slo))
    (v,) = e.value.violations
    assert v.field == "slo_json" and str(svc.MAX_SLO_BYTES) in v.description
    app = _submit(am, examples.manifest("rtm"))
    with pytest.raises(InvalidArgument) as e:
        am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id,
                                                           slo_json=json.dumps(slo)), _Ctx())
    assert [v.field for v in e.value.violations] == ["slo_json"]


def test_a_retry_of_an_accepted_application_is_answered_before_the_limits_are_checked(am, monkeypatch):
    request = pb.SubmitApplicationRequest(tenant="t", request_id="r1", app_dir="/x",
                                          manifest_json=examples.manifest("rtm"))
    first = am.SubmitApplication(request, _Ctx())
    big = _manifest_of(svc.MAX_MANIFEST_BYTES + 1)
    # Limits tightened since (an upgrade): the retry of what was accepted still gets its application.
    monkeypatch.setattr(svc, "MAX_MANIFEST_BYTES", 10)
    assert am.SubmitApplication(request, _Ctx()).id == first.id
    # Another request under the key is refused as such, not as too large.
    with pytest.raises(InvalidArgument) as e:
        am.SubmitApplication(pb.SubmitApplicationRequest(tenant="t", request_id="r1", app_dir="/x",
                                                         manifest_json=big), _Ctx())
    assert [v.field for v in e.value.violations] == ["request_id"]


def test_list_applications_pages_oldest_first(am):
    made = {_submit(am, examples.manifest("rtm")).id for _ in range(5)}
    pages, seen, token = [], [], ""
    while True:
        reply = am.ListApplications(pb.ListApplicationsRequest(tenant="t", page_size=2, page_token=token), _Ctx())
        pages.append(len(reply.applications))
        seen += [(a.created_at, a.id) for a in reply.applications]
        token = reply.next_page_token
        if not token:
            break
    assert pages == [2, 2, 1] and {i for _, i in seen} == made and seen == sorted(seen)
    with pytest.raises(InvalidArgument) as e:
        am.ListApplications(pb.ListApplicationsRequest(tenant="t", page_token="forged"), _Ctx())
    assert e.value.violations[0].field == "page_token"


def _implementations(n: int, cores: int, memories: int) -> str:
    """A manifest of `n` implementations with `cores` x `memories` configurations each."""
    def impl(i: int) -> dict:
        return {"ImplementationName": f"impl{i}", "Command": ["true"], "Resources": {"Groups": [{
            "GroupID": f"g{i}", "Role": "MASTER", "Type": "Machine", "NumInstances": {"Value": 1},
            "Attributes": {"Cores": {"Var": f"%c{i}", "Values": list(range(1, cores + 1))},
                           "Memory": {"Var": f"%m{i}", "Values": list(range(256, 256 + memories))}}}]}}
    return json.dumps({"Name": "Wide", "Modules": [{"ModuleName": "Main", "Parameters": [],
                                                    "Implementations": [impl(i) for i in range(n)]}]})


def test_the_configuration_cap_counts_every_implementation_together(am):
    # Each implementation is under the cap, their sum is not: a few kilobytes of manifest once asked
    # for 300,000 configurations (and 8 such implementations exhausted the AM's memory).
    from application_manager.space import MAX_CONFIGURATIONS
    per = 300 * 500
    assert per < MAX_CONFIGURATIONS < 2 * per
    with pytest.raises(InvalidArgument) as e:
        _submit(am, _implementations(2, 300, 500))
    (v,) = e.value.violations
    assert v.field.startswith("manifest") and str(2 * per) in v.description and str(MAX_CONFIGURATIONS) in v.description
    # Many small implementations are fine.
    app = _submit(am, _implementations(3, 4, 5))
    assert app.id
