"""What an Execute the agent cannot carry out answers: an environment the kernel will not pass to a program is the
caller's INVALID_ARGUMENT on `env`; a scratch directory the agent cannot make is its own, said precisely; and
`harness run` that loses its stream after the run started tries to stop it.

The agent runs in this process against a stand-in compute IRM; `harness run` against stand-in stubs.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import grpc
import pytest

from harness.v1 import agent_pb2
from irm_compute.agent import Agent, AgentConfig
from services.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from tests.conftest import PeerError
from tests.unit import test_harness_run_stop as helpers
from tests.unit.test_harness_run_stop import _Call, run, started
from tests.unit.test_review16_agent_start import _Compute

PY = sys.executable


@pytest.fixture
def agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    a = Agent(AgentConfig(work_dir=str(tmp_path / "agent")), _Compute())  # type: ignore[arg-type]
    try:
        yield a
    finally:
        a.shutdown()


def execute(agent: Agent, argv: list[str], env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return agent.execute(agent_pb2.ExecuteRequest(tenant="alice", vm_id="vm-1", argv=argv, env=env or {}))


def scratch_dirs(agent: Agent) -> list[Path]:
    work = Path(agent.config.work_dir)
    return sorted(work.glob("ex-*")) if work.exists() else []


def test_a_variable_larger_than_the_kernel_passes_is_invalid_env(agent: Agent) -> None:
    with pytest.raises(InvalidArgument) as bad:
        execute(agent, ["/bin/true"], env={"BIG": "a" * 200_000, "SMALL": "1"})
    assert [v.field for v in bad.value.violations] == ["env['BIG']"]
    assert "at most 131072 bytes per variable" in bad.value.violations[0].description
    assert scratch_dirs(agent) == []


def test_an_environment_larger_in_all_than_the_kernel_passes_is_invalid_env_naming_the_command(agent: Agent) -> None:
    # Each variable fits; together (7 MB) they are over any exec's limit (at most 6 MB, a quarter of the stack).
    env = {f"V{i}": "a" * 120_000 for i in range(60)}
    with pytest.raises(InvalidArgument) as bad:
        execute(agent, [PY, "-c", "pass"], env=env)
    (violation,) = bad.value.violations
    assert violation.field == "env"
    assert repr(PY) in violation.description and "E2BIG" in violation.description
    assert scratch_dirs(agent) == []


def test_an_argument_larger_than_the_kernel_passes_is_invalid_argv(agent: Agent) -> None:
    with pytest.raises(InvalidArgument) as bad:
        execute(agent, ["/bin/echo", "a" * 200_000])
    assert [v.field for v in bad.value.violations] == ["argv"]
    assert "argument 1" in bad.value.violations[0].description


@pytest.mark.parametrize(("code", "error"), [(errno.ENOSPC, ResourceExhausted), (errno.EROFS, FailedPrecondition)],
                         ids=["disk-full", "read-only"])
def test_a_scratch_directory_that_cannot_be_made_is_said_precisely(
        agent: Agent, monkeypatch: pytest.MonkeyPatch, code: int, error: type) -> None:
    mkdir = Path.mkdir

    def failing(self: Path, *args: object, **kwargs: object) -> None:
        if self.name.startswith("ex-"):
            raise OSError(code, os.strerror(code), str(self))
        mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", failing)
    with pytest.raises(error) as refused:
        execute(agent, ["/bin/true"])
    assert "scratch directory" in str(refused.value) and "working_dir" in str(refused.value)
    with agent._lock:
        assert agent._runs == {}


# --- harness run -----------------------------------------------------------------------------------------------------


class _Lost(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "Socket closed"

    def trailing_metadata(self) -> None:
        return None


class _LosingCall(_Call):
    """An Execute stream that breaks (the connection lost) after its events."""

    def __next__(self):  # noqa: ANN204
        if self.i >= len(self.events):
            raise _Lost()
        return super().__next__()


def test_harness_run_that_loses_its_stream_after_the_start_stops_the_run(monkeypatch, capsys) -> None:  # noqa: ANN001
    status, agent = run(monkeypatch, _LosingCall([started("ex-9"), agent_pb2.ExecuteEvent(stdout=b"x")], -1))
    assert status == 1 and agent.stopped == ["ex-9"]
    err = capsys.readouterr().err
    assert "UNAVAILABLE: Socket closed" in err and "[stopped execution ex-9]" in err


def test_harness_run_says_when_the_lost_run_could_not_be_stopped(monkeypatch, capsys) -> None:  # noqa: ANN001
    call = _LosingCall([started("ex-9")], -1)
    unreachable = helpers._Agent(call)

    def stop(request, timeout=None, wait_for_ready=None):  # noqa: ANN001, ANN202
        raise _Lost()

    unreachable.StopExecution = stop  # type: ignore[method-assign]
    monkeypatch.setattr(helpers, "_Agent", lambda c: unreachable)
    status, _ = run(monkeypatch, call)
    assert status == 1
    assert "could not stop execution ex-9 (UNAVAILABLE): it may still run" in capsys.readouterr().err


def test_harness_run_waits_for_a_restarting_agent_and_says_a_run_it_does_not_know_is_gone(monkeypatch, capsys):
    # Review 25: after a kill -9 of the agent, `harness run` tried StopExecution once, failed at once on the
    # refused connection, and said the run "may still run" -- the restarted agent had killed it.
    call = _LosingCall([started("ex-9")], -1)
    restarted = helpers._Agent(call)
    asked: list[dict] = []

    def stop(request, **kw):  # noqa: ANN001, ANN202
        asked.append(kw)
        raise PeerError(grpc.StatusCode.NOT_FOUND, "execution 'ex-9' not found: ... run by an earlier agent process")

    restarted.StopExecution = stop  # type: ignore[method-assign]
    monkeypatch.setattr(helpers, "_Agent", lambda c: restarted)
    status, _ = run(monkeypatch, call)
    assert status == 1 and asked and asked[0]["wait_for_ready"] is True and asked[0]["timeout"] > 0
    err = capsys.readouterr().err
    assert "[execution ex-9 is gone: execution 'ex-9' not found: ... run by an earlier agent process]" in err
    assert "may still run" not in err
