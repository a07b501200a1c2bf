"""CLI details a newcomer following README met (a documentation review): the retry command `harness reserve`
prints keeps the state directory it was given; `harness tenant` takes --file after its verb too (compose.yaml's
hint wrote it there); `harness tls generate` names compose paths compose reads as host paths."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from harness.v1 import irm_pb2
from services import cli
from services.commands import _compose_path, _reserve_command


def test_the_retry_command_keeps_a_state_dir_given_even_when_harness_home_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from services import commands

    monkeypatch.setattr(commands, "DEFAULT_STATE", "/srv/suite")     # HARNESS_HOME=/srv/suite where it ran
    args = cli.build_parser().parse_args(["reserve", "--state-dir", "/srv/suite", "--group", "cores=1"])
    req = irm_pb2.ReserveRequest(tenant="demo", request_id="rid", groups=args.group)
    words = shlex.split(_reserve_command(args, req))
    assert words[words.index("--state-dir") + 1] == "/srv/suite"


def test_tenant_takes_its_file_before_or_after_the_verb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "tenants.yaml"
    assert cli.main(["tenant", "add", "carol", "--file", str(file)]) == 0
    assert cli.main(["tenant", "--file", str(file), "add", "dave"]) == 0
    capsys.readouterr()
    assert cli.main(["tenant", "list", "--file", str(file)]) == 0
    assert capsys.readouterr().out.split() == ["carol", "dave"]


@pytest.mark.parametrize(("directory", "path"), [
    ("./tls", "./tls/services"), ("tls", "./tls/services"), ("/etc/harness/tls", "/etc/harness/tls/services"),
    ("../tls", "../tls/services"),
])
def test_tls_generate_names_compose_paths_as_host_paths(directory: str, path: str) -> None:
    # A bare `tls/services` is a named volume to compose, not the directory.
    assert _compose_path(directory, "services") == path


def test_a_managers_refusal_of_a_read_says_nothing_of_reserving() -> None:
    # GetMetrics through two CRSs said "...does not exist; nothing was reserved; nothing was reserved".
    import grpc

    from cross_resource_scheduler.refusals import err_from_rpc
    from tests.conftest import PeerError

    gone = PeerError(grpc.StatusCode.NOT_FOUND, "reservation 'r' does not exist")
    assert str(err_from_rpc("compute-a", gone, consequence="")) == \
        "manager 'compute-a': reservation 'r' does not exist"
    assert str(err_from_rpc("compute-a", gone)).endswith("; nothing was reserved")   # a Reserve's, as before


def test_status_takes_the_crss_refusal_of_an_irm_for_its_state() -> None:
    # The operators' review: an IRM with another control token showed "registered but marked down: its
    # crs_address setting must point at the CRS" -- the CRS knew it refused its heartbeats.
    from harness.v1 import registry_pb2
    from services.commands import _registration

    down = registry_pb2.ManagerInfo(name="compute-a", address="h:1", up=False,
                                    refused="UNAUTHENTICATED: the CRS (Heartbeat) takes control calls ...")
    entry = {"name": "compute", "address": "h:1", "manager": "compute-a"}
    _registration(entry, [down])
    assert entry["crs_registration"] == "registered_down" and entry["crs_refused"].startswith("UNAUTHENTICATED")
    entry = {"name": "compute", "address": "h:2", "manager": "compute-b"}
    _registration(entry, [down], [registry_pb2.RefusedRegistration(name="compute-b", address="h:2",
                                                                   refused="UNAUTHENTICATED: ...")])
    assert entry["crs_registration"] == "not_registered" and entry["crs_refused"] == "UNAUTHENTICATED: ..."
