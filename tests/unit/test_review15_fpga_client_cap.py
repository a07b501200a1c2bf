"""Review 15 of the client library (irm_fpga.client.VirtualFpga): a server refusing a part's stream as full, and
a client without a refresh loop losing its parts.

A server whose max_execute_streams are all open refuses one more stream (RESOURCE_EXHAUSTED, reason STREAM_CAP)
before reading any of it: the tasks sent on it never ran, so they go to the other parts (or wait for that one, up
to stream_cap_wait_s), never failing as "may not have run"; the part is tried again after a wait that doubles,
not at each refresh. Without a refresh loop (refresh_s=0), a stream that ends any way has the Orchestrator asked
once; if no part is left after that, what waits fails instead of waiting for ever.

In-process FPGA-servers over gRPC; Orchestrators are fakes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import grpc
import pytest

from harness.v1 import fpga_pb2
from irm_fpga import client as cl
from irm_fpga.client import VirtualFpga
from irm_fpga.server import FpgaServerConfig, component
from services.server import start
from tests.conftest import eventually
from tests.unit.test_review15_fpga_client_failures import (
    LOCK,
    Orchestrator,
    Refused,
    Server,
    _StandInPart,
    attach,
    attachment,
    failure,
    in_thread,
    part,
    result,
    sent_to,
)

FIRST, MOST = 0.05, 0.2   # the waits between tries of a full server, made short for the tests


@pytest.fixture
def servers() -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def make(name: str, devices: int = 1, max_execute_streams: int = 64) -> Server:
        comp = component(FpgaServerConfig(name=name, devices=devices, reconfig_mean_s=0.0, reconfig_std_s=0.0,
                                          max_execute_streams=max_execute_streams))
        s = Server(name, start("127.0.0.1:0", [comp]), comp.extra["server"])
        started.append(s)
        return s

    yield make
    for s in started:
        s.running.stop(0)


@pytest.fixture
def fast_retries(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cl, "_FULL_RETRY_FIRST_S", FIRST)
    monkeypatch.setattr(cl, "_FULL_RETRY_MAX_S", MOST)


def full_server(servers: Callable[..., Server]) -> tuple[Server, fpga_pb2.AttachedPart, VirtualFpga, list[float]]:
    """fpga-a, whose one Execute stream another client ("o") holds; client "c" is attached there too. Returns its
    part for "c", the other client, and the times fpga-a refused a stream as full (from now on)."""
    a = servers("fpga-a", max_execute_streams=1)
    pa = part(a, "g", "c", 1)
    attach(a, "g", "o")
    other = VirtualFpga(attachment("g", "o", pa), refresh_s=0)
    eventually(lambda: a.svc.streams.open == 1, timeout=5, what="the other client's stream")
    refusals: list[float] = []
    refuse = a.svc.streams._refuse

    def counted(*args):  # type: ignore[no-untyped-def]
        refusals.append(time.monotonic())
        return refuse(*args)

    a.svc.streams._refuse = counted
    return a, pa, other, refusals


def ended_at(fut: Future) -> list[float]:
    """When `fut` ends (filled in by its callback, in the thread that ends it)."""
    box: list[float] = []
    fut.add_done_callback(lambda _: box.append(time.monotonic()))
    return box


# -- 1. a stream refused as full --------------------------------------------------------------------------------

def test_tasks_sent_on_a_stream_refused_as_full_go_to_the_other_part(servers, fast_retries) -> None:  # type: ignore[no-untyped-def]
    a, pa, other, refusals = full_server(servers)
    b = servers("fpga-b")
    pb = part(b, "g", "c", 1)
    # fpga-a refuses "c"'s stream only once the test has put tasks on it (as when they race the refusal).
    gate = threading.Event()
    take = a.svc.streams.take

    def gated(*context):  # type: ignore[no-untyped-def]
        gate.wait(10)
        take(*context)

    a.svc.streams.take = gated
    f = VirtualFpga(attachment("g", "c", pa, pb), refresh_s=0)
    try:
        futures = [f.submit({"duration": 0.001}) for _ in range(4)]    # a, b, a, b
        assert len(f._all["fpga-a"].sent) == 2
        gate.set()
        assert [fu.result(10).server for fu in futures] == ["fpga-b"] * 4   # none failed: none had run
        assert len(refusals) >= 1 and f.pending() == 0
        other.close(detach=False)              # a stream free at fpga-a: its next try takes it
        eventually(lambda: f.submit({"duration": 0.001}).result(10).server == "fpga-a", timeout=10,
                   what="a task run at fpga-a again")
    finally:
        f.close(detach=False)
        other.close(detach=False)


def test_with_no_other_part_tasks_wait_for_a_full_server_tried_ever_more_rarely(servers, fast_retries) -> None:  # type: ignore[no-untyped-def]
    a, pa, other, refusals = full_server(servers)
    f = VirtualFpga(attachment("g", "c", pa), refresh_s=0)
    try:
        eventually(lambda: refusals, timeout=5, what="the first refusal")
        futures = [f.submit({"duration": 0.001}) for _ in range(3)]
        eventually(lambda: len(refusals) >= 5, timeout=10, what="four more tries")
        assert not any(fu.done() for fu in futures)      # waiting, not failed as "may not have run"
        gaps = [t - s for s, t in zip(refusals[:4], refusals[1:5], strict=True)]
        # Each try waits twice as long as the one before, up to MOST (never sooner: a timer, then a round trip).
        assert all(gap >= min(FIRST * 2 ** i, MOST) * 0.99 for i, gap in enumerate(gaps)), gaps
        other.close(detach=False)
        assert [fu.result(10).server for fu in futures] == ["fpga-a"] * 3
    finally:
        f.close(detach=False)
        other.close(detach=False)


def test_tasks_waiting_for_a_full_server_past_stream_cap_wait_s_fail_saying_it_refused(servers, fast_retries) -> None:  # type: ignore[no-untyped-def]
    a, pa, other, refusals = full_server(servers)
    f = VirtualFpga(attachment("g", "c", pa), refresh_s=0, stream_cap_wait_s=0.5)
    try:
        eventually(lambda: refusals, timeout=5, what="the first refusal")
        fut = f.submit({"duration": 0.001})
        ended = ended_at(fut)
        assert not fut.done()
        said = failure(fut)
        assert ended[0] - refusals[0] >= 0.5                   # it waited its time
        assert "fpga-a" in said and "refused this client's stream as full" in said, said
        assert "max_execute_streams" in said and "stream_cap_wait_s=0.5" in said, said
        assert "may not have run" not in said, said
        later = f.submit({"duration": 0.001})                  # while the server is still full: the same
        assert "refused this client's stream as full" in failure(later)
        assert f.pending() == 0 and f.in_flight() == 0
    finally:
        f.close(detach=False)
        other.close(detach=False)


def test_the_refresh_loop_leaves_a_part_refused_as_full_to_its_own_retries(servers, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cl, "_FULL_RETRY_FIRST_S", 30.0)      # no retry during the test
    a, pa, other, refusals = full_server(servers)
    b = servers("fpga-b")
    orch = Orchestrator(attachment("g", "c", pa, part(b, "g", "c", 1)))
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=0.02)  # type: ignore[arg-type]
    try:
        eventually(lambda: refusals, timeout=5, what="the first refusal")
        seen = orch.attaches
        eventually(lambda: orch.attaches >= seen + 10, timeout=10, what="ten refresh rounds")
        assert len(refusals) == 1                     # not reopened by a refresh, to be refused again
        assert [fu.result(10).server for fu in [f.submit({"duration": 0.001}) for _ in range(6)]] == ["fpga-b"] * 6
    finally:
        f.close(detach=False)
        other.close(detach=False)


def test_a_lock_sent_on_a_stream_refused_as_full_is_taken_on_another_part(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cl, "_Part", _StandInPart)
    monkeypatch.setattr(cl, "_FULL_RETRY_FIRST_S", 30.0)
    att = fpga_pb2.Attachment(client_id="c", group_id="g", token="t", design="sleep", parts=[
        fpga_pb2.AttachedPart(server=s, address="x", devices=1) for s in ("A", "B")])
    f = cl.VirtualFpga(att, refresh_s=0)
    try:
        t, box = in_thread(f.lock)
        a = sent_to(f, 1)
        assert a.part.server == "A"
        f._part_ended(a, "A: RESOURCE_EXHAUSTED: 1 Execute streams are open (max_execute_streams=1)",
                      grpc.StatusCode.RESOURCE_EXHAUSTED, full=True)
        b = sent_to(f, 1)                                      # the LOCK again, at B: it never ran at A
        assert b.part.server == "B" and not box
        f._complete([result(1, kind=LOCK)])
        t.join(5)
        assert box["out"].kind == LOCK and f._lock_lost is None
        f.submit({"duration": 0.01})
        assert b.sent == {2}                                   # pinned to the lock, at B
    finally:
        f.close(detach=False)


# -- 2. no refresh loop -----------------------------------------------------------------------------------------

def test_without_a_refresh_loop_any_end_of_a_stream_asks_the_orchestrator_once(servers) -> None:  # type: ignore[no-untyped-def]
    a, b = servers("fpga-a"), servers("fpga-b")
    orch = Orchestrator(attachment("g", "c", part(a, "g", "c", 1)))
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=0)  # type: ignore[arg-type]
    try:
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
        orch.att = attachment("g", "c", part(b, "g", "c", 1))  # where the Orchestrator says the group is now
        a.running.stop(0)                                      # UNAVAILABLE, not a refusal of the client
        eventually(lambda: orch.attaches == 1, timeout=10, what="the Orchestrator asked")
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-b"
    finally:
        f.close(detach=False)


def test_without_a_refresh_loop_what_waits_fails_once_the_orchestrator_names_no_part(servers) -> None:  # type: ignore[no-untyped-def]
    a, b = servers("fpga-a"), servers("fpga-b")
    orch = Orchestrator(attachment("g", "c", part(a, "g", "c", 1)))
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=0, max_in_flight=1)  # type: ignore[arg-type]
    try:
        running = f.submit({"duration": 30.0})
        waiting = f.submit({"duration": 0.001})               # beyond max_in_flight
        eventually(lambda: a.svc.engine.group_info("g").running == 1, timeout=5)
        orch.attach_error = Refused(grpc.StatusCode.UNAVAILABLE, "FPGA-server 'fpga-a' did not answer")
        a.running.stop(0)
        assert "may not have run" in failure(running)
        said = failure(waiting)
        assert "no part of FPGA group 'g' is left" in said and "refresh_s=0" in said, said
        assert "FPGA-server 'fpga-a' did not answer" in said, said   # what the Orchestrator said
        assert orch.attaches == 1
        later = f.submit({"duration": 0.001})
        assert "no part of FPGA group 'g' is left" in failure(later, 0)
        assert f.pending() == 0 and f.in_flight() == 0
        # Not for good: a refresh that finds a part sends to it again.
        orch.attach_error, orch.att = None, attachment("g", "c", part(b, "g", "c", 1))
        f.refresh()
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-b"
    finally:
        f.close(detach=False)


def test_without_a_refresh_loop_a_part_that_ends_again_unanswered_is_not_asked_about_again(servers) -> None:  # type: ignore[no-untyped-def]
    # The Orchestrator keeps naming fpga-a, which this client cannot reach: asking again after each failed stream
    # would open and fail streams in a loop. One ask, then what waits fails.
    a = servers("fpga-a")
    orch = Orchestrator(attachment("g", "c", part(a, "g", "c", 1)))
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=0)  # type: ignore[arg-type]
    try:
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
        a.running.stop(0)
        eventually(lambda: orch.attaches == 1 and not f._parts and not f._asking and not f._all, timeout=10,
                   what="the stream the ask opened to fail too")
        said = failure(f.submit({"duration": 0.001}), 0)
        assert "no part of FPGA group 'g' is left" in said and "refresh_s=0" in said, said
        assert orch.attaches == 1
    finally:
        f.close(detach=False)
