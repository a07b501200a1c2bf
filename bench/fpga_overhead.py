"""`harness bench fpga-overhead`: what an FPGA group adds to a task (thesis Fig. 3.4).

One emulated FPGA-server process. In one run:

* direct: single 0.33 ms tasks, one at a time, sent straight to one device
  (`RunDirect`: no group, no queues) -- the baseline;
* group: the same tasks, one at a time, through a one-device group
  (`RunBatch` of one task: token check, the client's queues, shortest-queue
  dispatch, device locking, queue/device-time accounting);
* client: the same through the client library (`VirtualFpga.submit().result()`
  into the same one-device group), paired with direct the same way:
  `client_added_ms_per_task` is the median over pairs of (client - direct);
  `*_cpu_us` give both paths' CPU per task in this process (`bench`: the
  caller's side, the client library's threads included) and the server's,
  measured in alternating blocks of one path;
* batched: 1 ms tasks in batches of 300 through the client library into a
  one-device group: `batched_overhead_us_per_task` = wall time per task minus
  the task's device time (the device is the bottleneck; anything above it is
  overhead), and the same for a 6-device group.

How direct and group are paired, so that the difference is the group and not
the machine: both are unary calls on the same channel (same options, same
stub), carrying the same task (same id, same parameters; each request built
once, before timing), answered with the same result encoding by handlers that
sleep on the same primitive while the device is busy. They run in pairs, one
of each back to back, and the order alternates from pair to pair (direct
first, then group first), so neither gains from always coming second (warm
caches) or loses from always coming first. `added_ms_per_task` is the median
over pairs of (group - direct): a burst of machine noise spoils a few pairs,
not the median, and a slow stretch of the run slows both members of a pair.
The means (`direct_ms`, `group_ms`, `added_ms_mean_difference`) are printed
too; they carry the noise the median leaves out.

The same pairing runs in-process as well (the server's handlers called
directly, no gRPC, no other process): `inprocess_*` are medians of the
handler thread's CPU time and wall time per task for each path, and of their
paired differences. CPU time is what the group logic costs whatever the
scheduler does; it is the steadiest figure on a noisy machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench._common import emit
from harness.v1 import fpga_pb2, fpga_pb2_grpc
from irm_fpga.client import VirtualFpga
from services.launcher import spawn
from services.tls import plain_channel

TASK_S = 0.00033


def _one_task(task_id: int, duration: float) -> fpga_pb2.Task:
    t = fpga_pb2.Task(id=task_id, kind=fpga_pb2.Task.KIND_RUN)
    t.params["duration"].number = duration
    return t


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="harness bench fpga-overhead")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args([a for a in argv if a != "--"])
    singles = 1000 if args.quick else 3000  # pairs; the median of their differences steadies as they grow
    batched = 6000 if args.quick else 30000

    server = spawn("fpga-server", settings={"reconfig_mean_s": 0.01, "reconfig_std_s": 0.0, "devices": 8})
    try:
        server.wait_ready()
        stub = fpga_pb2_grpc.FpgaServerStub(plain_channel(server.address))

        stub.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id="one", design="sleep", size=1))
        stub.AttachClient(fpga_pb2.ServerAttachRequest(group_id="one", client_id="c1", token="t"))
        wait_group_ready(stub, "one", 1)

        # direct (device 7 stays outside every group) and through a one-device group, in pairs
        # of alternating order (see the module's docstring). The first direct task configures
        # device 7 (warm-up).
        direct_req = fpga_pb2.RunDirectRequest(device=7, design="sleep", task=_one_task(1, TASK_S))
        group_req = fpga_pb2.TaskBatch(client_id="c1", group_id="one", token="t", tasks=[_one_task(1, TASK_S)])
        calls = (lambda: stub.RunDirect(direct_req), lambda: stub.RunBatch(group_req))
        direct, group = _paired(calls, singles, warmup=20)

        # the client library, one at a time, then batched
        att = fpga_pb2.Attachment(client_id="c2", group_id="one", token="t2", design="sleep",
                                  parts=[fpga_pb2.AttachedPart(server="fpga-0", address=server.address, devices=1)])
        stub.AttachClient(fpga_pb2.ServerAttachRequest(group_id="one", client_id="c2", token="t2"))
        fpga = VirtualFpga(att, batch_size=300)
        params = {"duration": TASK_S}
        calls = (lambda: stub.RunDirect(direct_req), lambda: fpga.submit(params).result())
        direct_c, client = _paired(calls, singles, warmup=20)
        cpu_blocks = _cpu_blocks(calls, 4, 150 if args.quick else 500, server.proc.pid)
        fpga.map([{"duration": 0.001}] * 300)  # warm the stream
        t0 = time.perf_counter()
        fpga.map([{"duration": 0.001}] * batched)
        one_dev_wall = time.perf_counter() - t0
        fpga.close(detach=False)

        stub.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id="eight", design="sleep", size=6))
        stub.AttachClient(fpga_pb2.ServerAttachRequest(group_id="eight", client_id="c3", token="t3"))
        wait_group_ready(stub, "eight", 6)
        att8 = fpga_pb2.Attachment(client_id="c3", group_id="eight", token="t3", design="sleep",
                                   parts=[fpga_pb2.AttachedPart(server="fpga-0", address=server.address, devices=6)])
        fpga8 = VirtualFpga(att8, batch_size=300)
        fpga8.map([{"duration": 0.001}] * 600)
        t0 = time.perf_counter()
        fpga8.map([{"duration": 0.001}] * batched)
        six_dev_wall = time.perf_counter() - t0
        fpga8.close(detach=False)
    finally:
        server.stop()
    cpu = _in_process(1000 if args.quick else 3000)

    direct_ms = statistics.mean(direct) * 1000
    group_ms = statistics.mean(group) * 1000
    added_ms = statistics.median(g - d for g, d in zip(group, direct, strict=True)) * 1000
    client_added_ms = statistics.median(c - d for c, d in zip(client, direct_c, strict=True)) * 1000
    emit({
        "benchmark": "fpga-overhead",
        "task_ms": TASK_S * 1000,
        "tasks_single": singles,
        "direct_ms": round(direct_ms, 3),
        "group_ms": round(group_ms, 3),
        "added_ms_per_task": round(added_ms, 3),
        "added_ms_mean_difference": round(group_ms - direct_ms, 3),
        "direct_p50_ms": round(statistics.median(direct) * 1000, 3),
        "group_p50_ms": round(statistics.median(group) * 1000, 3),
        "client_library_ms": round(statistics.mean(client) * 1000, 3),
        "client_direct_ms": round(statistics.mean(direct_c) * 1000, 3),
        "client_added_ms_per_task": round(client_added_ms, 3),
        "client_added_ms_mean_difference": round((statistics.mean(client) - statistics.mean(direct_c)) * 1000, 3),
        "client_p50_ms": round(statistics.median(client) * 1000, 3),
        **cpu_blocks,
        "batched_tasks": batched,
        "batched_tasks_per_s": round(batched / one_dev_wall, 1),
        "batched_overhead_us_per_task": round((one_dev_wall / batched - 0.001) * 1e6, 2),
        "batched_6_devices_tasks_per_s": round(batched / six_dev_wall, 1),
        "batched_6_devices_overhead_us_per_task": round((six_dev_wall / batched - 0.001 / 6) * 1e6, 2),
        **cpu,
        "targets": {"added_ms_per_task<=0.09": added_ms <= 0.09,
                    "client_added_ms_per_task<=0.09": client_added_ms <= 0.09,
                    "batched_overhead_us_per_task<=20": (one_dev_wall / batched - 0.001) * 1e6 <= 20},
    })
    return 0


def wait_group_ready(stub: fpga_pb2_grpc.FpgaServerStub, group_id: str, size: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = stub.GetServer(fpga_pb2.GetServerRequest())
        if any(g.group_id == group_id and g.active >= size for g in info.groups):
            return
        time.sleep(0.01)
    raise RuntimeError(f"group {group_id} never reached {size} devices")


def _paired(calls: tuple, pairs: int, warmup: int = 0,
            clock=time.perf_counter) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """Time calls[0] and calls[1] once each per pair, in alternating order; returns both lists (pair-aligned)."""
    for _ in range(warmup):
        calls[0]()
        calls[1]()
    out: tuple[list[float], list[float]] = ([], [])
    for i in range(pairs):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            t0 = clock()
            calls[which]()
            out[which].append(clock() - t0)
    return out


def _process_cpu_s(pid: int) -> float | None:
    """CPU time of a process so far, its ended threads' included (Linux; None elsewhere or once it is gone).

    The kernel's CPU clock of the process (CPUCLOCK_SCHED of its pid: the clock id `clock_getcpuclockid` gives,
    ns resolution) keeps the time of threads that ended, as a sum over the threads alive now would not (the
    client library's and gRPC's threads come and go: a thread ending within a block took its time with it, and
    the block's difference could go negative). Where that clock cannot be read, /proc/<pid>/stat's utime + stime
    count ended threads too, in clock ticks (10 ms): coarse against one task's CPU, but a block of hundreds of
    tasks takes tens of ms and more, and a median over blocks evens out the rounding.
    """
    try:
        return time.clock_gettime(((~pid) << 3) | 2)   # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
    except (OSError, OverflowError, AttributeError):
        pass                    # not Linux (or the process is gone: then /proc says so too)
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()     # after the command's name (which may hold spaces)
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")    # utime, stime
    except (OSError, ValueError, IndexError):
        return None


def _cpu_blocks(calls: tuple, blocks: int, per_block: int, server_pid: int) -> dict[str, float]:
    """CPU per task of calls[0] (direct) and calls[1] (client library), this process and the server's.

    In blocks of `per_block` calls of one kind, alternating kinds (a process's CPU time cannot be
    split between calls interleaved in a pair); medians over blocks. What the wall-time pairs do
    not show: a path's work after its result is back, and what it costs a loaded machine.
    """
    out: dict[str, list[float]] = {}
    pids = (("bench", os.getpid()), ("server", server_pid))
    for b in range(blocks * 2):
        which = b % 2 if (b // 2) % 2 == 0 else 1 - b % 2
        before = [_process_cpu_s(pid) for _, pid in pids]
        for _ in range(per_block):
            calls[which]()
        after = [_process_cpu_s(pid) for _, pid in pids]
        if None in before or None in after:
            return {}
        name = ("direct", "client")[which]
        for (side, _), t0, t1 in zip(pids, before, after, strict=True):
            out.setdefault(f"{name}_{side}_cpu_us", []).append((t1 - t0) / per_block * 1e6)  # type: ignore[operator]
    res = {k: round(statistics.median(v), 1) for k, v in out.items()}
    for name in ("direct", "client"):
        res[f"{name}_cpu_us"] = round(res[f"{name}_bench_cpu_us"] + res[f"{name}_server_cpu_us"], 1)
    return res


def _in_process(pairs: int) -> dict[str, float]:
    """The same pairs against the server's handlers in this process: CPU and wall time per task."""
    from irm_fpga.server import FpgaServerConfig, FpgaServerService

    svc = FpgaServerService(FpgaServerConfig(devices=8, reconfig_mean_s=0.0, reconfig_std_s=0.0))
    svc.start()
    try:
        svc.CreateGroupPart(fpga_pb2.CreateGroupPartRequest(group_id="one", design="sleep", size=1), None)
        svc.AttachClient(fpga_pb2.ServerAttachRequest(group_id="one", client_id="c1", token="t"), None)
        deadline = time.monotonic() + 10
        while svc.engine.group_info("one").size < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        direct_req = fpga_pb2.RunDirectRequest(device=7, design="sleep", task=_one_task(1, TASK_S))
        group_req = fpga_pb2.TaskBatch(client_id="c1", group_id="one", token="t", tasks=[_one_task(1, TASK_S)])
        calls = (lambda: svc.RunDirect(direct_req, None), lambda: svc.RunBatch(group_req, None))
        out: dict[str, float] = {}
        for name, clock in (("cpu", time.thread_time), ("wall", time.perf_counter)):
            d, g = _paired(calls, pairs, warmup=50, clock=clock)
            out[f"inprocess_direct_{name}_us"] = round(statistics.median(d) * 1e6, 1)
            out[f"inprocess_group_{name}_us"] = round(statistics.median(g) * 1e6, 1)
            out[f"inprocess_added_{name}_us"] = round(statistics.median(b - a for a, b in zip(d, g, strict=True)) * 1e6, 1)
        return out
    finally:
        svc.stop()
