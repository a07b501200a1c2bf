"""`harness app ...`: the Application Manager from the command line.

    harness app submit examples/rtm/manifest.json [--slo examples/rtm/slo.json] [--app-dir DIR]
    harness app profile APP_ID [--profiler bo] [--runs 10] [--budget C] [--duration S] [--seed N] [--warm]
    harness app model APP_ID [--json] [--plot frontier.png]
    harness app execute APP_ID [--slo FILE] [--online] [--timeout S]
    harness app executions [APP_ID]
    harness app list

services.commands adds these with `application_manager.cli.add_commands(sub)`. The AM's
address comes from --am, HARNESS_AM_ADDRESS, the running suite's suite.json, or :50101.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import grpc

from services.client import all_pages
from services.stream_reader import StreamReader
from services.tenants import tenant_channel

DEFAULT_STATE = os.environ.get("HARNESS_HOME", "~/.harness")


def _stub(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from harness.v1 import application_manager_pb2_grpc as pb_grpc
    from services import suite

    # No suite there and no address given: NoSuite says so (status 1), rather than trying a port nobody set.
    addr = args.am or os.environ.get("HARNESS_AM_ADDRESS") or suite.addresses(
        args.state_dir, hint="or give the --state-dir it runs from, or --am HOST:PORT").get("am") \
        or f"127.0.0.1:{suite.DEFAULT_PORTS['am']}"
    return pb_grpc.ApplicationManagerStub(tenant_channel(addr))


def _fail(e: grpc.RpcError) -> int:
    from services.commands import _fail as fail

    return fail(e, "--am")


class InputError(Exception):
    """A file named on the command line that cannot be used: `error: ...` and status 2, not a traceback."""


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"cannot read {path}: not UTF-8 text") from None


def _print(msg) -> None:  # type: ignore[no-untyped-def]
    import json

    from google.protobuf import json_format

    print(json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True,
                                                  always_print_fields_with_no_presence=True), indent=2))


def cmd_submit(args: argparse.Namespace) -> int:
    from harness.v1 import application_manager_pb2 as pb

    manifest = Path(args.manifest)
    slo = Path(args.slo) if args.slo else manifest.with_name("slo.json")
    try:
        manifest_json = _read(manifest)
        # A --slo given must be read (a typo in its name is not "no SLO"); the default one only if it is there.
        slo_json = _read(slo) if args.slo or slo.exists() else ""
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    # What %app_dir names must hold on the agents' machines, where runs start in scratch directories: a relative
    # --app-dir is taken from here; an absolute one is sent as given (under compose it is the containers' path:
    # this machine's `~` or symlinks must not rewrite it). One that is no directory here is said (the agents may
    # be elsewhere).
    app_dir = Path(os.path.abspath(args.app_dir)) if args.app_dir else manifest.resolve().parent
    if not app_dir.is_dir():
        print(f"warning: --app-dir {app_dir} is no directory on this machine; runs will fail unless it is one on "
              "the agents' machines", file=sys.stderr)
    try:
        app = _stub(args).SubmitApplication(pb.SubmitApplicationRequest(
            tenant=args.tenant, manifest_json=manifest_json, slo_json=slo_json, app_dir=str(app_dir)), timeout=60)
    except grpc.RpcError as e:
        return _fail(e)
    _print(app)
    return 0


# `harness app profile`'s exit status by how the session ended (README: Application Manager): 0 only when its
# own stop rule (runs, budget, duration) or an exhausted space ended it.
PROFILE_FAILED = 1        # FAILED, or the stream ended before the session did (an RPC error is 1 too)
PROFILE_STOPPED = 3       # STOPPED by someone else: StopProfiling from another client, or the AM shutting down
PROFILE_INTERRUPTED = 130  # Ctrl-C here: the session is stopped (128 + SIGINT, as a shell reports it)
STOP_WAIT_S = 10.0        # Ctrl-C before the AM named the session: how long to wait for its id to stop it


def profile_exit_status(session) -> int:  # type: ignore[no-untyped-def]
    from harness.v1 import application_manager_pb2 as pb

    return {pb.ProfilingSession.STATE_DONE: 0,
            pb.ProfilingSession.STATE_STOPPED: PROFILE_STOPPED}.get(session.state, PROFILE_FAILED)


def cmd_profile(args: argparse.Namespace) -> int:
    import signal

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from harness.v1 import application_manager_pb2 as pb

    console = Console(stderr=True)
    req = pb.StartProfilingRequest(tenant=args.tenant, application_id=args.app, profiler=args.profiler,
                                   max_runs=args.runs, max_cost=args.budget, max_duration_s=args.duration,
                                   seed=args.seed, warm_start=args.warm)
    final = call = stub = None
    succeeded, failed = 0, []
    try:
        stub = _stub(args)
        with Progress(TextColumn("[bold]profiling"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[last]}"),
                      console=console) as progress:
            task = progress.add_task("p", total=args.runs, last="")
            # Read on a thread of its own: Ctrl-C must not interrupt the call itself (services/stream_reader.py).
            call = StreamReader(stub.StartProfiling(req, timeout=None))
            for ev in call.start():
                if ev.HasField("run"):
                    r = ev.run
                    if r.ok:
                        succeeded += 1
                    else:
                        failed.append(r.error)
                    progress.update(task, advance=1, last=f"{r.configuration.summary}: "
                                    f"{r.execution_time_s:.2f} s, {r.cost:.5f}" + ("" if r.ok else f" ({r.error})"))
                final = ev.session
    except grpc.RpcError as e:
        return _fail(e)
    except KeyboardInterrupt:
        # The AM goes on profiling when the stream ends (StartProfiling's contract): Ctrl-C means stop, so the
        # session is stopped, not left running (and reserving) with nothing following it. A second Ctrl-C does
        # not interrupt that.
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            _stop_session(stub, call, final, args.tenant)
        finally:
            signal.signal(signal.SIGINT, before)
        return PROFILE_INTERRUPTED
    if final is None or final.state == pb.ProfilingSession.STATE_RUNNING:
        if final is not None:
            _print(final)
        print(f"harness app profile: the AM ended the stream before session {final.id if final else '?'} ended; "
              "it may still run (`harness app model` shows its runs)", file=sys.stderr)
        return PROFILE_FAILED
    _print(final)
    status = profile_exit_status(final)
    if status:
        state = pb.ProfilingSession.State.Name(final.state)
        print(f"harness app profile: session {final.id} ended {state}: {final.message or 'no reason given'}"
              + ("; its runs so far are in the model" if final.runs else ""), file=sys.stderr)
    elif failed and not succeeded:
        # Done by its rule, but nothing was measured: a wrong %app_dir, a command that cannot start, a CRS that
        # has no room. Exit 0 would read as a profiled application.
        print(f"harness app profile: session {final.id} ended with every run failed ({len(failed)}), nothing was "
              f"measured; the first: {failed[0][:500]} (`harness app model {args.app} --json` shows each)",
              file=sys.stderr)
        return PROFILE_FAILED
    elif not final.runs and final.message.startswith("exhausted"):     # "exhausted; <the profiler's note>"
        # Earlier sessions measured every configuration: the model is whole, nothing was left to run.
        print(f"harness app profile: session {final.id} ran nothing: earlier sessions measured every configuration "
              f"(`harness app model {args.app}` shows them)", file=sys.stderr)
    elif not final.runs:
        print(f"harness app profile: session {final.id} ended by its {final.message or 'rule'} before any run; "
              "nothing was measured", file=sys.stderr)
        return PROFILE_FAILED
    return status


def _stop_session(stub, call, final, tenant: str) -> None:  # type: ignore[no-untyped-def]
    """Ctrl-C: StopProfiling on the session being followed (named by its last event `final`, or by the next
    one of `call`), saying what became of it."""
    from harness.v1 import application_manager_pb2 as pb

    session = final.id if final is not None else _session_id(call, STOP_WAIT_S)
    if stub is None or not session:
        print("harness app profile: interrupted before the AM named the session; if it started, it goes on "
              "(`harness app model` shows its runs)", file=sys.stderr)
        return
    try:
        stopped = stub.StopProfiling(pb.StopProfilingRequest(tenant=tenant, session_id=session), timeout=10)
    except grpc.RpcError as e:
        print(f"harness app profile: could not stop session {session} ({e.code().name}: {e.details()}): it may "
              "go on", file=sys.stderr)
        return
    _print(stopped)
    print(f"[stopped profiling session {session}]", file=sys.stderr)


def _session_id(call: StreamReader | None, wait_s: float) -> str:
    """The session id from the next event of the StartProfiling stream `call` ("" if none within `wait_s`:
    the stream is then cancelled)."""
    if call is None:
        return ""
    ev = call.start().first(lambda ev: True, wait_s)
    if ev is None:
        call.cancel()
        return ""
    return ev.session.id


def cmd_model(args: argparse.Namespace) -> int:
    from harness.v1 import application_manager_pb2 as pb

    try:
        model = _stub(args).GetModel(pb.GetModelRequest(tenant=args.tenant, application_id=args.app), timeout=30)
    except grpc.RpcError as e:
        return _fail(e)
    if args.plot:
        from application_manager.demo import plot

        try:
            print(f"plot written to {plot(model, args.plot, args.app)}", file=sys.stderr)
        except OSError as e:
            print(f"error: cannot write the plot to {args.plot}: {e.strerror or e}", file=sys.stderr)
            return 2
    if args.json:
        _print(model)
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Pareto frontier of {args.app} ({len(model.runs)} runs)")
    for col in ("configuration", "time s", "cost", "predicted"):
        table.add_column(col)
    for p in model.frontier:
        table.add_row(p.configuration.summary, f"{p.execution_time_s:.3f}", f"{p.cost:.5f}", "yes" if p.predicted else "")
    Console().print(table)
    return 0


def cmd_execute(args: argparse.Namespace) -> int:
    from harness.v1 import application_manager_pb2 as pb

    try:
        slo_json = _read(Path(args.slo)) if args.slo else ""
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    call = None
    try:
        call = _stub(args).ExecuteApplication.future(pb.ExecuteApplicationRequest(
            tenant=args.tenant, application_id=args.app, slo_json=slo_json, online=args.online,
            timeout_s=args.timeout), timeout=None)
        ex = call.result()
    except grpc.RpcError as e:
        return _fail(e)
    except KeyboardInterrupt:
        # The call's cancel is the stop (README: a client that cancels stops the run): the AM kills the program,
        # releases the reservation and records the execution FAILED.
        if call is not None:
            call.cancel()
        print("harness app execute: interrupted; the AM stops the run, releases its reservation and records the "
              "execution FAILED (`harness app executions` shows it)", file=sys.stderr)
        return PROFILE_INTERRUPTED
    _print(ex)
    return 0 if ex.state == pb.ApplicationExecution.STATE_SUCCEEDED else 1


def cmd_executions(args: argparse.Namespace) -> int:
    from harness.v1 import application_manager_pb2 as pb

    try:
        _print(all_pages(_stub(args).ListExecutions,
                          pb.ListExecutionsRequest(tenant=args.tenant, application_id=args.app or ""), "executions"))
    except grpc.RpcError as e:
        return _fail(e)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from harness.v1 import application_manager_pb2 as pb

    try:
        _print(all_pages(_stub(args).ListApplications, pb.ListApplicationsRequest(tenant=args.tenant),
                          "applications"))
    except grpc.RpcError as e:
        return _fail(e)
    return 0


def cmd_replay_manifest(args: argparse.Namespace) -> int:
    from application_manager.replay import Dataset, DatasetError

    try:
        data = Dataset.load(args.dataset).manifest(args.workload)
    except (OSError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    text = json.dumps(data, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
        print(f"wrote {args.output}: {len(data['Modules'][0]['Parameters'])} parameters")
    else:
        print(text)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    app = sub.add_parser("app", help="the Application Manager: submit, profile, model, execute under an SLO")
    verbs = app.add_subparsers(dest="verb", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--state-dir", default=DEFAULT_STATE)
        p.add_argument("--am", help="Application Manager address (default: from the running suite)")
        p.add_argument("--tenant", default=os.environ.get("HARNESS_TENANT", "demo"))

    p = verbs.add_parser("submit", help="submit a manifest (and its SLO; default: slo.json beside it)")
    common(p)
    p.add_argument("manifest")
    p.add_argument("--slo")
    p.add_argument("--app-dir", help="what %%app_dir stands for (default: the manifest's directory)")
    p.set_defaults(func=cmd_submit)

    p = verbs.add_parser("profile", help="profile an application, with a progress bar")
    common(p)
    p.add_argument("app")
    p.add_argument("--profiler", default="bo", help="uniform, sa, utilisation, directed-sa, extrapolated, bo")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--budget", type=float, default=0.0)
    p.add_argument("--duration", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warm", action="store_true", help="learn from the tenant's other applications")
    p.set_defaults(func=cmd_profile)

    p = verbs.add_parser("model", help="the performance model (Pareto frontier)")
    common(p)
    p.add_argument("app")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", help="write a PNG of the runs and the frontier here")
    p.set_defaults(func=cmd_model)

    p = verbs.add_parser("execute", help="run under the SLO (the submitted one, or --slo FILE)")
    common(p)
    p.add_argument("app")
    p.add_argument("--slo")
    p.add_argument("--online", action="store_true", help="online profiling when nothing meets the SLO yet")
    p.add_argument("--timeout", type=float, default=0.0, metavar="S",
                   help="kill the run after S seconds (default: the larger of the AM's run_timeout_s and twice the "
                        "time the model gives the chosen configuration, at most 7 days); a run killed at this "
                        "--timeout ends FAILED but the model keeps its configuration; killed at the default limit, "
                        "the configuration fails (it took more than twice the model's time)")
    p.set_defaults(func=cmd_execute)

    p = verbs.add_parser("executions", help="past executions")
    common(p)
    p.add_argument("app", nargs="?")
    p.set_defaults(func=cmd_executions)

    p = verbs.add_parser("replay-manifest", help="a manifest that profiles a dataset's workload on a replay agent")
    p.add_argument("dataset", help="a CSV in the replay format (README: Replay datasets)")
    p.add_argument("workload")
    p.add_argument("-o", "--output", help="write it here (default: stdout)")
    p.set_defaults(func=cmd_replay_manifest)

    p = verbs.add_parser("list", help="the tenant's applications")
    common(p)
    p.set_defaults(func=cmd_list)
