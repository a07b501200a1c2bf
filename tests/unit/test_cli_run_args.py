"""`harness run`'s own options are checked before anything is sent."""

from __future__ import annotations

import pytest

from services import cli


def test_an_env_option_without_a_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "res-1", "--env", "FOO", "--", "true"])
    assert e.value.code == 2
    assert "--env: 'FOO': expected NAME=VALUE" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["run", "res-1", "--env", "A=1=2", "--env", "B="])
    assert dict(args.env) == {"A": "1=2", "B": ""}


def _crs_holding(monkeypatch, held) -> None:  # noqa: ANN001
    """`harness run`'s CRS stood in for: every GetReservation answers `held`."""
    from services import commands

    class Crs:
        def GetReservation(self, request, timeout):  # noqa: ANN001, ANN202, N802
            return held
    monkeypatch.setattr(commands, "_irm", lambda args: Crs())


def test_run_on_a_reservation_without_a_vm_says_what_it_holds(capsys, monkeypatch):
    from harness.v1 import irm_pb2

    _crs_holding(monkeypatch, irm_pb2.Reservation(id="res-1", groups=[irm_pb2.AllocatedGroup(
        name="f", resource_type="vfpga", resources=[irm_pb2.AllocatedResource(id="fg-1", address="127.0.0.1:1")])]))
    assert cli.main(["run", "res-1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "res-1 holds no VM to run on (it holds vfpga" in err and "FPGA client library" in err


def test_run_whose_agent_does_not_answer_names_the_agent_not_the_suite(capsys, monkeypatch):
    # The reservation's VM address stale (its agent restarted elsewhere) read "is a suite running there? ... give
    # --crs": the CRS had answered; the agent it named did not.
    import socket

    from harness.v1 import irm_pb2

    with socket.socket() as s:          # a port nothing listens on: bound, never listening, refuses connections
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        _crs_holding(monkeypatch, irm_pb2.Reservation(id="res-1", groups=[irm_pb2.AllocatedGroup(
            name="vm", resource_type="vm", resources=[irm_pb2.AllocatedResource(id="vm-1", address=address)])]))
        assert cli.main(["run", "res-1", "--", "true"]) == 1
    err = capsys.readouterr().err
    assert f"the VM's execution agent at {address}" in err and "harness reservations" in err
    assert "is a suite running there" not in err
