"""`harness status`'s CRS registration check (services.commands.registrations_of) against a real CRS in this process:
an IRM that says its name and is not registered is a problem; one whose name could not be read (its
DescribeAllocationSpec failed: the FPGA IRM's waits on a hung FPGA-server) is only a warning."""

from __future__ import annotations

import pytest

from cross_resource_scheduler import service as crs_service
from services import commands
from services import server as srv


@pytest.fixture
def crs_address(tmp_path):
    comp = crs_service.component(crs_service.CrsConfig(
        address="127.0.0.1:0", database=f"sqlite:///{tmp_path / 'crs.db'}", seed=1))
    running = srv.start("127.0.0.1:0", [comp])
    yield f"127.0.0.1:{running.port}"
    running.stop(0.5)


def services_at(crs: str) -> list[dict]:
    return [{"name": "crs", "address": crs, "status": "SERVING"},
            {"name": "fpga", "address": "127.0.0.1:9", "status": "SERVING"}]


def test_an_irm_that_says_its_name_and_is_not_registered_is_a_problem(crs_address, monkeypatch):
    monkeypatch.setattr(commands, "_manager_name", lambda address, timeout: "fpga-lab")
    services = services_at(crs_address)
    report = commands.registrations_of(services, {"crs": crs_address}, grace=0.0)
    assert report["reachable"] and services[1]["crs_registration"] == "not_registered"
    assert len(report["problems"]) == 1 and "'fpga-lab'" in report["problems"][0] and not report["warnings"]


def test_an_irm_whose_name_could_not_be_read_is_a_warning_not_a_problem(crs_address, monkeypatch):
    monkeypatch.setattr(commands, "_manager_name", lambda address, timeout: "")
    services = services_at(crs_address)
    report = commands.registrations_of(services, {"crs": crs_address}, grace=0.0)
    assert services[1]["crs_registration"] == "not_registered"
    assert report["problems"] == []
    assert len(report["warnings"]) == 1 and "did not say the name it registers under" in report["warnings"][0]


def test_the_name_read_fails_quietly_on_an_address_nobody_serves():
    assert commands._manager_name("127.0.0.1:9", 0.5) == ""


def test_a_service_that_does_not_answer_is_a_problem_saying_what_to_do(crs_address, monkeypatch, capsys, tmp_path):
    # What the reviewer saw: a killed service, "ok": false and "problems": [] -- nothing said what to fix.
    import argparse
    import json

    from services import suite

    monkeypatch.setattr(suite, "addresses", lambda state_dir, hint="": {"crs": crs_address, "am": "127.0.0.1:9"})
    args = argparse.Namespace(state_dir=str(tmp_path), json=True, default_ports=False)
    assert commands.cmd_status(args) == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["ok"]
    assert len(out["problems"]) == 1
    assert out["problems"][0].startswith("am at 127.0.0.1:9 does not answer (UNAVAILABLE)")
    assert f"{tmp_path}/logs/am.log" in out["problems"][0]
    args.default_ports = True
    monkeypatch.setattr(suite, "DEFAULT_PORTS", {"crs": int(crs_address.rsplit(":", 1)[1]), "am": 9})
    assert commands.cmd_status(args) == 1
    assert "docker compose logs am" in json.loads(capsys.readouterr().out)["problems"][0]
