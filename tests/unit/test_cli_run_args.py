"""`harness run`'s own options are checked before anything is sent."""

from __future__ import annotations

import pytest

from services import cli


def test_an_env_option_without_a_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "res-1", "--env", "FOO", "--", "true"])
    assert e.value.code == 2
    assert "--env: 'FOO': expected NAME=VALUE" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["run", "res-1", "--env", "A=1=2", "--env", "B="])
    assert dict(args.env) == {"A": "1=2", "B": ""}


def _crs_holding(monkeypatch, held) -> None:  # noqa: ANN001
    """`harness run`'s CRS stood in for: every GetReservation answers `held`."""
    from services import commands

    class Crs:
        def GetReservation(self, request, timeout):  # noqa: ANN001, ANN202, N802
            return held
    monkeypatch.setattr(commands, "_irm", lambda args: Crs())


def test_run_on_a_reservation_without_a_vm_says_what_it_holds(capsys, monkeypatch):
    from harness.v1 import irm_pb2

    _crs_holding(monkeypatch, irm_pb2.Reservation(id="res-1", groups=[irm_pb2.AllocatedGroup(
        name="f", resource_type="vfpga", resources=[irm_pb2.AllocatedResource(id="fg-1", address="127.0.0.1:1")])]))
    assert cli.main(["run", "res-1", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "res-1 holds no VM to run on (it holds vfpga" in err and "FPGA client library" in err


def test_run_whose_agent_does_not_answer_names_the_agent_not_the_suite(capsys, monkeypatch):
    # The reservation's VM address stale (its agent restarted elsewhere) read "is a suite running there? ... give
    # --crs": the CRS had answered; the agent it named did not.
    import socket

    from harness.v1 import irm_pb2

    with socket.socket() as s:          # a port nothing listens on: bound, never listening, refuses connections
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
        _crs_holding(monkeypatch, irm_pb2.Reservation(id="res-1", groups=[irm_pb2.AllocatedGroup(
            name="vm", resource_type="vm", resources=[irm_pb2.AllocatedResource(id="vm-1", address=address)])]))
        assert cli.main(["run", "res-1", "--", "true"]) == 1
    err = capsys.readouterr().err
    assert f"the VM's execution agent at {address}" in err and "harness reservations" in err
    assert "is a suite running there" not in err


def _agent():  # noqa: ANN202
    from harness.v1 import agent_pb2_grpc

    class Agent(_Agent, agent_pb2_grpc.ExecutionAgentServicer):
        pass
    return Agent()


class _Agent:
    """An execution agent that says "started" only once the CLI was interrupted (Ctrl-C before the first event),
    and records which executions it was told to stop."""

    def __init__(self) -> None:
        import threading

        self.interrupted = threading.Event()
        self.stopped: list[str] = []

    def Execute(self, request, context):  # noqa: ANN001, ANN201, N802
        from harness.v1 import agent_pb2

        self.interrupted.wait(10)
        yield agent_pb2.ExecuteEvent(started=agent_pb2.ExecutionStarted(execution_id="ex-1"))
        while context.is_active():
            self.interrupted.wait(0.05)

    def StopExecution(self, request, context):  # noqa: ANN001, ANN201, N802
        from harness.v1 import agent_pb2

        self.stopped.append(request.execution_id)
        return agent_pb2.Execution(execution_id=request.execution_id)


@pytest.fixture
def signals_kept():  # noqa: ANN201
    """`harness run` sets the process's handlers for SIGINT, SIGTERM and SIGHUP: put back after the test."""
    import signal

    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    yield
    for s, handler in kept.items():
        signal.signal(s, handler)


def test_ctrl_c_before_the_started_event_still_stops_the_remote_command(capsys, monkeypatch, signals_kept):
    # Interrupted while it waited inside the stream's read, the call could not be read again ("Internal gRPC call
    # error 8"): a traceback, status 1, and the command left running at the agent. Now it waits for the id, stops it.
    import signal
    import threading
    from concurrent import futures

    import grpc

    from harness.v1 import agent_pb2_grpc, irm_pb2

    agent = _agent()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    agent_pb2_grpc.add_ExecutionAgentServicer_to_server(agent, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        _crs_holding(monkeypatch, irm_pb2.Reservation(id="res-1", groups=[irm_pb2.AllocatedGroup(
            name="vm", resource_type="vm", resources=[irm_pb2.AllocatedResource(id="vm-1",
                                                                               address=f"127.0.0.1:{port}")])]))

        def ctrl_c(signum, frame):  # noqa: ANN001, ANN202
            agent.interrupted.set()              # the agent answers "started" only now
            signal.default_int_handler(signum, frame)   # what Ctrl-C does: KeyboardInterrupt, here
        signal.signal(signal.SIGINT, ctrl_c)
        # Ctrl-C in 0.5 s, while `harness run` waits for the stream's first event (the agent holds it back).
        main = threading.main_thread().ident
        timer = threading.Timer(0.5, lambda: signal.pthread_kill(main, signal.SIGINT))
        timer.start()
        try:
            assert cli.main(["run", "res-1", "--", "sleep", "300"]) == 130
        finally:
            timer.cancel()
    finally:
        server.stop(0)
    assert agent.interrupted.is_set() and agent.stopped == ["ex-1"]
    err = capsys.readouterr().err
    assert "[stopped execution ex-1]" in err and "Traceback" not in err
