"""`harness app` from a user's side: a relative --app-dir is made absolute (runs start in the agent's scratch
directories, where it named nothing) and the AM refuses a relative one; Ctrl-C on `app execute` cancels the call
and exits 130 without a traceback; a plot that cannot be written is one line, not a traceback; an AM that does
not answer is hinted at with --am. The AM is a stand-in object here (the service's own check runs in-process)."""

from __future__ import annotations

import argparse
import os
import signal

import grpc
import pytest

import examples
from application_manager import cli as am_cli
from application_manager import service as svc
from harness.v1 import application_manager_pb2 as pb
from services.errors import InvalidArgument
from services.tls import plain_channel


class _Ctx:
    def is_active(self) -> bool:
        return True

    def add_callback(self, callback) -> bool:  # noqa: ANN001
        return True


class _Submit:
    def __init__(self) -> None:
        self.requests: list = []

    def SubmitApplication(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
        self.requests.append(request)
        return pb.Application(id="app-1", app_dir=request.app_dir)


def _args(**kw) -> argparse.Namespace:  # type: ignore[no-untyped-def]
    base = {"tenant": "t", "am": "127.0.0.1:1", "state_dir": None}
    return argparse.Namespace(**{**base, **kw})


def test_submit_makes_a_relative_app_dir_absolute_and_warns_of_one_that_is_no_directory(monkeypatch, tmp_path,
                                                                                       capsys):
    am = _Submit()
    monkeypatch.setattr(am_cli, "_stub", lambda args: am)
    manifest = tmp_path / "manifest.json"
    manifest.write_text(examples.manifest("rtm"))
    (tmp_path / "app").mkdir()
    monkeypatch.chdir(tmp_path)
    assert am_cli.cmd_submit(_args(manifest=str(manifest), slo=None, app_dir="app")) == 0
    assert am.requests[-1].app_dir == os.path.join(str(tmp_path.resolve()), "app")
    assert "warning" not in capsys.readouterr().err
    assert am_cli.cmd_submit(_args(manifest=str(manifest), slo=None, app_dir="nowhere")) == 0
    assert am.requests[-1].app_dir == os.path.join(str(tmp_path.resolve()), "nowhere")
    assert "is no directory on this machine" in capsys.readouterr().err
    # An absolute one is sent as given: the agents' path (compose's containers), not this machine's reading of it.
    (tmp_path / "link").symlink_to(tmp_path / "app")
    for given in (str(tmp_path / "link"), "/srv/apps/rtm"):
        assert am_cli.cmd_submit(_args(manifest=str(manifest), slo=None, app_dir=given)) == 0
        assert am.requests[-1].app_dir == given


def test_the_am_refuses_a_relative_app_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(svc.ApplicationManager, "_offered_types", lambda self: {"vm"})
    am = svc.ApplicationManager(svc.AppManagerConfig(state_dir=str(tmp_path), crs_address="127.0.0.1:1"))
    try:
        with pytest.raises(InvalidArgument) as e:
            am.SubmitApplication(pb.SubmitApplicationRequest(
                tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=400, steps=20),
                app_dir="examples/rtm"), _Ctx())
        assert "app_dir" in str(e.value.violations) and "absolute path" in str(e.value.violations)
        ok = am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", rows=400, steps=20),
            app_dir=examples.app_dir("rtm")), _Ctx())
        assert ok.app_dir == examples.app_dir("rtm")
    finally:
        am.stop()


class _Interrupted:
    """An ExecuteApplication call in progress when Ctrl-C comes."""

    def __init__(self) -> None:
        self.cancelled = False

    def result(self):  # noqa: ANN201
        raise KeyboardInterrupt

    def cancel(self) -> bool:
        self.cancelled = True
        return True


def test_ctrl_c_on_execute_cancels_the_call_and_exits_130_without_a_traceback(monkeypatch, capsys):
    call = _Interrupted()

    class _Method:
        def future(self, request, timeout=None):  # noqa: ANN001, ANN201
            return call

    class _Am:
        ExecuteApplication = _Method()

    monkeypatch.setattr(am_cli, "_stub", lambda args: _Am())
    saved = signal.getsignal(signal.SIGINT)
    try:
        rc = am_cli.cmd_execute(_args(app="app-1", slo=None, online=False, timeout=0.0))
    finally:
        signal.signal(signal.SIGINT, saved)
    err = capsys.readouterr().err
    assert rc == 130 and call.cancelled
    assert "interrupted; the AM stops the run" in err and "Traceback" not in err


def test_a_plot_that_cannot_be_written_is_one_line(monkeypatch, capsys):
    class _Am:
        def GetModel(self, request, timeout=None):  # noqa: N802, ANN001, ANN201
            return pb.PerformanceModel()

    monkeypatch.setattr(am_cli, "_stub", lambda args: _Am())
    rc = am_cli.cmd_model(_args(app="app-1", json=True, plot="/nonexistent/dir/x.png"))
    err = capsys.readouterr().err
    assert rc == 2 and "error: cannot write the plot to /nonexistent/dir/x.png" in err and "Traceback" not in err


def test_an_am_that_does_not_answer_is_hinted_at_with_am():
    channel = plain_channel("127.0.0.1:1")
    from harness.v1 import application_manager_pb2_grpc as pb_grpc

    try:
        pb_grpc.ApplicationManagerStub(channel).ListApplications(pb.ListApplicationsRequest(tenant="t"), timeout=5)
    except grpc.RpcError as e:
        err = e
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        assert am_cli._fail(err) == 1
    assert "--am HOST:PORT" in buf.getvalue() and "--crs" not in buf.getvalue()


def test_jobs_verbs_hint_at_fpga_when_nothing_answers(capsys):
    from services import commands

    args = argparse.Namespace(tenant="t", fpga="127.0.0.1:1", state_dir=None, verb="get", job="job-1")
    assert commands.cmd_jobs(args) == 1
    err = capsys.readouterr().err
    assert "error: UNAVAILABLE" in err and "--fpga HOST:PORT" in err and "--crs" not in err
