"""`harness run` stopped (Ctrl-C) before the agent's "started" event reached it: the command may already run (its
own output can come first), so the client waits for the execution's id and stops it -- seen in CI under load,
where the remote `sleep 300` ran on. The agent is a stand-in object here; tests/integration/test_suite.py runs the
same path against real processes."""

import argparse
import signal
import threading

import grpc

from harness.v1 import agent_pb2, irm_pb2
from services import commands


class _Call:
    """An Execute stream: its events, with a Ctrl-C (SIGINT to the main thread, where the command waits) when the
    reading reaches event `interrupt_at`; the stream reads on after it, as a real one would."""

    def __init__(self, events: list, interrupt_at: int) -> None:
        self.events, self.interrupt_at, self.i, self.cancelled = events, interrupt_at, 0, False

    def __iter__(self):  # noqa: ANN204
        return self

    def __next__(self):  # noqa: ANN204
        if self.cancelled:
            raise grpc.RpcError()
        if self.i == self.interrupt_at:
            self.interrupt_at = -1
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        if self.i >= len(self.events):
            raise StopIteration
        self.i += 1
        return self.events[self.i - 1]

    def cancel(self) -> None:
        self.cancelled = True


class _Agent:
    def __init__(self, call: _Call) -> None:
        self.call, self.stopped = call, []

    def Execute(self, request):  # noqa: N802, ANN001, ANN201
        return self.call

    def StopExecution(self, request, timeout=None, wait_for_ready=None):  # noqa: N802, ANN001, ANN201
        self.stopped.append(request.execution_id)
        return agent_pb2.Execution()


class _Crs:
    def GetReservation(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        vm = irm_pb2.AllocatedResource(id="vm-1", address="127.0.0.1:1")
        return irm_pb2.Reservation(id=request.reservation_id, groups=[irm_pb2.AllocatedGroup(resources=[vm])])


def run(monkeypatch, call: _Call) -> tuple[int, _Agent]:  # noqa: ANN001
    agent = _Agent(call)
    monkeypatch.setattr(commands, "_irm", lambda args: _Crs())
    monkeypatch.setattr("harness.v1.agent_pb2_grpc.ExecutionAgentStub", lambda channel: agent)
    args = argparse.Namespace(tenant="t", reservation="r1", vm=None, env=None, timeout=0.0, argv=["sleep", "300"],
                              crs="127.0.0.1:1", state_dir=None)
    # cmd_run ignores these signals while it stops the command: put this process's handlers back after it.
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)     # Ctrl-C's KeyboardInterrupt, whatever runs us
    try:
        return commands.cmd_run(args), agent
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def started(execution_id: str) -> agent_pb2.ExecuteEvent:
    return agent_pb2.ExecuteEvent(started=agent_pb2.ExecutionStarted(execution_id=execution_id, pid=7))


def test_a_ctrl_c_before_the_started_event_still_stops_the_command(monkeypatch, capsys):
    out = agent_pb2.ExecuteEvent(stdout=b"early output\n")
    status, agent = run(monkeypatch, _Call([out, started("ex-1")], interrupt_at=1))
    assert status == 130 and agent.stopped == ["ex-1"]
    assert "stopped execution ex-1" in capsys.readouterr().err


def test_a_ctrl_c_after_the_started_event_stops_it_at_once(monkeypatch, capsys):
    status, agent = run(monkeypatch, _Call([started("ex-2"), agent_pb2.ExecuteEvent(stdout=b"x")], interrupt_at=1))
    assert status == 130 and agent.stopped == ["ex-2"]


def test_no_started_event_within_the_wait_gives_up_without_stopping_anything(monkeypatch, capsys):
    # The stream ends (or is cancelled by the wait's timer) with no id: nothing to stop, still status 130.
    status, agent = run(monkeypatch, _Call([], interrupt_at=0))
    assert status == 130 and agent.stopped == []
