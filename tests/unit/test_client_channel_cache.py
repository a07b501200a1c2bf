"""services.client's cached channels: one that failed to connect is not handed out again while it backs off."""

from __future__ import annotations

import grpc
import pytest

from harness.v1 import diagnostics_pb2, diagnostics_pb2_grpc
from services import client, server
from tests.conftest import start_again


def _ask(address: str) -> str:
    stub = diagnostics_pb2_grpc.DiagnosticsStub(client.channel(address))
    return stub.Echo(diagnostics_pb2.EchoRequest(payload=b"hi"), timeout=5).payload.decode()


def test_a_cached_channel_reaches_a_server_back_on_its_port_at_once() -> None:
    # The cached channel failed against the server that went away: it would refuse every call for its back-off
    # (up to 1 s), though a server answers on that port again (a restart; a test's new server on a reused port).
    first = server.start("127.0.0.1:0", [])
    address = f"127.0.0.1:{first.port}"
    try:
        assert _ask(address) == "hi"
        first.stop(0)
        with pytest.raises(grpc.RpcError) as gone:
            _ask(address)
        assert gone.value.code() == grpc.StatusCode.UNAVAILABLE
        second = start_again(lambda: server.start(address, []), "a server on the port let go")
        try:
            assert _ask(address) == "hi"
        finally:
            second.stop(0)
    finally:
        client.drop(address)


def test_a_cached_channel_that_works_is_reused() -> None:
    running = server.start("127.0.0.1:0", [])
    address = f"127.0.0.1:{running.port}"
    try:
        assert _ask(address) == "hi"
        assert client.channel(address) is client.channel(address)
    finally:
        running.stop(0)
        client.drop(address)
