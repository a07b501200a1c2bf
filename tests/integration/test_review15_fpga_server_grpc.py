"""The FPGA-server over real gRPC, in this process (review 15): idle clients' streams do not starve the server's
other calls, a cancelled stream takes its queued tasks and its lock with it, a stopping server ends a stream
that still owes results UNAVAILABLE, RunDirect gives its device back when its caller gives up and takes the
control token, and the client library's batches survive a bad task and two processes attached as one client.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from harness.v1 import fpga_pb2, fpga_pb2_grpc
from irm_fpga.client import TaskFailed, VirtualFpga
from irm_fpga.server import FpgaServerConfig, FpgaServerService, component
from services import control
from services.server import Running, start
from services.tls import plain_channel
from tests.conftest import eventually


class Server:
    def __init__(self, **settings: object) -> None:
        devices = settings.pop("devices", 2)
        comp = component(FpgaServerConfig(name="fpga-a", devices=devices, reconfig_mean_s=0.0,  # type: ignore[arg-type]
                                          reconfig_std_s=0.0, **settings))  # type: ignore[arg-type]
        self.running: Running = start("127.0.0.1:0", [comp])
        self.svc: FpgaServerService = comp.extra["server"]
        self.address = f"127.0.0.1:{self.running.port}"
        self.channel = plain_channel(self.address)
        self.stub = fpga_pb2_grpc.FpgaServerStub(self.channel)
        self.stopped = False

    def part(self, gid: str, size: int, *clients: str) -> fpga_pb2.AttachedPart:
        self.svc.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id=gid, design="sleep", size=size), None)
        for c in clients:
            self.svc.AttachClient(fpga_pb2.ServerAttachRequest(group_id=gid, client_id=c, token=f"tok-{c}"), None)
        eventually(lambda: self.svc.engine.group_info(gid).size == size, timeout=5)
        return fpga_pb2.AttachedPart(server="fpga-a", address=self.address, devices=size)

    def stop(self, grace: float = 0.0) -> None:
        if not self.stopped:
            self.stopped = True
            self.running.stop(grace)
        self.channel.close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.stop()


def sleep_task(task_id: int, seconds: float, kind: int = fpga_pb2.Task.KIND_RUN) -> fpga_pb2.Task:
    t = fpga_pb2.Task(id=task_id, kind=kind)
    if kind == fpga_pb2.Task.KIND_RUN:
        t.params["duration"].number = seconds
    return t


def batch(client: str, *tasks: fpga_pb2.Task) -> fpga_pb2.TaskBatch:
    return fpga_pb2.TaskBatch(client_id=client, group_id="g", token=f"tok-{client}", tasks=tasks)


class Call:
    """An Execute call: batches in through `send`, results read by a thread until the call ends."""

    def __init__(self, stub: fpga_pb2_grpc.FpgaServerStub, first: fpga_pb2.TaskBatch) -> None:
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.inbox.put(first)
        self.results: list[fpga_pb2.TaskResult] = []
        self.error: grpc.RpcError | None = None
        self.call = stub.Execute(self._requests())
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _requests(self) -> Iterator[fpga_pb2.TaskBatch]:
        while (b := self.inbox.get()) is not None:
            yield b

    def _read(self) -> None:
        try:
            for rb in self.call:
                self.results.extend(rb.results)
        except grpc.RpcError as e:
            self.error = e

    def end(self) -> None:
        self.inbox.put(None)
        self.reader.join(10)
        assert not self.reader.is_alive()


def reason(e: grpc.RpcError) -> str:
    raw = dict(e.trailing_metadata() or ()).get("grpc-status-details-bin")
    for d in status_pb2.Status.FromString(raw).details if raw else ():
        info = error_details_pb2.ErrorInfo()
        if d.Unpack(info):
            return info.reason
    return ""


def test_idle_clients_streams_leave_worker_threads_for_every_other_call(server: Server) -> None:
    # 32 attached clients that sent nothing yet hold 32 Execute streams: on the 32 threads the server had, its
    # GetServer, control calls and RunBatch all waited for one of them to close.
    server.part("g", 2, "c")
    idle = [Call(server.stub, batch("c")) for _ in range(32)]
    eventually(lambda: server.svc.streams.open == 32, timeout=10)
    info = server.stub.GetServer(fpga_pb2.GetServerRequest(), timeout=5)
    assert len(info.devices) == 2
    (r,) = server.stub.RunBatch(batch("c", sleep_task(1, 0.01)), timeout=5).results
    assert r.error == ""
    for c in idle:
        c.end()
    eventually(lambda: server.svc.streams.open == 0, timeout=10)


def test_one_stream_over_the_cap_is_resource_exhausted_stream_cap() -> None:
    s = Server(max_execute_streams=2)
    try:
        s.part("g", 1, "c")
        open_ = [Call(s.stub, batch("c")) for _ in range(2)]
        eventually(lambda: s.svc.streams.open == 2, timeout=10)
        extra = Call(s.stub, batch("c"))
        extra.reader.join(10)
        assert extra.error is not None and extra.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason(extra.error) == "STREAM_CAP" and "max_execute_streams=2" in extra.error.details()
        # Other calls are not counted against it.
        assert s.stub.GetServer(fpga_pb2.GetServerRequest(), timeout=5).name == "fpga-a"
        for c in open_:
            c.end()
    finally:
        s.stop()


def test_a_cancelled_stream_does_not_leave_its_queued_tasks_ahead_of_the_clients_next(server: Server) -> None:
    server.part("g", 1, "c")
    c = Call(server.stub, batch("c", *(sleep_task(i, 0.5) for i in range(1, 21))))
    eventually(lambda: server.svc.engine.group_info("g").running == 1, timeout=5)
    c.call.cancel()
    c.reader.join(10)
    eventually(lambda: server.svc.engine.group_info("g").waiting == 0, timeout=5)
    # Behind the one task already running, not behind 19 orphans (9.5 s).
    (r,) = server.stub.RunBatch(batch("c", sleep_task(100, 0.01)), timeout=5).results
    assert r.error == "" and r.queue_time_s < 0.6


def test_a_lock_lasts_as_long_as_its_stream(server: Server) -> None:
    part = server.part("g", 2, "c")
    att = fpga_pb2.Attachment(client_id="c", group_id="g", token="tok-c", design="sleep", parts=[part])
    c = Call(server.stub, batch("c", sleep_task(1, 0, kind=fpga_pb2.Task.KIND_LOCK)))
    eventually(lambda: c.results, timeout=5)
    held = c.results[0].device
    c.call.cancel()      # a broken connection: nobody is left to unlock it
    c.reader.join(10)
    eventually(lambda: server.svc.engine.device_state(held).locked_by is None, timeout=5)
    # A client library closed while it holds a lock: the lock ends with its stream too.
    f = VirtualFpga(att, refresh_s=0)
    assert f.lock().kind == fpga_pb2.Task.KIND_LOCK
    f.close(detach=False)
    eventually(lambda: all(d.locked_by is None for d in server.svc.engine.device_states()), timeout=5)
    g = VirtualFpga(att, refresh_s=0)
    try:
        assert g.lock().kind == fpga_pb2.Task.KIND_LOCK
        outs = [g.submit({"duration": 0.01}) for _ in range(3)]
        assert len({o.result(10).device for o in outs}) == 1      # pinned to the new lock's device
        assert g.unlock().kind == fpga_pb2.Task.KIND_UNLOCK
    finally:
        g.close(detach=False)


def test_a_stopping_server_ends_a_stream_that_owes_results_unavailable() -> None:
    s = Server(devices=1)
    try:
        s.part("g", 1, "c")
        c = Call(s.stub, batch("c", *(sleep_task(i, 0.5) for i in range(1, 11))))
        eventually(lambda: s.svc.engine.group_info("g").running == 1, timeout=5)
        stopper = threading.Thread(target=s.stop, args=(3.0,), daemon=True)
        stopper.start()
        c.reader.join(10)
        assert c.error is not None and c.error.code() == grpc.StatusCode.UNAVAILABLE
        assert "the FPGA-server is stopping" in c.error.details()
        stopper.join(10)
    finally:
        s.stop()


def test_run_direct_gives_the_device_back_when_the_caller_gives_up(server: Server) -> None:
    with pytest.raises(grpc.RpcError) as e:
        server.stub.RunDirect(fpga_pb2.RunDirectRequest(device=0, design="sleep", task=sleep_task(1, 3600.0)),
                              timeout=0.5)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    eventually(lambda: server.svc.engine.device_state(0).state == "unassigned", timeout=3)
    part = server.part("g", 2)      # both devices: the one RunDirect had is back in the pool
    assert part.devices == 2
    with pytest.raises(grpc.RpcError) as e:
        server.stub.RunDirect(fpga_pb2.RunDirectRequest(device=9, design="sleep", task=sleep_task(1, 0.01)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "0..1" in e.value.details()


def test_run_direct_is_a_control_call() -> None:
    s = Server(control_token="secret")
    try:
        req = fpga_pb2.RunDirectRequest(device=1, design="sleep", task=sleep_task(1, 0.001))
        with pytest.raises(grpc.RpcError) as e:
            s.stub.RunDirect(req, timeout=5)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        trusted = fpga_pb2_grpc.FpgaServerStub(control.channel(s.channel, "secret"))
        assert trusted.RunDirect(req, timeout=5).device == 1
    finally:
        s.stop()


def test_the_client_library_runs_the_good_tasks_of_a_batch_with_a_bad_one(server: Server) -> None:
    part = server.part("g", 2, "c")
    f = VirtualFpga(fpga_pb2.Attachment(client_id="c", group_id="g", token="tok-c", design="sleep", parts=[part]),
                    refresh_s=0)
    try:
        blockers = [f.submit({"duration": 0.3}) for _ in range(2)]   # the burst queues up behind these
        good = [f.submit({"duration": 0.01}) for _ in range(20)]
        bad = f.submit({"duration": -1.0})
        good += [f.submit({"duration": 0.01}) for _ in range(20)]
        assert all(x.result(20).device_time_s == pytest.approx(0.01) for x in good)
        with pytest.raises(TaskFailed) as e:
            bad.result(20)
        assert str(e.value) == "task 23: sleep: 'duration' must be >= 0.0, got -1.0"
        for x in blockers:
            x.result(20)
    finally:
        f.close(detach=False)


def test_two_clients_attached_as_one_each_get_their_own_results(server: Server) -> None:
    part = server.part("g", 2, "worker")
    att = fpga_pb2.Attachment(client_id="worker", group_id="g", token="tok-worker", design="sleep", parts=[part])
    p1, p2 = VirtualFpga(att, refresh_s=0), VirtualFpga(att, refresh_s=0)
    try:
        x = p1.submit({"duration": 0.6})           # both are task 1
        eventually(lambda: server.svc.engine.group_info("g").running == 1, timeout=5)
        y = p2.submit({"duration": 0.05})
        assert y.result(10).device_time_s == pytest.approx(0.05)
        assert x.result(10).device_time_s == pytest.approx(0.6)
    finally:
        p1.close(detach=False)
        p2.close(detach=False)


def test_an_undecodable_batch_ends_the_execute_stream_invalid_argument_after_the_results_it_owed(
        server: Server) -> None:
    # protobuf.js sends a lone surrogate in a string as invalid UTF-8: grpc answered INTERNAL and lost the stream.
    server.part("g", 1, "c")
    good = batch("c", sleep_task(1, 0.01)).SerializeToString()
    bad = batch("c", sleep_task(2, 0.01)).SerializeToString().replace(b"tok-c", b"\xed\xa0\x80ok")
    call = server.channel.stream_stream("/harness.v1.FpgaServer/Execute", request_serializer=None,
                                        response_deserializer=fpga_pb2.ResultBatch.FromString)
    sent: queue.SimpleQueue = queue.SimpleQueue()

    def requests() -> Iterator[bytes]:
        yield good
        sent.get(timeout=10)        # the first task's result is in before the bad batch goes
        yield bad

    results = []
    with pytest.raises(grpc.RpcError) as info:
        for rb in call(requests(), timeout=10):
            results.extend(rb.results)
            sent.put(True)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert "harness.v1.TaskBatch" in info.value.details()
    assert [r.id for r in results] == [1]
    # The server goes on serving the client.
    again = Call(server.stub, batch("c", sleep_task(3, 0.01)))
    eventually(lambda: len(again.results) == 1, timeout=10)
    again.end()
    assert again.error is None
