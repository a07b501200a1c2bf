"""`harness app profile`'s exit status says how the session ended: 0 only for DONE (its own stop rule), 3 when
something else stopped it (the AM shutting down, another client's StopProfiling), 1 when it failed or the stream
ended before it did; Ctrl-C stops the session (the AM would go on profiling) and ends with 130. The AM is a
stand-in object here."""

from __future__ import annotations

import argparse
import signal

import pytest

from application_manager import cli as am_cli
from harness.v1 import application_manager_pb2 as pb
from tests.unit.test_harness_run_stop import _Call

S = pb.ProfilingSession


def _session(state: int, runs: int = 0, message: str = "") -> pb.ProfilingEvent:
    return pb.ProfilingEvent(session=S(id="prof-1", application_id="app-1", state=state, runs=runs, max_runs=3,
                                       message=message))


def _run(runs: int) -> pb.ProfilingEvent:
    ev = _session(S.STATE_RUNNING, runs=runs)
    ev.run.ok = True
    ev.run.configuration.summary = f"config {runs}"
    return ev


class _Stream(_Call):
    """A StartProfiling stream: its events, with a Ctrl-C raised before event `interrupt_at` (-1: none)."""

    def __init__(self, events: list[pb.ProfilingEvent], interrupt_at: int = -1) -> None:
        super().__init__(events, interrupt_at)


class _Am:
    def __init__(self, stream: _Stream) -> None:
        self.stream, self.stopped = stream, []

    def StartProfiling(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        return self.stream

    def StopProfiling(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        self.stopped.append((request.tenant, request.session_id))
        return S(id=request.session_id, state=S.STATE_RUNNING, message="stopping: the run in progress is being "
                                                                       "cancelled")


def profile(monkeypatch: pytest.MonkeyPatch, events: list[pb.ProfilingEvent],
            interrupt_at: int = -1) -> tuple[int, _Am]:
    am = _Am(_Stream(events, interrupt_at))
    monkeypatch.setattr(am_cli, "_stub", lambda args: am)
    args = argparse.Namespace(tenant="t", app="app-1", profiler="bo", runs=3, budget=0.0, duration=0.0, seed=0,
                              warm=False, am="127.0.0.1:1", state_dir=None)
    saved = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)     # Ctrl-C's KeyboardInterrupt, whatever runs us
    try:
        return am_cli.cmd_profile(args), am
    finally:
        signal.signal(signal.SIGINT, saved)


def test_a_session_done_by_its_stop_rule_exits_0(monkeypatch, capsys):
    rc, am = profile(monkeypatch, [_session(S.STATE_RUNNING), _run(1), _session(S.STATE_DONE, 1, "iterations")])
    assert rc == 0 and am.stopped == []
    assert '"state": "STATE_DONE"' in capsys.readouterr().out


def test_a_session_stopped_by_the_am_shutting_down_exits_3_and_says_so(monkeypatch, capsys):
    # What the reviewer saw: the AM shut down, the session ended STOPPED, and the command exited 0.
    why = "stopped: profiling was stopped (StopProfiling, or the service stopping) while it ran"
    rc, am = profile(monkeypatch, [_session(S.STATE_RUNNING), _run(1), _session(S.STATE_STOPPED, 1, why)])
    out, err = capsys.readouterr()
    assert rc == am_cli.PROFILE_STOPPED == 3 and am.stopped == []
    assert '"state": "STATE_STOPPED"' in out
    assert f"session prof-1 ended STATE_STOPPED: {why}; its runs so far are in the model" in err


def test_a_failed_session_exits_1(monkeypatch, capsys):
    rc, _ = profile(monkeypatch, [_session(S.STATE_RUNNING), _session(S.STATE_FAILED, 0, "no VM shape fits")])
    assert rc == 1
    assert "ended STATE_FAILED: no VM shape fits" in capsys.readouterr().err


def test_a_stream_that_ends_before_the_session_does_exits_1(monkeypatch, capsys):
    rc, _ = profile(monkeypatch, [_session(S.STATE_RUNNING), _run(1)])
    assert rc == 1
    assert "ended the stream before session prof-1 ended" in capsys.readouterr().err


@pytest.mark.parametrize("interrupt_at", [1, 2])
def test_ctrl_c_stops_the_session_and_exits_130(monkeypatch, capsys, interrupt_at):
    # Ctrl-C after the first event (the session's id known) or in the middle of the runs: the session is stopped,
    # not left profiling (and reserving) in the AM with nobody following it.
    rc, am = profile(monkeypatch, [_session(S.STATE_RUNNING), _run(1), _run(2), _session(S.STATE_DONE, 2)],
                     interrupt_at=interrupt_at)
    err = capsys.readouterr().err
    assert rc == 130 and am.stopped == [("t", "prof-1")]
    assert "[stopped profiling session prof-1]" in err and "Traceback" not in err


def test_ctrl_c_before_the_first_event_waits_for_the_session_id_to_stop_it(monkeypatch, capsys):
    rc, am = profile(monkeypatch, [_session(S.STATE_RUNNING), _run(1)], interrupt_at=0)
    assert rc == 130 and am.stopped == [("t", "prof-1")]


def test_a_session_done_with_every_run_failed_exits_1_and_says_what_failed(monkeypatch, capsys):
    # A relative --app-dir made every run fail ("can't open file") while the session ended DONE and exit 0.
    bad = _run(1)
    bad.run.ok, bad.run.error = False, "exit code 2: python: can't open file '/scratch/examples/rtm/app.py'"
    rc, _ = profile(monkeypatch, [_session(S.STATE_RUNNING), bad, _session(S.STATE_DONE, 1, "iterations")])
    err = capsys.readouterr().err
    assert rc == am_cli.PROFILE_FAILED == 1
    assert "every run failed (1), nothing was measured; the first: exit code 2: python: can't open file" in err


def test_a_session_done_with_one_run_measured_exits_0(monkeypatch):
    bad = _run(1)
    bad.run.ok, bad.run.error = False, "exit code 1"
    rc, _ = profile(monkeypatch, [_session(S.STATE_RUNNING), bad, _run(2), _session(S.STATE_DONE, 2, "iterations")])
    assert rc == 0


def test_a_session_done_before_any_run_exits_1_and_one_with_nothing_left_exits_0(monkeypatch, capsys):
    # Its duration or budget ended it before a first run: nothing was measured (it exited 0; a review's finding).
    rc, _ = profile(monkeypatch, [_session(S.STATE_RUNNING), _session(S.STATE_DONE, 0, "duration")])
    assert rc == am_cli.PROFILE_FAILED and "ended by its duration before any run; nothing was measured" in \
        capsys.readouterr().err
    # Earlier sessions measured every configuration: the model is whole; said, and 0.
    for message in ("exhausted", "exhausted; extrapolated profiling needs at least 3 runs"):
        rc, _ = profile(monkeypatch, [_session(S.STATE_RUNNING), _session(S.STATE_DONE, 0, message)])
        assert rc == 0 and "ran nothing: earlier sessions measured every configuration" in capsys.readouterr().err
