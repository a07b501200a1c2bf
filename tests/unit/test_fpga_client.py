"""The client library (irm_fpga.client.VirtualFpga) against in-process FPGA-servers over gRPC.

What it guarantees (thesis §3.2.3-3.2.4): futures; an unbounded wait queue and a bounded number
in flight; tasks to each server part over one Execute stream, a lone task at once and alone, a
burst in batches; parts refreshed when the group moves; a lost part failing only its own tasks;
lock/unlock; revocation. No Orchestrator: attachments are built by hand (a fake answers
`refresh`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from dataclasses import dataclass, field

import pytest

from harness.v1 import fpga_pb2
from irm_fpga.client import TaskFailed, VirtualFpga
from irm_fpga.server import FpgaServerConfig, FpgaServerService, component
from services.server import Running, start
from tests.conftest import eventually


@dataclass
class Server:
    name: str
    running: Running
    svc: FpgaServerService
    batches: list[int] = field(default_factory=list)  # sizes of the batches its streams brought

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.running.port}"


@pytest.fixture
def servers() -> Iterator[Callable[[str], Server]]:
    started: list[Server] = []

    def make(name: str, devices: int = 2) -> Server:
        comp = component(FpgaServerConfig(name=name, devices=devices, reconfig_mean_s=0.0, reconfig_std_s=0.0))
        running = start("127.0.0.1:0", [comp])
        s = Server(name, running, comp.extra["server"])
        submit = s.svc._stream_submit

        def counted(client, st, batch):  # type: ignore[no-untyped-def]
            s.batches.append(len(batch.tasks))
            submit(client, st, batch)

        s.svc._stream_submit = counted  # type: ignore[method-assign]
        started.append(s)
        return s

    yield make
    for s in started:
        s.running.stop(0)


def part(s: Server, gid: str, client: str, size: int) -> fpga_pb2.AttachedPart:
    """A group part of `size` devices on `s` with `client` attached (token "tok-<client>")."""
    s.svc.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id=gid, design="sleep", size=size), None)
    s.svc.AttachClient(fpga_pb2.ServerAttachRequest(group_id=gid, client_id=client, token=f"tok-{client}"), None)
    eventually(lambda: s.svc.engine.group_info(gid).size == size, timeout=5)
    return fpga_pb2.AttachedPart(server=s.name, address=s.address, devices=size)


def attachment(gid: str, client: str, *parts: fpga_pb2.AttachedPart) -> fpga_pb2.Attachment:
    return fpga_pb2.Attachment(client_id=client, group_id=gid, token=f"tok-{client}", design="sleep", parts=parts)


def test_one_task_at_a_time_goes_alone_and_comes_back_at_once(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a")
    with VirtualFpga(attachment("g", "c", part(a, "g", "c", 1))) as f:
        took = []
        for _ in range(20):
            t0 = time.monotonic()
            out = f.submit({"duration": 0.005}).result(10)
            took.append(time.monotonic() - t0)
        assert (out.server, out.device, out.kind) == ("fpga-a", 0, fpga_pb2.Task.KIND_RUN)
        assert out.device_time_s == pytest.approx(0.005) and 0 <= out.queue_time_s < 0.05
        assert f.pending() == 0 and f.in_flight() == 0
    assert a.batches == [1] * 20  # no batching window: each went alone, as soon as it was submitted
    assert sorted(took)[10] < 0.1
    # the stream drove the engine itself, and drives nothing once it is owed nothing
    assert a.svc.waiting_handlers == 0 and a.svc.stream_driver is None


def test_a_burst_travels_in_batches_and_in_flight_is_bounded(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a")
    f = VirtualFpga(attachment("g", "c", part(a, "g", "c", 2)), max_in_flight=100, batch_size=40)
    try:
        futures = [f.submit({"duration": 0.0005}) for _ in range(600)]  # returns at once
        assert f.pending() > 300
        peak = 0
        while not all(fu.done() for fu in futures):
            peak = max(peak, f.in_flight())
            wait([futures[-1]], timeout=0.005)
        outs = [fu.result() for fu in futures]
    finally:
        f.close()
    assert 0 < peak <= 100
    assert sorted(o.id for o in outs) == list(range(1, 601))
    assert {o.device for o in outs} == {0, 1}
    assert sum(a.batches) == 600 and max(a.batches) <= 40
    assert len(a.batches) < 300  # many went together


def test_a_lost_part_fails_only_its_own_tasks(servers) -> None:  # type: ignore[no-untyped-def]
    a, b = servers("fpga-a"), servers("fpga-b")
    f = VirtualFpga(attachment("g", "c", part(a, "g", "c", 1), part(b, "g", "c", 1)))
    try:
        futures = [f.submit({"duration": 0.4}) for _ in range(4)]  # a, b, a, b
        eventually(lambda: b.svc.engine.group_info("g").running == 1, timeout=5)
        b.running.stop(0)  # the server goes away with two of our tasks
        failed = [fu for fu in futures if isinstance(fu.exception(10), TaskFailed)]
        assert len(failed) == 2 and all("fpga-b" in str(fu.exception()) for fu in failed)
        done = [fu.result() for fu in futures if fu not in failed]
        assert [o.server for o in done] == ["fpga-a", "fpga-a"]
        assert [p.part.server for p in f._parts] == ["fpga-a"]  # until a refresh finds it again
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-a"
    finally:
        f.close(detach=False)


def test_lock_holds_one_device_until_unlock(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a", devices=3)
    with VirtualFpga(attachment("g", "c", part(a, "g", "c", 3))) as f:
        locked = f.lock()
        assert locked.kind == fpga_pb2.Task.KIND_LOCK
        outs = [fu.result(10) for fu in [f.submit({"duration": 0.002}) for _ in range(12)]]
        assert {o.device for o in outs} == {locked.value["device"]}
        with pytest.raises(RuntimeError, match="already locked"):
            f.lock()
        assert f.unlock().kind == fpga_pb2.Task.KIND_UNLOCK
        outs = [fu.result(10) for fu in [f.submit({"duration": 0.005}) for _ in range(30)]]
        assert len({o.device for o in outs}) > 1


def test_revocation_fails_the_clients_tasks_and_ends_its_stream(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a")
    f = VirtualFpga(attachment("g", "c", part(a, "g", "c", 1)))
    try:
        futures = [f.submit({"duration": 0.1}) for _ in range(5)]
        eventually(lambda: a.svc.engine.group_info("g").running == 1, timeout=5)
        assert a.svc.RevokeClient(fpga_pb2.ServerClientRequest(client_id="c"), None).cancelled == 4
        errors = [str(fu.exception(10)) for fu in futures]
        assert errors == ["revoked"] * 5  # the running one too: its result goes to nobody
        late = f.submit({"duration": 0.001})  # refused by the server: the stream ends with the reason
        assert isinstance(late.exception(10), TaskFailed) and "NOT_FOUND" in str(late.exception())
        eventually(lambda: f._parts == [], timeout=5)
    finally:
        f.close(detach=False)


class FakeOrchestrator:
    def __init__(self, att: fpga_pb2.Attachment) -> None:
        self.att = att

    def AttachClient(self, request, timeout=None):  # type: ignore[no-untyped-def]  # noqa: N802
        assert request.client_id == self.att.client_id
        return self.att


def test_refresh_follows_the_group_onto_and_off_servers(servers) -> None:  # type: ignore[no-untyped-def]
    a, b = servers("fpga-a"), servers("fpga-b")
    pa, pb = part(a, "g", "c", 1), part(b, "g", "c", 1)
    orch = FakeOrchestrator(attachment("g", "c", pa))
    f = VirtualFpga(orch.att, orchestrator=orch, refresh_s=0)  # type: ignore[arg-type]
    try:
        assert {f.submit({"duration": 0.001}).result(10).server for _ in range(4)} == {"fpga-a"}
        orch.att = attachment("g", "c", pa, pb)  # grown onto b
        f.refresh()
        outs = [fu.result(10) for fu in [f.submit({"duration": 0.002}) for _ in range(8)]]
        assert {o.server for o in outs} == {"fpga-a", "fpga-b"}
        orch.att = attachment("g", "c", fpga_pb2.AttachedPart(server="fpga-a", address=a.address, devices=0), pb)
        f.refresh()  # shrunk off a
        assert {f.submit({"duration": 0.001}).result(10).server for _ in range(4)} == {"fpga-b"}
    finally:
        f.close(detach=False)


def test_close_waits_for_what_is_in_flight(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a")
    f = VirtualFpga(attachment("g", "c", part(a, "g", "c", 1)))
    futures = [f.submit({"duration": 0.02}) for _ in range(5)]
    f.close(detach=False)
    assert [fu.result(0).id for fu in futures] == [1, 2, 3, 4, 5]
    eventually(lambda: a.svc.sinks == {}, timeout=5)


def test_futures_complete_from_many_submitting_threads(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a", devices=4)
    with VirtualFpga(attachment("g", "c", part(a, "g", "c", 4)), max_in_flight=16, batch_size=8) as f:
        got: list[list[int]] = [[] for _ in range(4)]

        def run(i: int) -> None:
            for _ in range(25):
                got[i].append(f.submit({"duration": 0.001}).result(10).id)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    ids = [i for g in got for i in g]
    assert len(ids) == 100 and len(set(ids)) == 100


def test_clients_sharing_a_group_each_get_their_own_results(servers) -> None:  # type: ignore[no-untyped-def]
    a = servers("fpga-a", devices=3)
    parts = [part(a, "g", c, 3) for c in ("x", "y", "z")]  # the part is created once, then reused
    clients = [VirtualFpga(attachment("g", c, p), batch_size=50) for c, p in zip("xyz", parts, strict=True)]
    try:
        futures = {f.client_id: [f.submit({"duration": 0.0005}) for _ in range(300)] for f in clients}
        lone = clients[0].submit({"duration": 0.001})
        for fs in futures.values():
            assert sorted(fu.result(30).id for fu in fs) == list(range(1, 301))
        assert lone.result(30).id == 301
    finally:
        for f in clients:
            f.close(detach=False)
    eventually(lambda: a.svc.sinks == {} and a.svc.stream_driver is None and a.svc.waiting_handlers == 0,
               timeout=5)
    assert not a.svc.streams_waiting
