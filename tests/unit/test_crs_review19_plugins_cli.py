"""Review 19: `harness reserve` used a random request id it never printed, so a call that failed with no definite
answer (DEADLINE_EXCEEDED, UNAVAILABLE, CANCELLED, UNKNOWN: the reservation may have been made) could be neither
retried nor found. It now prints the id and the command that sends the same request again under it; that command
must parse back to the very request (tests/integration/test_crs_review19_plugins_grpc.py runs it against a slow
CRS)."""

from __future__ import annotations

import shlex

import pytest

from harness.v1 import irm_pb2
from services import cli
from services.commands import _group, _group_text, _reserve_command


@pytest.mark.parametrize("text", [
    "name=web,count=2,cores=2,memory_gb=4",
    "cores=1",
    "name=db,type=vm,cores=4,memory_gb=16,traits=ssd+avx512,not_traits=gpu",
    "name=f,type=vfpga,devices=2,design=sleep",
    "name=x,cores=0.1,memory_gb=1e-07,frequency_ghz=2.0..3.0",
    "name=y,frequency_ghz=2.5..,bandwidth=..10,latency=..,count=0",
    "name=z,type=,cores=123456789012345678",
])
def test_a_group_is_written_back_as_the_text_that_parses_to_it(text: str) -> None:
    g = _group(text)
    assert _group(_group_text(g)) == g


def test_the_retry_command_parses_to_the_same_request() -> None:
    argv = ["reserve", "--state-dir", "/tmp/it's here", "--crs", "h:1", "--tenant", "t", "--priority", "-3",
            "--max-price", "0.1", "--timeout", "2.5", "--group", "name=a,cores=2",
            "--group", "name=b,type=gadget,units=1", "--constraint", "hops(a, b) <= 2",
            "--constraint", "different_host(b, b)"]
    args = cli.build_parser().parse_args(argv)
    req = irm_pb2.ReserveRequest(tenant=args.tenant, request_id="rid-1", groups=args.group, priority=args.priority,
                                 constraints=[irm_pb2.GroupConstraint(expression=c) for c in args.constraint],
                                 max_price_per_minute=args.max_price)
    line = _reserve_command(args, req)
    words = shlex.split(line)
    assert words[:2] == ["harness", "reserve"]
    parse = cli.build_parser().parse_args
    assert parse(words[1:]) == parse([*argv, "--request-id", "rid-1"])


def test_a_crs_that_is_not_there_is_no_doubt(unused_address, capsys) -> None:
    # Nothing listens there: the request was never sent, so there is no reservation to retry or find.
    assert cli.main(["reserve", "--crs", unused_address(), "--tenant", "t", "--group", "cores=1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: UNAVAILABLE") and "is a suite running there?" in err, err
    assert "request id" not in err and "--request-id" not in err, err


def _reserve_refused(capsys, error) -> str:  # type: ignore[no-untyped-def]
    """`harness reserve` against a CRS that refuses with `error` (a HarnessError, its details sent as the CRS's
    are): its exit status must be 1; its stderr."""
    from concurrent import futures

    import grpc
    from grpc_status import rpc_status

    from harness.v1 import irm_pb2_grpc
    from services.errors import to_status

    class Crs(irm_pb2_grpc.ResourceManagerServicer):
        def Reserve(self, request, context):  # noqa: N802, ANN001, ANN201
            context.abort_with_status(rpc_status.to_status(to_status(error)))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    irm_pb2_grpc.add_ResourceManagerServicer_to_server(Crs(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert cli.main(["reserve", "--crs", f"127.0.0.1:{port}", "--tenant", "t", "--group", "cores=1"]) == 1
    finally:
        server.stop(None)
    return capsys.readouterr().err


def test_a_crs_saying_a_manager_refused_its_credentials_is_no_doubt_and_no_retry(capsys) -> None:
    # The operators' review: "nothing was reserved", then "no answer came, so the reservation may have been made"
    # and a command to retry it -- which cannot help before the operators give the services the same tokens.
    from services.errors import CREDENTIALS_REFUSED, Unavailable

    err = _reserve_refused(capsys, Unavailable("manager 'site-b': the call carries a delegation token this service "
                                               "does not accept; nothing was reserved").with_reason(CREDENTIALS_REFUSED,
                                                                                                    None))
    assert err.startswith("error: UNAVAILABLE: manager 'site-b'") and "nothing was reserved" in err, err
    assert "may have been made" not in err and "--request-id" not in err, err


def test_a_considered_manager_unavailable_prints_a_retry_but_no_if_it_was_made(capsys) -> None:
    # Review 25: "nothing was reserved" (the CRS's considered answer), then "If it was made, ..." after the retry.
    from services.errors import MANAGER_UNAVAILABLE, Unavailable

    err = _reserve_refused(capsys, Unavailable("manager 'compute' did not answer (UNAVAILABLE); nothing was reserved, "
                                               "retry").with_reason(MANAGER_UNAVAILABLE, 2.0))
    assert "nothing was reserved" in err and "--request-id" in err, err        # a retry is offered
    assert "may have been made" not in err and "If it was made" not in err, err
