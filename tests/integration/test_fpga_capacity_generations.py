"""The FPGA IRM's capacity events, as the CRS's view applies them (irm_fpga.orchestrator, cross_resource_scheduler.view):
a server state read earlier and published later never overrides a newer one, a read asked first but answered last
is the newer one, and the wall clock stepping back does not make the IRM's later events stale. An in-process FPGA-server and Orchestrator; the view fed as the CRS's
registry feeds it (KIND_UPDATED events, not snapshots)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from cross_resource_scheduler.view import CapacityView
from harness.v1 import fpga_pb2
from irm_fpga import server as fsrv
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig
from services import client as rpc
from services import server as srv


class SteppingClock:
    """A wall clock the test moves, backwards too (an NTP step)."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        pass


@pytest.fixture
def setup(tmp_path) -> Iterator[tuple[Orchestrator, SteppingClock, CapacityView, fsrv.FpgaServerService]]:
    comp = fsrv.component(fsrv.FpgaServerConfig(name="s1", devices=4, reconfig_mean_s=0.0, reconfig_std_s=0.0))
    fs = srv.start("127.0.0.1:0", [comp])
    address = f"127.0.0.1:{fs.port}"
    clock = SteppingClock()
    orch = Orchestrator(OrchestratorConfig(database=f"sqlite:///{tmp_path}/o.db", servers=[address],
                                           autoscaler="none", reconcile_interval_s=0, server_backoff_s=0), clock)
    orch._discover_servers(strict=True)
    view = CapacityView()
    orch.watchers.has_subscribers = lambda: True                                # type: ignore[method-assign]
    orch.watchers.publish = lambda events: [view.upsert("fpga", e.resource) for e in events]  # type: ignore
    yield orch, clock, view, comp.extra["server"]
    orch.stop()
    fs.stop(0)
    rpc.drop(address)


def used(view: CapacityView) -> float:
    return view.nodes["fpga/s1"].used.get("devices", 0.0)


def held(orch: Orchestrator) -> int:
    return sum(p.target for p in orch._server_infos()["s1"].groups)


def test_a_state_read_before_a_change_and_published_after_it_is_stale_to_the_view(setup) -> None:
    orch, clock, view, _ = setup
    g1 = orch.create_group("alice", "r1", "sleep", 2)
    assert used(view) == 2
    # The delete's publish reads the servers (s1 holds nothing), then waits before publishing; meanwhile another
    # group is made (s1 holds 3) and published.
    reached, go = threading.Event(), threading.Event()
    read = orch._stamped_infos

    def paused_read():  # type: ignore[no-untyped-def]
        out = read()
        if threading.current_thread().name == "deleter":
            reached.set()
            assert go.wait(10)
        return out

    orch._stamped_infos = paused_read                                           # type: ignore[method-assign]
    deleter = threading.Thread(target=orch.delete, args=(g1,), name="deleter")
    deleter.start()
    assert reached.wait(10)
    clock.t += 0.010
    orch.create_group("alice", "r2", "sleep", 3)
    assert used(view) == 3
    clock.t += 0.010
    go.set()
    deleter.join(10)
    assert held(orch) == 3 and used(view) == 3      # the older read (0 devices) published last changed nothing


def test_the_wall_clock_stepping_back_does_not_freeze_the_view(setup) -> None:
    orch, clock, view, _ = setup
    g = orch.create_group("alice", "r1", "sleep", 4)
    assert used(view) == 4
    clock.t -= 30.0                                  # an NTP step back
    orch.delete(g)
    assert held(orch) == 0 and used(view) == 0      # not "4 of 4 used" until the clock catches up


def test_a_read_asked_first_but_answered_last_is_the_newer_state(setup) -> None:
    orch, _, view, server = setup
    orch._publish()
    assert used(view) == 0
    # One publish is held before its request reaches the server; another, asked after it, is answered first.
    reached, go = threading.Event(), threading.Event()
    ask = orch.ask_all

    def paused_ask(handles, method, request):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "slow" and method == "GetServer":
            reached.set()
            assert go.wait(10)
        return ask(handles, method, request)

    orch.ask_all = paused_ask                                                   # type: ignore[method-assign]
    slow = threading.Thread(target=orch._publish, name="slow")
    slow.start()
    assert reached.wait(10)
    orch._publish()
    assert used(view) == 0
    server.engine.create_group("stray", "sleep", 2)     # a change on the server the Orchestrator did not make
    go.set()
    slow.join(10)
    assert used(view) == 2          # the held read saw the change: published, not taken for the older state


def test_an_answer_older_than_one_already_seen_stands_for_the_newest_and_a_restart_is_new(setup) -> None:
    orch, _, _, _ = setup

    def info(boot: str, seq: int, held: int) -> fpga_pb2.ServerInfo:
        return fpga_pb2.ServerInfo(name="x", boot_id=boot, read_seq=seq,
                                   groups=[fpga_pb2.GroupPart(group_id="g", target=held)])

    newest, g5 = orch._newest("x", info("run1", 5, 3))
    late, g_late = orch._newest("x", info("run1", 4, 1))           # read before seq 5, reaching us after it
    assert (late, g_late) == (newest, g5)
    restarted, g_restart = orch._newest("x", info("run2", 1, 0))   # the server restarted: its count starts again
    assert restarted.boot_id == "run2" and g_restart > g5
    older_run, g_older = orch._newest("x", info("run1", 9, 4))     # the last run's answer, still in flight
    assert older_run.boot_id == "run2" and g_older == g_restart
    unnumbered, g_un = orch._newest("x", fpga_pb2.ServerInfo(name="x"))  # a server that does not number its reads
    assert unnumbered.boot_id == "" and g_un > g_restart
