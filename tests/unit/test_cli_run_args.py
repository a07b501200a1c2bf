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


def test_run_on_a_reservation_without_a_vm_says_what_it_holds(capsys, monkeypatch):
    from harness.v1 import irm_pb2
    from services import commands

    held = irm_pb2.Reservation(id="res-1", groups=[irm_pb2.AllocatedGroup(
        name="f", resource_type="vfpga", resources=[irm_pb2.AllocatedResource(id="fg-1", address="127.0.0.1:1")])])

    class Crs:
        def GetReservation(self, request, timeout):  # noqa: ANN001, ANN202, N802
            return held
    monkeypatch.setattr(commands, "_irm", lambda args: Crs())
    assert cli.main(["run", "res-1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "res-1 holds no VM to run on (it holds vfpga" in err and "FPGA client library" in err
