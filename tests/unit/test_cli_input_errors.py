"""`harness app` given a file it cannot read says `error: cannot read ...` and exits 2 -- no traceback, and no
request sent (a mistyped --slo is not "no SLO"). In-process, against a fake Application Manager."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from application_manager import cli as app_cli
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from services import server


class FakeAm(pb_grpc.ApplicationManagerServicer):
    """Records what it is sent; answers as if all went well."""

    def __init__(self) -> None:
        self.submitted: list[pb.SubmitApplicationRequest] = []
        self.executed: list[pb.ExecuteApplicationRequest] = []

    def SubmitApplication(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self.submitted.append(request)
        return pb.Application(id="app-1")

    def ExecuteApplication(self, request, context):  # type: ignore[no-untyped-def]  # noqa: N802
        self.executed.append(request)
        return pb.ApplicationExecution(state=pb.ApplicationExecution.STATE_SUCCEEDED)


@pytest.fixture
def am() -> Iterator[tuple[FakeAm, str]]:
    fake = FakeAm()
    running = server.start("127.0.0.1:0", [server.Component(
        name="fake-am", register=lambda s: pb_grpc.add_ApplicationManagerServicer_to_server(fake, s),
        service_names=["harness.v1.ApplicationManager"])])
    try:
        yield fake, f"127.0.0.1:{running.port}"
    finally:
        running.stop(0)


def app(*argv: str) -> int:
    """`harness app ...` (the sub-commands as services.commands adds them)."""
    parser = argparse.ArgumentParser(prog="harness")
    app_cli.add_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["app", *argv])
    return int(args.func(args) or 0)


def test_submit_of_a_manifest_that_is_not_there(am, tmp_path: Path, capsys) -> None:
    fake, address = am
    assert app("submit", str(tmp_path / "nope" / "manifest.json"), "--am", address) == 2
    err = capsys.readouterr().err
    assert err == f"error: cannot read {tmp_path / 'nope' / 'manifest.json'}: No such file or directory\n"
    assert not fake.submitted


def test_submit_with_an_slo_that_is_not_there_sends_nothing(am, tmp_path: Path, capsys) -> None:
    fake, address = am
    (tmp_path / "manifest.json").write_text("{}")
    assert app("submit", str(tmp_path / "manifest.json"), "--slo", str(tmp_path / "slo.jsn"), "--am", address) == 2
    assert capsys.readouterr().err == f"error: cannot read {tmp_path / 'slo.jsn'}: No such file or directory\n"
    assert not fake.submitted


def test_submit_reads_the_default_slo_only_where_it_is(am, tmp_path: Path, capsys) -> None:
    fake, address = am
    (tmp_path / "manifest.json").write_text('{"Name": "x"}')
    assert app("submit", str(tmp_path / "manifest.json"), "--am", address) == 0
    (tmp_path / "slo.json").write_text('{"MaxTime": 5}')
    assert app("submit", str(tmp_path / "manifest.json"), "--am", address) == 0
    assert [(r.manifest_json, r.slo_json) for r in fake.submitted] == [('{"Name": "x"}', ""),
                                                                      ('{"Name": "x"}', '{"MaxTime": 5}')]


def test_submit_of_a_directory_or_binary_file(am, tmp_path: Path, capsys) -> None:
    fake, address = am
    assert app("submit", str(tmp_path), "--am", address) == 2
    assert capsys.readouterr().err == f"error: cannot read {tmp_path}: Is a directory\n"
    (tmp_path / "manifest.json").write_bytes(b"\xff\xfe{}")
    assert app("submit", str(tmp_path / "manifest.json"), "--am", address) == 2
    assert capsys.readouterr().err == f"error: cannot read {tmp_path / 'manifest.json'}: not UTF-8 text\n"
    assert not fake.submitted


def test_execute_with_an_slo_that_is_not_there(am, tmp_path: Path, capsys) -> None:
    fake, address = am
    assert app("execute", "app-1", "--slo", "/nope.json", "--am", address) == 2
    assert capsys.readouterr().err == "error: cannot read /nope.json: No such file or directory\n"
    assert not fake.executed
    (tmp_path / "slo.json").write_text('{"MaxCost": 1}')
    assert app("execute", "app-1", "--slo", str(tmp_path / "slo.json"), "--am", address) == 0
    assert [r.slo_json for r in fake.executed] == ['{"MaxCost": 1}']


def test_arguments_and_harness_variables_that_are_not_utf8_are_one_line_not_a_traceback(monkeypatch, capsys):
    # Review 25: `harness run VM -- echo $'caf\xe9'` (and --env, release, $HARNESS_TENANT) died in protobuf with a
    # UnicodeEncodeError traceback.
    from services import cli

    bad = os.fsdecode(b"caf\xe9")
    assert cli.main(["run", "vm-1", "--", "echo", bad]) == 2
    err = capsys.readouterr().err
    assert err == ("harness: argument 5 (b'caf\\xe9') is not valid UTF-8: Harness's API takes UTF-8 text only (a "
                   "file name of other bytes cannot be passed to a program either; rename it)\n")
    monkeypatch.setenv("HARNESS_TENANT", os.fsdecode(b"al\xffice"))
    assert cli.main(["reservations"]) == 2
    assert capsys.readouterr().err.startswith("harness: $HARNESS_TENANT is not valid UTF-8: ")
