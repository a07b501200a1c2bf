"""The FPGA data plane across processes: FPGA-server processes, their Execute streams, RunBatch and
RunDirect, and the client library over them (attachments built by hand: no Orchestrator needed).

What it guarantees: a lock dies with its server's stream and takes only what was pinned to it; a bad
pseudo-task fails its own batch, not the stream; a stream answers exactly the tasks it sent, whatever
else its client runs; RunDirect holds its device (no group gets it meanwhile) and no other.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator

import numpy as np
import pytest

from harness.v1 import fpga_pb2, fpga_pb2_grpc
from irm_fpga.client import TaskFailed, VirtualFpga
from irm_fpga.server import EVENTS_KEPT, RESULT_BATCH_BYTES, FpgaServerConfig, FpgaServerService
from irm_fpga.wire import to_map
from services.tls import plain_channel
from tests.conftest import eventually

INSTANT = {"reconfig_mean_s": 0.0, "reconfig_std_s": 0.0}
BUSY = fpga_pb2.DeviceInfo.STATE_BUSY


def server(suite, name: str, devices: int = 2):  # type: ignore[no-untyped-def]
    p = suite.start("fpga-server", name=name, devices=devices, **INSTANT)
    return p, fpga_pb2_grpc.FpgaServerStub(plain_channel(p.address))


def part(p, stub, gid: str, client: str, size: int) -> fpga_pb2.AttachedPart:  # type: ignore[no-untyped-def]
    """A part of `size` devices on the server with `client` attached (token "tok-<client>"), once it has them."""
    stub.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id=gid, design="sleep", size=size))
    stub.AttachClient(fpga_pb2.ServerAttachRequest(group_id=gid, client_id=client, token=f"tok-{client}"))
    eventually(lambda: [g.active for g in stub.GetServer(fpga_pb2.GetServerRequest()).groups
                        if g.group_id == gid] == [size], timeout=10, what=f"{gid}'s devices")
    name = stub.GetServer(fpga_pb2.GetServerRequest()).name
    return fpga_pb2.AttachedPart(server=name, address=p.address, devices=size)


def attachment(gid: str, client: str, *parts: fpga_pb2.AttachedPart) -> fpga_pb2.Attachment:
    return fpga_pb2.Attachment(client_id=client, group_id=gid, token=f"tok-{client}", design="sleep", parts=parts)


def sleep_task(task_id: int, seconds: float) -> fpga_pb2.Task:
    t = fpga_pb2.Task(id=task_id)
    t.params["duration"].number = seconds
    return t


def busy(stub) -> list[int]:  # type: ignore[no-untyped-def]
    return [d.index for d in stub.GetServer(fpga_pb2.GetServerRequest()).devices if d.state == BUSY]


def test_a_lock_dies_with_its_servers_stream_and_later_tasks_go_to_live_parts(suite) -> None:  # type: ignore[no-untyped-def]
    a, sa = server(suite, "fpga-a", devices=1)
    b, sb = server(suite, "fpga-b", devices=1)
    # One in flight: the second pinned task waits in the client when the lock's server goes.
    f = VirtualFpga(attachment("g", "c", part(a, sa, "g", "c", 1), part(b, sb, "g", "c", 1)), max_in_flight=1)
    try:
        assert f.lock().server == "fpga-a"
        running = f.submit({"duration": 30.0})
        pinned = f.submit({"duration": 0.001})
        eventually(lambda: busy(sa) == [0], timeout=10, what="the locked task running on fpga-a")
        a.kill()  # a crash: the server forgets the lock
        with pytest.raises(TaskFailed, match="fpga-a"):
            running.result(10)
        with pytest.raises(TaskFailed, match="lock on fpga-a was lost"):
            pinned.result(10)
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-b"
        with pytest.raises(TaskFailed, match="lock on fpga-a was lost"):
            f.unlock()
        # The client can lock again, on a live part.
        assert f.lock().server == "fpga-b"
        assert f.submit({"duration": 0.001}).result(10).server == "fpga-b"
        assert f.unlock().kind == fpga_pb2.Task.KIND_UNLOCK
    finally:
        f.close(detach=False)


def test_a_stray_unlock_or_a_second_lock_fails_alone_not_the_stream(suite) -> None:  # type: ignore[no-untyped-def]
    p, stub = server(suite, "fpga-a")
    with VirtualFpga(attachment("g", "c", part(p, stub, "g", "c", 2))) as f:
        good = [f.submit({"duration": 0.3}) for _ in range(4)]
        eventually(lambda: len(busy(stub)) == 2, timeout=10, what="the tasks running")
        with pytest.raises(TaskFailed, match="unlock without a lock"):
            f.submit(None, fpga_pb2.Task.KIND_UNLOCK).result(10)
        assert len([fu.result(10) for fu in good]) == 4  # the stream and the tasks on it go on

        device = f.lock().value["device"]
        with pytest.raises(TaskFailed, match="already holds"):
            f.submit(None, fpga_pb2.Task.KIND_LOCK).result(10)
        assert f.submit({"duration": 0.001}).result(10).device == device  # still locked, same stream
        assert f.unlock().kind == fpga_pb2.Task.KIND_UNLOCK


def test_a_stream_answers_only_its_own_tasks_when_its_client_also_uses_run_batch(suite) -> None:  # type: ignore[no-untyped-def]
    p, stub = server(suite, "fpga-a")
    part(p, stub, "g", "c", 2)
    requests: queue.SimpleQueue[fpga_pb2.TaskBatch | None] = queue.SimpleQueue()

    def batches() -> Iterator[fpga_pb2.TaskBatch]:
        while (b := requests.get()) is not None:
            yield b

    requests.put(fpga_pb2.TaskBatch(client_id="c", group_id="g", token="tok-c", tasks=[sleep_task(1, 2.0)]))
    stream = stub.Execute(batches())
    eventually(lambda: len(busy(stub)) == 1, timeout=10, what="the stream's task running")
    # The same client, on the other device, while the stream's task runs.
    rb = stub.RunBatch(fpga_pb2.TaskBatch(client_id="c", group_id="g", token="tok-c",
                                          tasks=[sleep_task(i, 0.01) for i in range(1001, 1005)]), timeout=10)
    assert sorted(r.id for r in rb.results) == [1001, 1002, 1003, 1004]
    requests.put(None)  # no more requests: the stream ends once it has answered what it sent
    got = [r.id for batch in stream for r in batch.results]
    assert got == [1]


def test_run_direct_holds_its_device_and_only_it(suite) -> None:  # type: ignore[no-untyped-def]
    p, stub = server(suite, "fpga-a")
    direct = stub.RunDirect.future(fpga_pb2.RunDirectRequest(device=0, design="sleep", task=sleep_task(1, 3.0)),
                                   timeout=30)
    eventually(lambda: busy(stub) == [0], timeout=10, what="device 0 taken by RunDirect")
    # Another device's RunDirect does not wait for it.
    other = stub.RunDirect(fpga_pb2.RunDirectRequest(device=1, design="sleep", task=sleep_task(2, 0.01)),
                           timeout=10)
    assert other.device == 1 and not direct.done()
    # A group made meanwhile has only device 1 until the direct call gives device 0 back.
    stub.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id="g", design="sleep", size=2))
    stub.AttachClient(fpga_pb2.ServerAttachRequest(group_id="g", client_id="c", token="k"))
    rb = stub.RunBatch(fpga_pb2.TaskBatch(client_id="c", token="k", tasks=[sleep_task(i, 0.05) for i in (1, 2)]),
                       timeout=10)
    assert [r.device for r in rb.results] == [1, 1] and not direct.done()
    r = direct.result()
    assert (r.id, r.device, r.error) == (1, 0, "")
    eventually(lambda: [g.active for g in stub.GetServer(fpga_pb2.GetServerRequest()).groups] == [2],
               timeout=10, what="device 0 joining the group once given back")


def test_get_server_reports_the_latest_device_events_not_all_of_them() -> None:
    svc = FpgaServerService(FpgaServerConfig(name="fpga-t", devices=2, blacklist_after=10 ** 6,
                                             fault_injection=True, **INSTANT))
    svc.engine.inject_reconfiguration_failures(0, EVENTS_KEPT + 50)
    svc.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id="g", design="sleep", size=1), None)
    events = svc.GetServer(fpga_pb2.GetServerRequest(), None).events
    assert len(events) == EVENTS_KEPT
    assert events[-1] == f"device 0: reconfiguration_failed (attempt {EVENTS_KEPT + 50} of {10 ** 6})"


def options(n: int) -> dict:
    spot = np.linspace(10.0, 200.0, n)
    return {"spot": spot, "strike": spot, "maturity": np.ones(n), "rate": 0.02, "volatility": np.full(n, 0.2)}


def test_results_of_any_size_reach_the_client_library_and_a_default_grpc_client(suite) -> None:  # type: ignore[no-untyped-def]
    # A result burst went out as one message (7.6 MB for 20 tasks of 50,000 options), over the 4 MiB a client
    # takes by default: every task failed with RESOURCE_EXHAUSTED, the client library's too.
    p = suite.start("fpga-server", name="fpga-big", devices=1, **INSTANT)
    stub = fpga_pb2_grpc.FpgaServerStub(plain_channel(p.address))
    stub.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id="g", design="black_scholes", size=1))
    stub.AttachClient(fpga_pb2.ServerAttachRequest(group_id="g", client_id="c", token="tok-c"))
    eventually(lambda: [g.active for g in stub.GetServer(fpga_pb2.GetServerRequest()).groups] == [1], timeout=10,
               what="g's device")
    at = fpga_pb2.Attachment(client_id="c", group_id="g", token="tok-c", design="black_scholes", parts=[
        fpga_pb2.AttachedPart(server="fpga-big", address=p.address, devices=1)])
    f = VirtualFpga(at)
    try:
        futures = [f.submit(options(50_000)) for _ in range(20)]
        assert all(len(x.result(60).value["price"]) == 50_000 for x in futures)
        one = f.submit(options(700_000)).result(60)         # a single result over 4 MiB: alone in its message
        assert len(one.value["price"]) == 700_000
    finally:
        f.close(detach=False)
    # A client with gRPC's default limits (another language's, say) gets every result of a burst.
    tasks = [fpga_pb2.Task(id=i) for i in range(20)]
    for t in tasks:
        to_map(options(50_000), t.params)
    with plain_channel(p.address) as ch:
        replies = list(fpga_pb2_grpc.FpgaServerStub(ch).Execute(
            iter([fpga_pb2.TaskBatch(client_id="c", token="tok-c", tasks=tasks)]), timeout=60))
    assert sorted(r.id for b in replies for r in b.results) == list(range(20))
    assert all(not r.error for b in replies for r in b.results)
    assert max(b.ByteSize() for b in replies) <= RESULT_BATCH_BYTES
