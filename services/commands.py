"""CLI verbs: run the suite, check it, and use it as a tenant."""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import sys
import threading
import uuid
from pathlib import Path

import grpc
from google.protobuf import json_format

from services import tls
from services.client import all_pages
from services.stream_reader import StreamReader

DEFAULT_STATE = os.environ.get("HARNESS_HOME", "~/.harness")


def _crs(args: argparse.Namespace) -> str:
    from services import suite

    return args.crs or suite.addresses(args.state_dir).get("crs") or f"127.0.0.1:{suite.DEFAULT_PORTS['crs']}"


def _irm(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from harness.v1 import irm_pb2_grpc
    from services.tenants import tenant_channel

    return irm_pb2_grpc.ResourceManagerStub(tenant_channel(_crs(args)))


def _print(msg) -> None:  # type: ignore[no-untyped-def]
    print(json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True,
                                                  always_print_fields_with_no_presence=True), indent=2))


def _fail(e: grpc.RpcError, option: str = "--crs", agent: str = "") -> int:
    """The error and its field violations on stderr, status 1; `option` is the command's address option (the
    hint when nothing answers there); `agent`: the failed call went to the execution agent at that address (from
    the reservation), not to a service the options name."""
    print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
    from services.errors import error_info, field_violations

    if agent and e.code() == grpc.StatusCode.UNAVAILABLE and error_info(e) is None:
        # Not the agent's own answer (it says why, e.g. its compute IRM out of reach): no answer from it at all.
        print(f"  the VM's execution agent at {agent} (the address the reservation gives) did not answer: it may be "
              "restarting, or have moved with its compute IRM; `harness status` shows the suite, `harness "
              "reservations` the VM's address now", file=sys.stderr)
    elif e.code() == grpc.StatusCode.UNAVAILABLE and (why := connection_trouble(e.details() or "")) is not None:
        print(f"  a service answers there, but not to this client: {why}", file=sys.stderr)
    elif e.code() == grpc.StatusCode.UNAVAILABLE and "failed to connect" in (e.details() or ""):
        print("  is a suite running there? The CLI finds the one `harness up` started through --state-dir (default "
              f"$HARNESS_HOME or ~/.harness), or give {option} HOST:PORT", file=sys.stderr)
    for f, d in field_violations(e):
        print(f"  {f}: {d}", file=sys.stderr)
    return 1


def _service_address(text: str) -> tuple[str, str]:
    """argparse type of `harness status --service`: NAME=HOST:PORT, NAME one of the suite's services."""
    from services import suite
    from services.config import ConfigError, check_address

    name, sep, address = text.partition("=")
    if not sep or name not in suite.DEFAULT_PORTS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=HOST:PORT, NAME one of "
                                         f"{', '.join(suite.DEFAULT_PORTS)}")
    try:
        check_address(address)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name, address


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE")
    return name, value


