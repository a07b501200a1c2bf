"""The per-server circuit breaker on the Orchestrator's server handles (irm_fpga.server_breaker).

An in-process FpgaServer bound to port 0 whose GetServer blocks on an Event plays a server that hangs (a stopped
process, a partition); calls go through `ServerHandle.stub()` as the Orchestrator's and the job manager's do.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest

from harness.v1 import fpga_pb2, fpga_pb2_grpc
from irm_fpga.jobs import JobManager, JobsConfig
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig, ServerHandle
from services import client as rpc
from services import server as srv
from services.errors import Unavailable, from_rpc_error
from tests.conftest import eventually, hold_port, until_ports_hold

TIMEOUT_S = 0.5         # the callers' deadline in these tests (server_timeout_s)
FAST_S = 0.25           # a call the breaker fails takes less than this (no deadline waited)


class HangingServer(fpga_pb2_grpc.FpgaServerServicer):
    """Answers GetServer and GetMeasurements, or, while `hang` is set, blocks them until it is cleared."""

    def __init__(self, name: str = "h") -> None:
        self.name = name
        self.hang = threading.Event()
        self.released = threading.Event()
        self.calls = 0

    def _wait(self) -> None:
        self.calls += 1
        while self.hang.is_set() and not self.released.wait(0.05):
            pass

    def GetServer(self, request, context):  # noqa: N802
        self._wait()
        return fpga_pb2.ServerInfo(name=self.name, devices=[fpga_pb2.DeviceInfo(index=i) for i in range(4)])

    def GetMeasurements(self, request, context):  # noqa: N802
        self._wait()
        return fpga_pb2.ServerMeasurements(usable_devices=4)

    def DeleteGroupPart(self, request, context):  # noqa: N802
        return fpga_pb2.DeleteGroupPartResponse()


def _serve(fake: HangingServer, address: str = "127.0.0.1:0") -> srv.Running:
    comp = srv.Component(name="fake-fpga-server", service_names=["harness.v1.FpgaServer"],
                         register=lambda server: fpga_pb2_grpc.add_FpgaServerServicer_to_server(fake, server))
    return srv.start(address, [comp])


@pytest.fixture
def hanging() -> Iterator[tuple[HangingServer, str]]:
    fake = HangingServer()
    running = _serve(fake)
    address = f"127.0.0.1:{running.port}"
    yield fake, address
    fake.released.set()
    running.stop(0)
    rpc.drop(address)


def _timed(call):  # type: ignore[no-untyped-def]
    t = time.monotonic()
    try:
        out = call()
    except grpc.RpcError as e:
        out = e
    return out, time.monotonic() - t


def _get(h: ServerHandle, timeout: float = TIMEOUT_S):  # type: ignore[no-untyped-def]
    return _timed(lambda: h.stub().GetServer(fpga_pb2.GetServerRequest(), timeout=timeout))


def test_after_a_timeout_calls_to_that_server_fail_at_once_like_a_real_failed_call(hanging):
    fake, address = hanging
    h = ServerHandle("h", address, backoff_s=30.0, backoff_max_s=60.0)
    assert _get(h)[0].name == "h"
    fake.hang.set()
    first, took = _get(h)
    assert isinstance(first, grpc.RpcError) and first.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert took >= TIMEOUT_S * 0.9                       # the first one costs its deadline ...
    asked = fake.calls
    for _ in range(5):                                   # ... the next ones nothing
        e, took = _get(h)
        assert took < FAST_S
        assert isinstance(e, grpc.RpcError) and e.code() == grpc.StatusCode.UNAVAILABLE
        assert "did not answer" in e.details() and "DEADLINE_EXCEEDED" in e.details() and "s from now" in e.details()
        assert e.trailing_metadata() == () and e.initial_metadata() == ()
        assert "did not answer" in str(e)
    # Another stub of the same handle, another method, as the job manager calls it: failed at once too.
    e, took = _timed(lambda: h.stub().GetMeasurements(fpga_pb2.GetMeasurementsRequest(), timeout=TIMEOUT_S))
    assert took < FAST_S and e.code() == grpc.StatusCode.UNAVAILABLE
    assert fake.calls == asked                           # none of them reached the server
    # As the Orchestrator passes a server's failure on: UNAVAILABLE, retry.
    assert isinstance(from_rpc_error("FPGA-server 'h'", e), Unavailable)
    # Futures, as a parallel ask makes them: a done, failed future with the same error.
    f = h.stub().GetServer.future(fpga_pb2.GetServerRequest(), timeout=TIMEOUT_S)
    assert f.done() and f.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as raised:
        f.result()
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE and "did not answer" in raised.value.details()
    assert f.exception() is not None and f.traceback() is not None


def test_once_the_back_off_passed_one_call_tries_it_with_a_short_deadline_and_an_answer_closes_it(hanging):
    fake, address = hanging
    # A back-off of 1 s: the checks made right after the failed probe fit well within its doubled 2 s.
    h = ServerHandle("h", address, backoff_s=1.0, backoff_max_s=5.0)
    h.breaker.probe_timeout_s = 0.3                      # type: ignore[union-attr]
    fake.hang.set()
    assert _get(h)[0].code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The back-off passes: one call tries the server, with a deadline of the probe's, not the caller's 10 s.
    eventually(lambda: h.breaker.retry_in() == 0.0, timeout=5, what="the back-off to pass")  # type: ignore[union-attr]
    probe, took = _get(h, timeout=10.0)
    assert probe.code() == grpc.StatusCode.DEADLINE_EXCEEDED and took < 2.0
    # It failed again: twice as long before the next try, and calls fail at once meanwhile.
    assert 1.0 < h.breaker.retry_in() <= 2.0 + 0.05      # type: ignore[union-attr]
    assert _get(h)[1] < FAST_S
    # The server answers again: once the back-off passed, the next call reaches it and closes the breaker.
    fake.hang.clear()
    fake.released.set()

    def answered() -> bool:
        out, took = _get(h)
        assert took < 2.0                                 # never a whole caller's deadline per try
        return not isinstance(out, grpc.RpcError) and out.name == "h"
    eventually(answered, timeout=10, what="the server to be called again once it answers")
    assert not h.breaker.is_open                          # type: ignore[union-attr]
    for _ in range(3):
        assert _get(h)[0].name == "h"


def test_a_server_that_refuses_connections_is_asked_every_time_and_used_as_soon_as_it_is_back():
    def refused_then_served() -> None:
        # The port held (bound, not listening) while the handle is refused there: nothing else can listen there
        # meanwhile. Let go for the server, another process may take it first: then all again on another port.
        held = hold_port()
        address = f"127.0.0.1:{held.getsockname()[1]}"
        h = ServerHandle("h", address, backoff_s=30.0, backoff_max_s=60.0)
        try:
            with held:
                for _ in range(3):
                    e, took = _get(h)
                    # gRPC's own fast failure (not the breaker's): nothing waited, nothing to protect callers from.
                    assert e.code() == grpc.StatusCode.UNAVAILABLE and "did not answer" not in (e.details() or "")
                    assert took < 1.0
                assert not h.breaker.is_open              # type: ignore[union-attr]
            fake = HangingServer()
            running = _serve(fake, address)
            try:
                # Back well before the breaker's 30 s: the channel's own reconnect (at most 1 s) is all it waits.
                eventually(lambda: not isinstance(_get(h)[0], grpc.RpcError), timeout=5,
                           what="the server used as soon as it answers")
            finally:
                running.stop(0)
        finally:
            rpc.drop(address)

    until_ports_hold(refused_then_served, "the FPGA-server")


def test_calls_already_out_when_it_opened_do_not_lengthen_the_back_off(hanging):
    fake, address = hanging
    h = ServerHandle("h", address, backoff_s=5.0, backoff_max_s=60.0)
    fake.hang.set()
    futures = [h.stub().GetServer.future(fpga_pb2.GetServerRequest(), timeout=TIMEOUT_S) for _ in range(4)]
    for f in futures:
        with pytest.raises(grpc.RpcError):
            f.result()
    assert 4.0 < h.breaker.retry_in() <= 5.0              # type: ignore[union-attr]  # one hang, one back-off


def test_a_handle_without_back_off_has_no_breaker(hanging):
    fake, address = hanging
    h = ServerHandle("h", address)                        # as the Orchestrator makes for a first contact
    assert h.breaker is None
    fake.hang.set()
    for _ in range(2):
        e, took = _get(h)
        assert e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and took >= TIMEOUT_S * 0.9


# Two timeouts in turn would take twice this: the bounds leave 0.8 of one for a loaded machine's delays.
PARALLEL_TIMEOUT_S = 2.0


@contextmanager
def three_servers(tmp_path) -> Iterator[tuple[list[HangingServer], Orchestrator]]:  # type: ignore[no-untyped-def]
    """Servers a, b, c mapped by an Orchestrator without a breaker: only asking in parallel keeps a round that meets
    hung servers at one timeout."""
    fakes = [HangingServer(name) for name in ("a", "b", "c")]
    running = [_serve(f) for f in fakes]
    addresses = [f"127.0.0.1:{r.port}" for r in running]
    o = Orchestrator(OrchestratorConfig(servers=addresses, database=f"sqlite:///{tmp_path}/orch.db", autoscaler="none",
                                        reconcile_interval_s=0, server_timeout_s=PARALLEL_TIMEOUT_S, server_backoff_s=0))
    try:
        o._discover_servers(strict=True)
        yield fakes, o
    finally:
        for f in fakes:
            f.released.set()
        o.stop()
        for r, a in zip(running, addresses, strict=True):
            r.stop(0)
            rpc.drop(a)


def test_the_orchestrator_asks_its_servers_at_once_so_two_hung_servers_cost_one_timeout(tmp_path):
    with three_servers(tmp_path) as (fakes, o):
        assert list(o._server_infos()) == ["a", "b", "c"]           # in the order of its servers
        fakes[1].hang.set()
        fakes[2].hang.set()
        infos, took = _timed(o._server_infos)
        assert list(infos) == ["a"]
        assert 0.9 * PARALLEL_TIMEOUT_S <= took < 1.8 * PARALLEL_TIMEOUT_S    # one timeout, not one per hung server
        _, took = _timed(lambda: o._free_total_capacity())
        assert took < 1.8 * PARALLEL_TIMEOUT_S


def test_the_job_manager_reads_progress_from_its_servers_at_once(tmp_path):
    with three_servers(tmp_path) as (fakes, o):
        manager = JobManager(o, JobsConfig())
        try:
            fakes[1].hang.set()
            fakes[2].hang.set()
            calls = [f.calls for f in fakes]
            _, took = _timed(lambda: manager._observe([]))
            assert [f.calls - c for f, c in zip(fakes, calls, strict=True)] == [1, 1, 1]   # every server was asked
            assert 0.9 * PARALLEL_TIMEOUT_S <= took < 1.8 * PARALLEL_TIMEOUT_S    # one timeout, not one per hung server
        finally:
            manager.stop()


def test_the_orchestrator_s_handles_have_the_breaker_and_a_bad_setting_is_refused(tmp_path, hanging):
    fake, address = hanging
    o = Orchestrator(OrchestratorConfig(servers=[address], database=f"sqlite:///{tmp_path}/orch.db",
                                        autoscaler="none", reconcile_interval_s=0, server_timeout_s=TIMEOUT_S,
                                        server_backoff_s=30.0))
    try:
        o._discover_servers(strict=True)
        fake.hang.set()
        assert o._server_infos() == {}                              # the first call waits its deadline ...
        infos, took = _timed(o._server_infos)
        assert infos == {} and took < FAST_S                        # ... then not again
        e, took = _timed(lambda: o.servers["h"].stub().GetMeasurements(   # as the job manager calls a server
            fpga_pb2.GetMeasurementsRequest(), timeout=o.config.server_timeout_s))
        assert took < FAST_S and e.code() == grpc.StatusCode.UNAVAILABLE and "did not answer" in e.details()
    finally:
        o.stop()
    for bad in ({"server_backoff_s": -1.0}, {"server_backoff_max_s": float("nan")}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            Orchestrator(OrchestratorConfig(servers=[address], database=f"sqlite:///{tmp_path}/bad.db",
                                            autoscaler="none", **bad))