# -- up / status ------------------------------------------------------------
def cmd_up(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from services import suite
    from services.config import ConfigError

    console = Console(stderr=True)
    stop = threading.Event()

    def on_signal(signum, _frame):  # type: ignore[no-untyped-def]
        # A flag, never an exception: one raised mid-start or mid-stop would abandon services half started or
        # half stopped. Start-up (up to a minute a service), a restart's back-off and its start watch it too;
        # stopping ignores signals.
        stop.set()

    # A closed terminal (SIGHUP) stops the suite too: its services run in sessions of their own, so no
    # signal but ours reaches them, and they would outlive `harness up`.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    environ = dict(os.environ)
    if args.tenants:
        environ[suite.TENANTS_FILE_ENV] = args.tenants
    try:
        policy = suite.RestartPolicy.from_environ(os.environ)
        procs = suite.start(args.state_dir, auto_ports=args.auto_ports, config_file=args.config, cancel=stop,
                            environ=environ, tls=args.tls,
                            on_started=lambda p: console.print(f"[green]started[/] {p.name:10} {escape(p.address)}"))
    except suite.Cancelled:           # `suite.start` stopped what it had started
        console.print("interrupted while starting; stopped")
        return 130
    except ConfigError as e:
        print(f"harness up: {e}", file=sys.stderr)
        return 2
    except suite.SuiteRunning as e:
        print(f"harness up: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001
        print(f"harness up failed: {e}", file=sys.stderr)
        return 1
    console.print(f"Harness is up ({len(procs)} services; logs in {escape(args.state_dir)}/logs). Ctrl-C stops it.")
    if args.tls:
        console.print(f"TLS: the suite's CA is {escape(str(suite.tls_ca(args.state_dir)))} (the CLI trusts it for "
                      f"this --state-dir; other clients: HARNESS_TLS_CA_FILE)")
    try:
        # A service that exits is started again (same address, settings and control token) after a back-off;
        # one that keeps crashing stops the suite (README: Running the suite).
        suite.supervise(procs, stop, policy, say=lambda line: console.print(escape(line), highlight=False))
    except suite.GaveUp as e:
        console.print(f"[red]{escape(str(e))}; giving up on it: stopping the suite[/]")
        print(e.proc.logs()[-2000:], file=sys.stderr)
        return 1
    finally:
        console.print("stopping ...")
        suite.stop(procs)
        suite.state_file(args.state_dir).unlink(missing_ok=True)
    return 0


def _tenants_file(args: argparse.Namespace) -> str:
    from services import suite

    return args.file or os.environ.get(suite.TENANTS_FILE_ENV) or str(Path(args.state_dir).expanduser() / "tenants.yaml")


def cmd_tenant(args: argparse.Namespace) -> int:
    """`harness tenant add|remove|list`: the tenants file (services.tenants) the services check tokens against."""
    from services import tenants
    from services.config import ConfigError

    path = _tenants_file(args)
    try:
        if args.verb == "add":
            token = tenants.add(path, args.name)
            print(token)
            print(f"harness tenant: {args.name!r} added to {path} (any token it had before stops working). The token "
                  "above is kept nowhere else: give it to the tenant, who sends it as HARNESS_TENANT_TOKEN. Running "
                  "services read the file again within a second; start a suite with it by `harness up --tenants "
                  f"{path}`.", file=sys.stderr)
            return 0
        if args.verb == "remove":
            if not tenants.remove(path, args.name):
                print(f"harness tenant: no tenant {args.name!r} in {path}", file=sys.stderr)
                return 1
            print(f"harness tenant: {args.name!r} removed from {path}: its token stops working within a second",
                  file=sys.stderr)
            return 0
        if args.verb == "delegation":
            token = tenants.new_token()
            print(f"HARNESS_DELEGATION_TOKEN={token}\nHARNESS_DELEGATION_SHA256={tenants.digest(token)}")
            print("harness tenant: a new delegation token (for the CRS's and the AM's delegation_token) and its "
                  "digest (for delegation_sha256 of the CRS, the compute IRM, the agents and the FPGA IRM), as "
                  "compose's .env takes them; `harness up --tenants` makes its own", file=sys.stderr)
            return 0
        for name in sorted(tenants.read(path) if Path(path).exists() else {}):
            print(name)
        return 0
    except (ConfigError, OSError) as e:
        print(f"harness tenant: {e}", file=sys.stderr)
        return 2


def cmd_tls(args: argparse.Namespace) -> int:
    from services.config import ConfigError

    out = {}
    try:
        out["services"] = tls.generate(args.dir, args.host, out=str(Path(args.dir) / "services"))
        if args.agent_host:
            out["agent"] = tls.generate(args.dir, args.agent_host, out=str(Path(args.dir) / "agent"))
    except (ConfigError, OSError) as e:
        print(f"harness tls: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2))
    print(f"harness tls: give each service its directory's server.pem/server.key (tls_cert_file/tls_key_file) and "
          f"ca.pem (tls_ca_file; clients HARNESS_TLS_CA_FILE); compose: HARNESS_TLS_DIR={_compose_path(args.dir, 'services')}"
          + (f", HARNESS_TLS_DIR_AGENT={_compose_path(args.dir, 'agent')}" if args.agent_host else "")
          + f". Mount neither {Path(args.dir) / 'ca.key'} nor the services' key where tenants' programs run (the "
          "agents): with it they could pose as any service.", file=sys.stderr)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from services import suite

    try:
        print(suite.down(args.state_dir), file=sys.stderr)
    except suite.SuiteRunning as e:
        print(f"harness down: {e}", file=sys.stderr)
        return 1
    return 0


def health_of(addresses: dict[str, str], timeout: float = 2.0) -> list[dict]:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    out = []
    for name, address in addresses.items():
        entry = {"name": name, "address": address}
        try:
            with tls.open_channel(address) as ch:
                reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""),
                                                            timeout=timeout)
            entry["status"] = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.RpcError as e:
            entry["status"] = "UNREACHABLE"
            entry["error"] = e.code().name
            if (why := connection_trouble(e.details() or "")) is not None:
                entry["connection"] = why
        out.append(entry)
    return out


def connection_trouble(details: str) -> str | None:
    """What a failed call's details say of the connection, when it is TLS that failed (a service that runs,
    refused by this client's TLS settings or its certificate) rather than no service there; None otherwise."""
    if "handshake" in details.lower() or "ssl" in details.lower() or "certificate" in details.lower():
        said = details.split("last error: ", 1)[-1]
        return (f"the TLS handshake failed ({said[:300]}): the CA this client trusts (HARNESS_TLS_CA_FILE, "
                "`tls_ca_file` of a service) must be the one that signed the service's certificate, which must be "
                "valid now and name the host dialled")
    if "Socket closed" in details and tls.roots() is None:
        return ("it closed the connection this client opened without TLS: if it serves TLS, give this client its "
                "CA (HARNESS_TLS_CA_FILE=.../ca.pem)")
    return None


# The suite's infrastructure resource managers: each registers with the CRS (services.registration), which
# places nothing on one it does not know.
IRMS = ("compute", "fpga")
# How long `harness status` waits for an IRM that serves but is not (live) registered yet: one started moments
# ago registers within a second, one the CRS restarted without heartbeats within its heartbeat interval.
REGISTRATION_GRACE_S = 3.0


def _manager_name(address: str, timeout: float) -> str:
    """The name the IRM at `address` registers under (as its DescribeAllocationSpec says), "" if it does not
    say."""
    from harness.v1 import irm_pb2, irm_pb2_grpc

    try:
        with tls.open_channel(address) as ch:
            reply = irm_pb2_grpc.ResourceManagerStub(ch).DescribeAllocationSpec(
                irm_pb2.DescribeAllocationSpecRequest(), timeout=timeout)
    except grpc.RpcError:
        return ""
    return next((t.manager for t in reply.resource_types if t.manager), "")


def _registration(entry: dict, managers: list, refused: list = ()) -> None:  # type: ignore[type-arg]
    """Set `entry`'s crs_* fields from the CRS's managers: the one registered under the IRM's name (or, when
    its name is not known, at its address, or under the service's name); `refused`: the registrations the CRS
    refused under names it has no manager of."""
    name, address = entry.get("manager", ""), entry["address"]
    if name:
        m = next((m for m in managers if m.name == name), None)
    else:
        m = next((m for m in managers if m.address == address), None) or \
            next((m for m in managers if m.name == entry["name"]), None)
    for key in ("crs_registered_address", "crs_up", "crs_follow_error", "crs_refused"):
        entry.pop(key, None)
    if m is None:
        entry["crs_registration"] = "not_registered"
        said = next((r for r in refused if r.name == (name or entry["name"]) or r.address == address), None)
        if said is not None:
            entry["crs_refused"] = said.refused
        return
    if m.refused:
        entry["crs_refused"] = m.refused
    entry["manager"] = m.name
    entry["crs_registered_address"] = m.address
    entry["crs_up"] = m.up
    entry["crs_follow_error"] = m.follow_error
    if m.address != address:
        entry["crs_registration"] = "registered_elsewhere"
    else:
        entry["crs_registration"] = "registered" if m.up else "registered_down"


def _live(entry: dict) -> bool:
    """Whether the CRS has a live registration for the IRM of `entry` (at another address too: the one the IRM
    advertises, say, as under compose)."""
    return entry.get("crs_registration") in ("registered", "registered_elsewhere") and bool(entry.get("crs_up"))


def registrations_of(services: list[dict], addresses: dict[str, str], timeout: float = 2.0,
                     grace: float = REGISTRATION_GRACE_S) -> dict:
    """Whether the CRS of `addresses` knows each IRM of `services` (entries of `health_of`, given crs_* fields
    and the IRM's manager name): the CRS's address, whether it answered, and the problems (the exit status
    fails) and warnings to show."""
    import time

    from harness.v1 import registry_pb2, registry_pb2_grpc
    from services.catalog import SERVICES

    irms = [s for s in services if s["name"] in IRMS]
    crs = addresses.get("crs")
    report: dict = {"address": crs, "reachable": False, "problems": [], "warnings": []}
    if not irms:
        return report
    for s in irms:
        s["manager"] = _manager_name(s["address"], timeout) if s["status"] == "SERVING" else ""
        s["crs_registration"] = "unknown"
    crs_entry = next((s for s in services if s["name"] == "crs"), None)
    if crs is None:
        report["problems"].append("no CRS among the suite's services: cannot tell whether its IRMs are "
                                  "registered with one")
        return report
    if crs_entry is not None and crs_entry["status"] == "UNREACHABLE":
        report["error"] = crs_entry.get("error", "UNAVAILABLE")
        report["problems"].append(f"the CRS at {crs} is unreachable ({report['error']}): cannot tell whether the "
                                  f"IRMs ({', '.join(s['name'] for s in irms)}) are registered with it")
        return report
    deadline = time.monotonic() + grace
    with tls.open_channel(crs) as ch:
        stub = registry_pb2_grpc.ManagerRegistryStub(ch)
        while True:
            try:
                listed = stub.ListManagers(registry_pb2.ListManagersRequest(), timeout=timeout)
                managers, refusals = list(listed.managers), list(listed.refused)
            except grpc.RpcError as e:
                report["error"] = e.code().name
                report["problems"].append(
                    f"the CRS at {crs} did not list its managers ({e.code().name}: {e.details() or ''}): cannot "
                    f"tell whether the IRMs ({', '.join(s['name'] for s in irms)}) are registered with it")
                for s in irms:
                    for key in ("crs_registered_address", "crs_up", "crs_follow_error"):
                        s.pop(key, None)
                    s["crs_registration"] = "unknown"
                return report
            report["reachable"] = True
            for s in irms:
                _registration(s, managers, refusals)
            # Registering right now (`harness up` just returned), or reconnecting its capacity stream.
            waiting = [s for s in irms if s["status"] == "SERVING" and (not _live(s) or s.get("crs_follow_error"))]
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(0.1)     # it may be registering right now (`harness up` just returned)
    for s in irms:
        if s["status"] != "SERVING":
            continue            # its health fails the status already
        section = SERVICES[s["name"]].section if s["name"] in SERVICES else s["name"]
        fix = (f"its crs_address setting must point at the CRS's address {crs} (`crs_address` in the "
               f"`{section}` section of the config file, or HARNESS_{section.upper()}_CRS_ADDRESS; under "
               f"`harness up` leave it out and the suite wires it), then restart it; if it does, the IRM cannot "
               f"reach the CRS: its log says why (with TLS: a `tls_ca_file` that is not the CA of the CRS's "
               f"certificate)")
        who = f"{s['name']} at {s['address']}"
        manager = s.get("manager") or s["name"]
        state = s["crs_registration"]
        if s.get("crs_refused") and state in ("not_registered", "registered_down"):
            # The CRS said why: not the address, whatever the state suggests.
            token = s["crs_refused"].startswith("UNAUTHENTICATED")
            fix = (f"the CRS refuses its registrations or heartbeats ({s['crs_refused']})"
                   + (f": give {s['name']} the CRS's control_token (`control_token` in both sections, "
                      "HARNESS_CONTROL_TOKEN in compose), then restart it" if token else ""))
        if state == "not_registered" and not s.get("manager"):
            # It did not say its name (its DescribeAllocationSpec failed: the FPGA IRM's waits on its servers, and
            # one may hang): it may be registered under a name of its own at an advertised address. Not proven.
            report["warnings"].append(
                f"{who} did not say the name it registers under (DescribeAllocationSpec failed), and the CRS at "
                f"{crs} has no manager at its address or named {s['name']!r}: if it has a `name` and an "
                f"`advertise_address` of its own, run `harness status` again; otherwise {fix}")
        elif state == "not_registered":
            report["problems"].append(f"{who} serves but is not registered with the CRS at {crs} (it knows no "
                                      f"manager {manager!r}): the CRS places no reservation on it; {fix}")
        elif state == "registered_down":
            report["problems"].append(f"{who} is registered with the CRS at {crs} as {manager!r} but marked down "
                                      f"(its heartbeats do not arrive there): the CRS places no reservation on "
                                      f"it; {fix}")
        elif _live(s) and s.get("crs_follow_error"):
            report["problems"].append(f"{who} is registered with the CRS at {crs} as {manager!r} at "
                                      f"{s['crs_registered_address']}, but the CRS cannot follow its capacity "
                                      f"({s['crs_follow_error']}): it places nothing there until it can (its log "
                                      "says more)")
        elif state == "registered_elsewhere" and not s["crs_up"]:
            report["problems"].append(
                f"{who} is not registered with the CRS at {crs}: it has {manager!r} at "
                f"{s['crs_registered_address']}, marked down, and places no reservation on it; {fix}")
        elif state == "registered_elsewhere":
            report["warnings"].append(
                f"the CRS at {crs} reaches {manager!r} at {s['crs_registered_address']}, not at {s['address']} "
                f"where {s['name']} serves: fine if that is the address it advertises (`advertise_address` in "
                f"the `{section}` section); otherwise another process registered under its name and {s['name']} "
                f"needs a `name` of its own")
    return report


def _crs_column(s: dict) -> str:
    state = s.get("crs_registration")
    manager = s.get("manager") or s["name"]
    if state == "registered":
        return f"crs: registered as {manager!r}"
    if state == "registered_down":
        return f"crs: registered as {manager!r}, marked DOWN"
    if state == "registered_elsewhere":
        return (f"crs: registered as {manager!r} at {s['crs_registered_address']}"
                f"{'' if s.get('crs_up') else ', marked DOWN'}")
    if state == "not_registered":
        return "crs: NOT REGISTERED"
    return "crs: unknown"


def _service_problem(s: dict, state_dir: str | None) -> str:
    """What to do about a service that does not serve (`state_dir`: the suite's; None: not one `harness up` runs)."""
    if s["status"] == "UNREACHABLE":
        if s.get("connection"):             # it runs, but this client cannot talk to it: not a start or restart
            return f"{s['name']} at {s['address']} cannot be reached over this connection: {s['connection']}"
        head = f"{s['name']} at {s['address']} does not answer ({s.get('error', 'no answer')})"
        if state_dir is None:
            return f"{head}: start it (under compose, `docker compose logs {s['name']}` says why it stopped)"
        return (f"{head}: `harness up` restarts a service that exits (see {state_dir}/logs/{s['name']}.log); if it "
                "gave up on it, or the suite was killed, `harness down` then `harness up`")
    return f"{s['name']} at {s['address']} answers {s['status']}: it is starting or stopping; check again shortly"


def cmd_status(args: argparse.Namespace) -> int:
    from services import suite

    if getattr(args, "service", None):
        if args.default_ports:
            print("harness status: give --service or --default-ports, not both", file=sys.stderr)
            return 2
        addresses = dict(args.service)      # a deployment of `harness serve`s: the services named, where named
    elif getattr(args, "default_ports", False):
        addresses = {name: f"127.0.0.1:{port}" for name, port in suite.DEFAULT_PORTS.items()}
    else:
        try:
            addresses = suite.addresses(args.state_dir, hint="or give the --state-dir it runs from; "
                                                              "--default-ports checks 127.0.0.1:50051... instead")
        except suite.NoSuite as e:
            if args.json:
                print(json.dumps({"ok": False, "services": [], "crs_registry": None, "problems": [e.message],
                                  "warnings": []}, indent=2))
            print(f"harness status: {e.message} ({e.hint})", file=sys.stderr)
            return 1
    services = health_of(addresses)
    registry = registrations_of(services, addresses)
    problems, warnings = registry.pop("problems"), registry.pop("warnings")
    # A service down is the first thing to fix: said before what its absence does to the registrations.
    state_dir = None if getattr(args, "default_ports", False) or getattr(args, "service", None) else args.state_dir
    problems[:0] = [_service_problem(s, state_dir) for s in services if s["status"] != "SERVING"]
    # All SERVING, a suite whose `harness up` was killed still does not survive its next crash: said first.
    if state_dir is not None and (unsupervised := suite.unsupervised(state_dir)) is not None:
        problems.insert(0, unsupervised)
    checked = any(s["name"] in IRMS for s in services)
    ok = all(s["status"] == "SERVING" for s in services) and not problems
    if args.json:
        print(json.dumps({"ok": ok, "services": services, "crs_registry": registry if checked else None,
                          "problems": problems, "warnings": warnings}, indent=2))
    else:
        for s in services:
            line = f"{s['name']:10} {s['address']:22} {s['status']}"
            if "crs_registration" in s:
                line = f"{line:45} {_crs_column(s)}"
            print(line)
        for p in problems:
            print(f"harness status: {p}", file=sys.stderr)
        for w in warnings:
            print(f"harness status: note: {w}", file=sys.stderr)
    return 0 if ok else 1


# -- tenant verbs -----------------------------------------------------------
def _group(text: str):  # type: ignore[no-untyped-def]
    """name=web,type=vm,count=2,cores=2,memory_gb=4,traits=ssd+avx512,frequency_ghz=2.0..3.0"""
    from harness.v1 import common_pb2, irm_pb2

    g = irm_pb2.ResourceGroup(resource_type="vm", count=1)
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--group: {part!r} is not key=value")
        key = key.strip()
        if key == "name":
            g.name = value
        elif key == "type":
            g.resource_type = value
        elif key == "count":
            g.count = int(value)
        elif key == "traits":
            g.required_traits.extend(t for t in value.split("+") if t)
        elif key == "not_traits":
            g.forbidden_traits.extend(t for t in value.split("+") if t)
        elif ".." in value:
            lo, hi = value.split("..", 1)
            r = common_pb2.Range()
            if lo:
                r.min = float(lo)
            if hi:
                r.max = float(hi)
            g.attributes[key].range.CopyFrom(r)
        else:
            try:
                g.attributes[key].number = float(value)
            except ValueError:
                g.attributes[key].text = value
    return g


def _show(call, option: str = "--crs") -> int:  # type: ignore[no-untyped-def]
    """Make one call (to the CRS, or the service `option` addresses) and print its reply as JSON, or the error and
    its field violations."""
    try:
        _print(call())
    except grpc.RpcError as e:
        return _fail(e, option)
    return 0


def cmd_discover(args: argparse.Namespace) -> int:
    from harness.v1 import irm_pb2

    return _show(lambda: _irm(args).DiscoverResources(irm_pb2.DiscoverResourcesRequest(tenant=args.tenant),
                                                      timeout=10))


def cmd_managers(args: argparse.Namespace) -> int:
    """The CRS's managers (`list`), or one taken out for good (`deregister`): an operator's verbs. Deregistering is
    a control call: the token is $HARNESS_CONTROL_TOKEN, else that of the suite `harness up` runs from --state-dir
    (not sent to a CRS --crs names: it is that suite's secret)."""
    from harness.v1 import registry_pb2, registry_pb2_grpc
    from services import control, suite, tls

    token = os.environ.get("HARNESS_CONTROL_TOKEN", "").strip() or (
        "" if args.crs else suite.control_token(args.state_dir))
    with tls.open_channel(_crs(args)) as ch:
        stub = registry_pb2_grpc.ManagerRegistryStub(control.channel(ch, token))
        if args.verb != "deregister":
            return _show(lambda: stub.ListManagers(registry_pb2.ListManagersRequest(), timeout=10))
        try:
            _print(stub.DeregisterManager(registry_pb2.DeregisterManagerRequest(
                name=args.name, abandon_parts=args.abandon_parts), timeout=30))
        except grpc.RpcError as e:
            status = _fail(e)
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                sent = ("$HARNESS_CONTROL_TOKEN" if os.environ.get("HARNESS_CONTROL_TOKEN", "").strip() else
                        "no token" if args.crs else f"the token of the suite running from {args.state_dir}")
                print(f"  it takes the CRS's control_token; this sent {sent}: set HARNESS_CONTROL_TOKEN to the "
                      "CRS's (with --crs the suite's own token is not sent)", file=sys.stderr)
            return status
        return 0


def _seconds(text: str) -> float:
    """argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _number_text(value: float) -> str:
    """`value` as --group reads it back to the same float."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def _group_text(g) -> str:  # type: ignore[no-untyped-def]
    """The --group text `_group` parses into `g` (the same ResourceGroup)."""
    parts = [f"name={g.name}"] if g.name else []
    if g.resource_type != "vm":
        parts.append(f"type={g.resource_type}")
    if g.count != 1:
        parts.append(f"count={g.count}")
    if g.required_traits:
        parts.append("traits=" + "+".join(g.required_traits))
    if g.forbidden_traits:
        parts.append("not_traits=" + "+".join(g.forbidden_traits))
    for key, a in g.attributes.items():
        which = a.WhichOneof("value")
        if which == "range":
            lo = _number_text(a.range.min) if a.range.HasField("min") else ""
            hi = _number_text(a.range.max) if a.range.HasField("max") else ""
            parts.append(f"{key}={lo}..{hi}")
        elif which == "text":
            parts.append(f"{key}={a.text}")
        else:
            parts.append(f"{key}={_number_text(a.number)}")
    return ",".join(parts)


def _compose_path(directory: str, name: str) -> str:
    """`directory`/`name` as compose's volumes take a host path: starting with ./ or / (a bare `tls/services` is a
    named volume there)."""
    path = str(Path(directory) / name)
    return path if path.startswith(("/", "./", "../", "~")) else f"./{path}"


def _reserve_command(args: argparse.Namespace, req, timeout: float | None = None) -> str:  # type: ignore[no-untyped-def]
    """The `harness reserve` command that sends `req` again, request id included (a shell line); `timeout`: its
    --timeout (default: the one `args` gave)."""
    import shlex

    argv = ["harness", "reserve"]
    if args.state_dir != "~/.harness":     # HARNESS_HOME's too: the retry may run where it is not set
        argv += ["--state-dir", args.state_dir]
    if args.crs:
        argv += ["--crs", args.crs]
    argv += ["--tenant", req.tenant]
    for g in req.groups:
        argv += ["--group", _group_text(g)]
    for c in req.constraints:
        argv += ["--constraint", c.expression]
    if req.priority:
        argv += ["--priority", str(req.priority)]
    if req.HasField("max_price_per_minute"):
        argv += ["--max-price", repr(req.max_price_per_minute)]
    timeout = args.timeout if timeout is None else timeout
    if timeout is not None:
        argv += ["--timeout", _number_text(timeout)]
    argv += ["--request-id", req.request_id]
    return shlex.join(argv)


# A Reserve that failed so may have been made all the same (the answer was lost, or the call given up on).
_IN_DOUBT = (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
             grpc.StatusCode.UNKNOWN)


def cmd_reserve(args: argparse.Namespace) -> int:
    from harness.v1 import irm_pb2
    from services.errors import CREDENTIALS_REFUSED, error_info

    req = irm_pb2.ReserveRequest(tenant=args.tenant, request_id=args.request_id or uuid.uuid4().hex,
                                 groups=args.group, priority=args.priority,
                                 constraints=[irm_pb2.GroupConstraint(expression=c) for c in args.constraint or []])
    if args.max_price is not None:
        req.max_price_per_minute = args.max_price
    if args.quote:
        return _show(lambda: _irm(args).QuotePrice(irm_pb2.QuotePriceRequest(
            tenant=args.tenant, groups=req.groups, constraints=req.constraints), timeout=args.timeout or 30))
    waited = args.timeout or 60
    try:
        _print(_irm(args).Reserve(req, timeout=waited))
    except grpc.RpcError as e:
        status = _fail(e)
        # (Not when nothing was reached: the request was never sent.)
        info = error_info(e)
        if e.code() in _IN_DOUBT and not (e.code() == grpc.StatusCode.UNAVAILABLE
                                          and "failed to connect" in (e.details() or "")) \
                and not (info is not None and info[0] == CREDENTIALS_REFUSED):     # no retry helps: operators'
            # Retrying under the same request id is safe (Reserve is idempotent on it); a random one the user
            # never saw could not be retried, nor the reservation found.
            rid = req.request_id
            doubt = ("no answer came, so the reservation may have been made all the same. "
                     if error_info(e) is None else "")
            # The CRS gives back what it placed for a caller gone before the reservation was made: a retry with
            # the same deadline would time out the same way behind a slow manager.
            longer = 2 * waited if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED else None
            print(f"  {doubt}Its request id is {rid}. To retry without reserving twice (the answer is the "
                  "reservation if it was made, else it is made now; ABORTED RESERVATION_PENDING: still being "
                  f"placed, run it again in a moment){f', waiting {_number_text(longer)} s' if longer else ''}:",
                  file=sys.stderr)
            print(f"    {_reserve_command(args, req, longer)}", file=sys.stderr)
            if doubt:       # a considered refusal says nothing was reserved: no "if it was made" after it
                print(f"  If it was made, `harness reservations` lists it with request_id {rid}.", file=sys.stderr)
        return status
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from harness.v1 import irm_pb2

    return _show(lambda: _irm(args).ReleaseReservation(irm_pb2.ReleaseReservationRequest(
        tenant=args.tenant, reservation_id=args.reservation), timeout=30))


def cmd_reservations(args: argparse.Namespace) -> int:
    from harness.v1 import irm_pb2
    return _show(lambda: all_pages(_irm(args).ListReservations, irm_pb2.ListReservationsRequest(
        tenant=args.tenant, include_released=args.all), "reservations"))


def cmd_metrics(args: argparse.Namespace) -> int:
    from harness.v1 import irm_pb2

    return _show(lambda: _irm(args).GetMetrics(irm_pb2.GetMetricsRequest(
        tenant=args.tenant, reservation_id=args.reservation), timeout=30))


class _Stopped(Exception):
    """`harness run` was told to stop (a signal): the remote command is stopped too."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, frame: object) -> None:
    raise _Stopped(signum)


def run_exit_status(exit_code: int) -> int:
    """The shell's status for the remote command: its code, or 128 + N if signal N killed it."""
    return 128 + -exit_code if exit_code < 0 else min(exit_code, 255)


def cmd_run(args: argparse.Namespace) -> int:
    from harness.v1 import agent_pb2, agent_pb2_grpc, irm_pb2
    from services.tenants import tenant_channel

    argv = list(args.argv)
    if argv[:1] == ["--"]:                 # called without `services.cli.main` splitting it off
        argv = argv[1:]
    if not argv:
        print("harness run: give the command after --", file=sys.stderr)
        return 2
    # Ctrl-C, a closed terminal or a supervisor's SIGTERM stop the remote command as well: the stream's end
    # alone leaves it running (the agent keeps it for GetExecution), with no limit unless --timeout was given.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_stopped)
    stub = events = None
    execution = ""
    try:
        res = _irm(args).GetReservation(irm_pb2.GetReservationRequest(tenant=args.tenant,
                                                                      reservation_id=args.reservation), timeout=10)
        vms = [r for g in res.groups if g.resource_type in ("vm", "") for r in g.resources if not args.vm or r.id == args.vm]
        if not vms:
            kinds = sorted({g.resource_type for g in res.groups})
            print(f"harness run: no VM {args.vm!r} in {args.reservation}" if args.vm else
                  f"harness run: {args.reservation} holds no VM to run on (it holds {', '.join(kinds) or 'nothing'}; "
                  "a vfpga group is used through the FPGA client library: see README, Virtual FPGAs)",
                  file=sys.stderr)
            return 2
        vm = vms[0]
        env = dict(args.env or [])
        stub = agent_pb2_grpc.ExecutionAgentStub(tenant_channel(vm.address))
        exited = None
        # Read on a thread of its own: a signal must not interrupt the call itself (stream_reader.py).
        events = StreamReader(stub.Execute(agent_pb2.ExecuteRequest(tenant=args.tenant, vm_id=vm.id, argv=argv,
                                                                    env=env, timeout_s=args.timeout)))
        for ev in events.start():
            kind = ev.WhichOneof("event")
            if kind == "stdout":
                sys.stdout.buffer.write(ev.stdout)
                sys.stdout.flush()
            elif kind == "stderr":
                sys.stderr.buffer.write(ev.stderr)
                sys.stderr.flush()
            elif kind == "started":
                execution = ev.started.execution_id
                if ev.started.notes:
                    print("note: " + "; ".join(ev.started.notes), file=sys.stderr)
            elif kind == "exited":
                exited = x = ev.exited
                print(f"[exit {x.exit_code} after {x.wall_time_s:.2f}s; mean CPU {x.mean_cpu_percent:.0f}%, "
                      f"peak memory {x.peak_memory_mb:.0f} MB{'; ' + x.reason if x.reason else ''}]", file=sys.stderr)
        if exited is None:
            print(f"harness run: the agent ended the stream before execution {execution or '?'} exited",
                  file=sys.stderr)
            return 1
        return run_exit_status(exited.exit_code)
    except grpc.RpcError as e:
        status = _fail(e, agent=vm.address if stub is not None else "")
        if stub is not None and execution:
            # The stream broke after the run started (connection lost, agent restarting): the command runs on at
            # the agent, with no limit unless --timeout was given. Try to stop it, briefly (5 s): the agent may be
            # gone.
            _stop_execution(stub, args.tenant, execution, 5.0)
        return status
    except (KeyboardInterrupt, _Stopped, BrokenPipeError) as e:
        # Stopping is not interrupted by a second Ctrl-C or signal (it would leave the command running).
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if isinstance(e, BrokenPipeError):
            # Nobody reads our output any more (`| head`): stop writing to it, also at interpreter exit (stderr
            # too, if it went to the same pipe: `_say`).
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = {KeyboardInterrupt: 128 + signal.SIGINT, BrokenPipeError: 128 + signal.SIGPIPE}.get(
            type(e), 128 + getattr(e, "signum", 0))
        if events is not None and not execution:
            # Stopped before the agent's "started" came: the command may be running already (its first output
            # can come before that event reaches us), so wait a little for its id rather than leave it running.
            started = events.start().first(lambda ev: ev.WhichOneof("event") == "started", STARTED_WAIT_S)
            execution = started.started.execution_id if started is not None else ""
        if stub is not None and execution:
            _stop_execution(stub, args.tenant, execution, 10.0)
        if events is not None:
            events.cancel()
        return status


def _stop_execution(stub, tenant: str, execution: str, timeout: float) -> None:  # type: ignore[no-untyped-def]
    """StopExecution, saying whether the remote run was stopped."""
    from harness.v1 import agent_pb2

    try:
        # Waiting for the agent to be ready, within `timeout`: one killed and restarted by `harness up` answers
        # within seconds (a call failing at once on the refused connection gave up for nothing).
        stub.StopExecution(agent_pb2.StopExecutionRequest(tenant=tenant, execution_id=execution), timeout=timeout,
                           wait_for_ready=True)
        _say(f"[stopped execution {execution}]")
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.NOT_FOUND:
            # An agent that restarted does not know it: it killed what its predecessor left running.
            _say(f"[execution {execution} is gone: {err.details()}]")
            return
        _say(f"harness run: could not stop execution {execution} ({err.code().name}): it may still run; "
             "releasing the reservation stops it")


STARTED_WAIT_S = 10.0     # `harness run` stopped early: how long it waits for the execution's id to stop it


def _say(text: str) -> None:
    """A line on stderr, unless nobody reads it any more."""
    try:
        print(text, file=sys.stderr, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())


# -- jobs: the FPGA IRM's QoS job API (harness.v1.FpgaJobs) ------------------------------------
def _jobs(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from harness.v1 import fpga_jobs_pb2_grpc
    from services import suite

    address = args.fpga or suite.addresses(args.state_dir).get("fpga") or f"127.0.0.1:{suite.DEFAULT_PORTS['fpga']}"
    from services.tenants import tenant_channel

    return fpga_jobs_pb2_grpc.FpgaJobsStub(tenant_channel(address))


def _count(bits: int):  # type: ignore[no-untyped-def]
    """argparse type: a whole number >= 0 that fits the proto field (int32 or int64)."""
    top = 2 ** (bits - 1) - 1

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if not 0 <= n <= top:
            raise argparse.ArgumentTypeError(f"{n} is outside 0..{top}")
        return n
    return parse


def cmd_jobs(args: argparse.Namespace) -> int:
    from harness.v1 import fpga_jobs_pb2 as jp

    t = args.tenant

    def show(call) -> int:  # type: ignore[no-untyped-def]
        return _show(call, "--fpga")

    if args.verb == "register":
        if (args.deadline is None) == (args.throughput is None):
            print("harness jobs register: give one goal: --deadline SECONDS with --size ACTIONS, or --throughput "
                  "ACTIONS_PER_S", file=sys.stderr)
            return 2
        req = jp.RegisterJobRequest(tenant=t, request_id=args.request_id or uuid.uuid4().hex, design=args.design,
                                    min_devices=args.min, max_devices=args.max, priority=args.priority,
                                    action_seconds=args.action_seconds)
        if args.deadline is not None:
            req.deadline.CopyFrom(jp.DeadlineGoal(deadline_s=args.deadline, size_actions=args.size))
        else:
            req.throughput.CopyFrom(jp.ThroughputGoal(actions_per_s=args.throughput))
        return show(lambda: _jobs(args).RegisterJob(req, timeout=30))
    if args.verb == "list":
        return show(lambda: all_pages(_jobs(args).ListJobs, jp.ListJobsRequest(tenant=t, active_only=not args.all),
                                       "jobs"))
    if args.verb == "get":
        return show(lambda: _jobs(args).GetJob(jp.GetJobRequest(tenant=t, job_id=args.job), timeout=30))
    if args.verb == "watch":
        last = None
        try:
            for last in _jobs(args).WatchJobs(jp.WatchJobsRequest(tenant=t, job_id=args.job or "")):
                out = json_format.MessageToDict(last, preserving_proto_field_name=True,
                                                always_print_fields_with_no_presence=True)
                print(json.dumps(out), flush=True)
        except grpc.RpcError as e:
            return _fail(e, "--fpga")
        except KeyboardInterrupt:
            return 130
        # One job's stream ends when it retires; any other end is not that, whatever the status said.
        if args.job and (last is None or last.state != jp.Job.STATE_RETIRED):
            print("error: the watch ended before the job retired; run it again", file=sys.stderr)
            return 1
        return 0
    if args.verb == "retire":
        return show(lambda: _jobs(args).RetireJob(jp.RetireJobRequest(tenant=t, job_id=args.job), timeout=30))
    return show(lambda: _jobs(args).ReportProgress(jp.ReportProgressRequest(
        tenant=t, job_id=args.job, completed_actions=args.completed), timeout=30))


def cmd_demo(args: argparse.Namespace) -> int:
    from services import demo

    return demo.main(args)


def _benchmarks() -> list[str]:
    """The benchmarks `harness bench` runs: bench/'s modules, as named on the command line."""
    from pathlib import Path

    import bench

    return sorted(p.stem.replace("_", "-") for p in Path(bench.__file__).parent.glob("*.py")
                  if not p.stem.startswith("_"))


def cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    name = args.name.replace("-", "_")
    if args.name.replace("_", "-") not in (names := _benchmarks()):
        print(f"harness bench: unknown benchmark {args.name!r}; available: {', '.join(names)}", file=sys.stderr)
        return 2
    mod = importlib.import_module(f"bench.{name}")
    return int(mod.main(args.rest) or 0)


def _quiet_pipe(func):  # type: ignore[no-untyped-def]
    """`func` (a command), ending quietly with status 141 (128 + SIGPIPE, as a shell reports a program killed
    by it) when whoever reads its output stops reading (`| head -1`), instead of a BrokenPipeError traceback."""

    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        try:
            status = func(args)
            sys.stdout.flush()        # what is still buffered meets the closed pipe here, not at exit
            return status
        except BrokenPipeError:
            # Nobody reads any more: the rest of the output, also what Python flushes at exit, goes nowhere.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE
    return run


def add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    before = set(sub.choices)
    _add_commands(sub)
    for name, parser in sub.choices.items():
        if name not in before and parser.get_default("func") is not None:
            parser.set_defaults(func=_quiet_pipe(parser.get_default("func")))


def _add_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    def common(p: argparse.ArgumentParser, tenant: bool = True) -> None:
        p.add_argument("--state-dir", default=DEFAULT_STATE, help="where `harness up` keeps state (default $HARNESS_HOME, else ~/.harness)")
        p.add_argument("--crs", help="CRS address (default: from the running suite)")
        if tenant:
            p.add_argument("--tenant", default=os.environ.get("HARNESS_TENANT", "demo"))

    p = sub.add_parser("up", help="start the whole suite (one process per service, each restarted if it "
                                  "exits) until Ctrl-C")
    p.add_argument("--state-dir", default=DEFAULT_STATE)
    p.add_argument("--config", help="YAML file with one section per service")
    p.add_argument("--auto-ports", action="store_true", help="pick free ports (the last start's where still free; others if one is taken before its service listens) instead of 50051/50061/50071/50081/50091/50101")
    p.add_argument("--tls", action="store_true",
                   help="serve TLS only, with certificates of the suite's own CA (STATE_DIR/tls/ca.pem, made once)")
    p.add_argument("--tenants", metavar="FILE",
                   help="tenants file (harness tenant add): every call naming a tenant must then carry its token "
                        "(default: $HARNESS_TENANTS_FILE; neither: nothing checked)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("tls", help="make a private CA and a certificate for the services' hosts (TLS)")
    verbs = p.add_subparsers(dest="verb", required=True)
    v = verbs.add_parser("generate", help="a CA in --dir (ca.pem, ca.key; kept if there) and certificates it signs: "
                                          "DIR/services/ for --host, DIR/agent/ for --agent-host (each with "
                                          "server.pem, server.key and a copy of ca.pem)")
    v.add_argument("--dir", required=True)
    v.add_argument("--host", action="append", required=True,
                   help="a host name or IP address the services answer at (repeat for each; 127.0.0.1, ::1 and "
                        "localhost are always in)")
    v.add_argument("--agent-host", action="append", default=[],
                   help="a host name of the agents, whose certificate is their own: they run tenants' programs, "
                        "which can read it")
    p.set_defaults(func=cmd_tls)

    p = sub.add_parser("tenant", help="give tenants tokens, or take them away (the tenants file of `harness up "
                                      "--tenants`)")
    p.add_argument("--state-dir", default=DEFAULT_STATE)
    p.add_argument("--file", help="the tenants file (default: $HARNESS_TENANTS_FILE, else STATE_DIR/tenants.yaml)")
    verbs = p.add_subparsers(dest="verb", required=True)
    add = verbs.add_parser("add", help="add a tenant, or give it a new token: prints the token (once)")
    add.add_argument("name")
    remove = verbs.add_parser("remove", help="take a tenant out: its token stops working")
    remove.add_argument("name")
    listed = verbs.add_parser("list", help="the tenants of the file")
    verbs.add_parser("delegation", help="make a delegation token and its digest, for a deployment `harness up` "
                                        "does not wire (e.g. compose's .env)")
    for v in (add, remove, listed):     # after the verb too (`harness tenant add NAME --file F`), as people type it
        v.add_argument("--state-dir", default=argparse.SUPPRESS)
        v.add_argument("--file", default=argparse.SUPPRESS, help="the tenants file (as before the verb)")
    p.set_defaults(func=cmd_tenant)

    p = sub.add_parser("down", help="stop the suite running from a state directory (also when `harness up` is "
                                    "gone and its services still run)")
    p.add_argument("--state-dir", default=DEFAULT_STATE)
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("status", help="health of every service of the running suite")
    p.add_argument("--state-dir", default=DEFAULT_STATE)
    p.add_argument("--default-ports", action="store_true",
                   help="check the services at 127.0.0.1 on the default ports (50051, 50061, ...; e.g. compose's "
                        "published ones) instead of the suite of a state directory")
    p.add_argument("--service", action="append", type=_service_address, metavar="NAME=HOST:PORT",
                   help="check this service there (repeat for each; names: crs, compute, agent, fpga-server, fpga, "
                        "am), e.g. a deployment of `harness serve`s, instead of a suite")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("demo", help="start a private suite, run the end-to-end demo, stop it")
    p.add_argument("--keep", action="store_true", help="leave the demo's state directory in place")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("discover", help="physical resources known to the CRS")
    common(p)
    p.set_defaults(func=cmd_discover)

    p = sub.add_parser("managers", help="the CRS's managers (list), or take one out for good (deregister NAME)")
    verbs = p.add_subparsers(dest="verb")
    p.set_defaults(func=cmd_managers, verb="list")
    common(p, tenant=False)
    for v in (verbs.add_parser("list", help="the managers registered, up or down, and their resources"),
              d := verbs.add_parser("deregister", help="take a stopped manager out for good (a decommissioned site): "
                                                       "its resources leave the CRS; refused while reservations "
                                                       "hold parts there, unless --abandon-parts")):
        # Before or after the verb; a subparser's own default would overwrite the one given before it.
        v.add_argument("--state-dir", default=argparse.SUPPRESS, help="as before the verb")
        v.add_argument("--crs", default=argparse.SUPPRESS, help="as before the verb")
    d.add_argument("name", help="the manager's name (`harness managers` lists them)")
    d.add_argument("--abandon-parts", action="store_true",
                   help="give up the parts reservations still hold there (each gets a note; releasing it no longer "
                        "asks the manager)")

    p = sub.add_parser("reserve", help="reserve (or --quote) groups of resources through the CRS")
    common(p)
    p.add_argument("--group", action="append", type=_group, required=True,
                   help="name=web,count=2,cores=2,memory_gb=4[,traits=ssd+avx512][,frequency_ghz=2.0..3.0]")
    p.add_argument("--constraint", action="append", help='e.g. "hops(web, db) <= 2", "same_host(a, b)"')
    p.add_argument("--request-id", help="idempotency key (default: a random one, printed with the command to retry "
                                        "when the call fails with no definite answer)")
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--max-price", type=float, help="refuse if the price per minute is higher")
    p.add_argument("--quote", action="store_true", help="only quote the price")
    p.add_argument("--timeout", type=_seconds, help="seconds to wait for the CRS's answer (default 60; 30 with "
                                                   "--quote)")
    p.set_defaults(func=cmd_reserve)

    p = sub.add_parser("release", help="release a reservation")
    common(p)
    p.add_argument("reservation")
    p.set_defaults(func=cmd_release)

    p = sub.add_parser("reservations", help="list the tenant's reservations")
    common(p)
    p.add_argument("--all", action="store_true", help="include released ones")
    p.set_defaults(func=cmd_reservations)

    p = sub.add_parser("metrics", help="utilisation series of a reservation")
    common(p)
    p.add_argument("reservation")
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("run", help="run a command in a reserved VM: harness run RES [--vm ID] [--env K=V] "
                                   "[--timeout S] -- cmd args")
    common(p)
    p.add_argument("reservation")
    p.add_argument("--vm", help="VM id (default: the first of the reservation)")
    p.add_argument("--env", action="append", type=_env_pair, help="NAME=VALUE")
    p.add_argument("--timeout", type=float, default=0.0)
    p.add_argument("argv", nargs="*", help="the command, after --")
    p.set_defaults(func=cmd_run)

    from application_manager import cli as am_cli

    am_cli.add_commands(sub)

    p = sub.add_parser("jobs", help="QoS jobs on FPGAs (the FPGA IRM's FpgaJobs API): register, list, get, "
                                    "watch, report, retire")
    verbs = p.add_subparsers(dest="verb", required=True)

    def jobs_common(v: argparse.ArgumentParser) -> None:
        v.add_argument("--state-dir", default=DEFAULT_STATE, help="where `harness up` keeps state (default $HARNESS_HOME, else ~/.harness)")
        v.add_argument("--fpga", help="FPGA IRM address (default: from the running suite)")
        v.add_argument("--tenant", default=os.environ.get("HARNESS_TENANT", "demo"))

    v = verbs.add_parser("register", help="register a job with a deadline or a throughput goal")
    jobs_common(v)
    v.add_argument("--design", required=True, help="e.g. sleep, black_scholes, mc_bond_option")
    v.add_argument("--deadline", type=float, help="seconds from now to finish --size actions")
    v.add_argument("--size", type=_count(64), default=0, help="the job's size in actions (with --deadline)")
    v.add_argument("--throughput", type=float, help="goal in actions per second (the throughput policy)")
    v.add_argument("--min", type=_count(32), default=0, help="fewest devices (default 1)")
    v.add_argument("--max", type=_count(32), default=0, help="most devices (default: no limit)")
    v.add_argument("--priority", type=float, default=0.0, help="default 1; higher first")
    v.add_argument("--action-seconds", type=float, default=0.0,
                   help="Hydrogen policies: your estimate of one action on one device (default 1 s)")
    v.add_argument("--request-id", help="idempotency key (default: random)")
    v = verbs.add_parser("list", help="the tenant's active and queued jobs, and the job pool")
    jobs_common(v)
    v.add_argument("--all", action="store_true", help="include retired jobs")
    for verb, text in [("get", "one job: state, devices, allocation history, throughput"),
                       ("retire", "retire a job (its devices go back to the pool)")]:
        v = verbs.add_parser(verb, help=text)
        jobs_common(v)
        v.add_argument("job")
    v = verbs.add_parser("watch", help="print the jobs (or one job, until it retires) as they change, one JSON "
                                       "line each")
    jobs_common(v)
    v.add_argument("job", nargs="?", help="one job (default: every job of the tenant, until Ctrl-C)")
    v = verbs.add_parser("report", help="report a job's completed actions (when the data plane cannot see them)")
    jobs_common(v)
    v.add_argument("job")
    v.add_argument("completed", type=_count(64))
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("bench", help="run a benchmark (prints JSON): crs, fpga-overhead, fpga-elasticity, "
                                     "autoscaler, profilers, policies")
    p.add_argument("name", metavar="NAME", help=f"one of: {', '.join(_benchmarks())}")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own flags (NAME --help lists them), "
                                                          "e.g. --quick --json")
    p.set_defaults(func=cmd_bench)
