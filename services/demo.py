"""`harness demo`: the suite end to end on embedded defaults.

Starts a private suite (own state directory, free ports), then as a tenant:
discovers the datacenter, quotes and reserves a master + workers request with
a topology constraint, runs a real CPU-bound program in the master VM and a
memory-hungry one in a small worker VM (which fails at the VM's memory limit),
reads utilisation back through the CRS, releases, and stops the suite.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
import time

import grpc
from rich.console import Console
from rich.table import Table

from harness.v1 import agent_pb2, agent_pb2_grpc, common_pb2, irm_pb2, irm_pb2_grpc
from services import suite, tenants, tls
from services.tenants import tenant_channel

TENANT = "demo-tenant"

CPU_PROGRAM = """
import os, time
import numpy as np
n = int(os.environ.get("DEMO_N", "600"))
a = np.random.default_rng(0).random((n, n))
t0 = time.time(); k = 0
while time.time() - t0 < float(os.environ.get("DEMO_SECONDS", "2")):
    a = (a @ a) / n; k += 1
print(f"{k} matrix products of {n}x{n} on {len(os.sched_getaffinity(0))} CPU(s), OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
"""

MEMORY_PROGRAM = """
import numpy as np
blocks = []
for i in range(64):
    blocks.append(np.ones(32 * 1024 * 1024 // 8))  # 32 MB each, touched
    print(f"holding {32 * (i + 1)} MB", flush=True)
"""


def _vm(name: str, count: int, cores: int, memory_gb: float) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name=name, resource_type="vm", count=count, attributes={
        "cores": common_pb2.AttributeRequest(number=cores),
        "memory_gb": common_pb2.AttributeRequest(number=memory_gb)})


def _execute(console: Console, vm: irm_pb2.AllocatedResource, argv: list[str], env: dict[str, str], token: str
             ) -> agent_pb2.ExecutionExited:
    stub = agent_pb2_grpc.ExecutionAgentStub(tenant_channel(vm.address, token))
    exited = agent_pb2.ExecutionExited()
    samples = 0
    for ev in stub.Execute(agent_pb2.ExecuteRequest(tenant=TENANT, vm_id=vm.id, argv=argv, env=env), timeout=120):
        kind = ev.WhichOneof("event")
        if kind == "started":
            console.print(f"  started pid {ev.started.pid} on CPUs {list(ev.started.cpus)}, "
                          f"memory limit {ev.started.memory_limit_mb:.0f} MB")
            for note in ev.started.notes:
                console.print(f"  [yellow]note:[/] {note}")
        elif kind == "stdout":
            for line in ev.stdout.decode(errors="replace").splitlines()[-3:]:
                console.print(f"  [dim]stdout[/] {line}")
        elif kind == "sample":
            samples += 1
        elif kind == "exited":
            exited = ev.exited
    console.print(f"  exit {exited.exit_code} after {exited.wall_time_s:.2f} s; {samples} utilisation samples; "
                  f"mean CPU {exited.mean_cpu_percent:.0f}%, peak memory {exited.peak_memory_mb:.0f} MB"
                  + (f"; [red]{exited.reason}[/]" if exited.reason else ""))
    return exited


def run(console: Console, crs_address: str, token: str = "") -> None:
    """`token`: the tenant's (services.tenants), for a suite that checks them."""
    crs = irm_pb2_grpc.ResourceManagerStub(tenant_channel(crs_address, token))
    if token:
        try:
            irm_pb2_grpc.ResourceManagerStub(tenant_channel(crs_address, "")).ListReservations(
                irm_pb2.ListReservationsRequest(tenant=TENANT), timeout=10)
            raise RuntimeError("the CRS let a call without the tenant's token list its reservations")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAUTHENTICATED:
                raise
            console.print(f"Tenant {TENANT!r} authenticates with its token; a call without it: "
                          f"{e.code().name} ({e.details()[:60]}...)")
    deadline = time.monotonic() + 30
    while True:  # the compute IRM registers itself and streams its capacity in
        hosts = crs.DiscoverResources(irm_pb2.DiscoverResourcesRequest(tenant=TENANT, resource_type="vm"),
                                      timeout=5).resources
        if hosts or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    table = Table(title="Datacenter (discovered through the CRS)")
    for col in ("host", "site/rack", "cores", "memory GB", "GHz", "traits"):
        table.add_column(col)
    for h in sorted(hosts, key=lambda h: h.id):
        table.add_row(h.id, f"{h.location.site}/{h.location.rack}", f"{h.capacity['cores']:.0f}",
                      f"{h.capacity['memory_gb']:.0f}", f"{h.properties['frequency_ghz']:.1f}", ",".join(h.traits))
    console.print(table)

    groups = [_vm("master", 1, 2, 2), _vm("workers", 2, 1, 0.5)]
    constraints = [irm_pb2.GroupConstraint(expression="hops(master, workers) <= 2"),
                   irm_pb2.GroupConstraint(expression="different_host(workers, workers)")]
    quote = crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant=TENANT, groups=groups, constraints=constraints))
    console.print(f"Quote: {quote.price_per_minute:.4f} per minute (thesis §4.5.1 linear model)")
    res = crs.Reserve(irm_pb2.ReserveRequest(tenant=TENANT, request_id="demo-1", groups=groups,
                                             constraints=constraints, max_price_per_minute=1.0), timeout=60)
    table = Table(title=f"Reservation {res.id} ({res.price_per_minute:.4f}/min)")
    for col in ("group", "vm", "host", "rack", "cores", "memory GB", "agent"):
        table.add_column(col)
    for g in res.groups:
        for r in g.resources:
            table.add_row(g.name, r.id, r.physical_id, r.location.rack, f"{r.attributes['cores']:.0f}",
                          f"{r.attributes['memory_gb']:g}", r.address)
    console.print(table)
    try:
        master = next(r for g in res.groups if g.name == "master" for r in g.resources)
        worker = next(r for g in res.groups if g.name == "workers" for r in g.resources)
        console.print(f"[bold]Running a CPU-bound numpy program in the master VM ({master.id})[/]")
        _execute(console, master, [sys.executable, "-c", CPU_PROGRAM], {"DEMO_SECONDS": "2"}, token)
        console.print(f"[bold]Running a program that wants 2 GB in a 0.5 GB worker VM ({worker.id})[/]")
        _execute(console, worker, [sys.executable, "-c", MEMORY_PROGRAM], {}, token)
        metrics = crs.GetMetrics(irm_pb2.GetMetricsRequest(tenant=TENANT, reservation_id=res.id))
        shown = 0
        for s in metrics.series:
            values = [x.value for x in s.samples]
            if values:
                shown += 1
                console.print(f"  {s.resource_id} {s.name}: {len(values)} samples, max {max(values):.0f}%")
        if not shown:
            console.print("  [yellow]no utilisation samples came back[/] (the compute IRM's log says why)")
    finally:
        crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=TENANT, reservation_id=res.id))
        console.print(f"Released {res.id}.")


def _interrupt(signum, _frame):  # type: ignore[no-untyped-def]
    raise KeyboardInterrupt


def private_environ(environ: dict[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) without what would point the demo's services at the operator's
    own configuration -- HARNESS_CONFIG, HARNESS_TENANTS_FILE, HARNESS_TLS_CA_FILE and every HARNESS_<SECTION>_*
    setting (a production database, a remote CRS, the operator's tenants or CA): the demo runs on embedded
    defaults, in its own state directory."""
    import os

    from services.catalog import config_sections

    environ = dict(os.environ if environ is None else environ)
    prefixes = tuple(f"HARNESS_{section.upper()}_" for section in set(config_sections().values()))
    return {k: v for k, v in environ.items()
            if k not in ("HARNESS_CONFIG", suite.TENANTS_FILE_ENV, tls.ENV_CA) and not k.startswith(prefixes)}


def main(args: argparse.Namespace) -> int:
    import threading

    console = Console()
    starting = threading.Event()

    # Ctrl-C, SIGTERM or a closed terminal end the demo through the `finally` below (the services run in
    # sessions of their own, so nothing else would stop them): while the suite starts, by a flag it watches (an
    # exception there could land between starting a service and recording it); later as KeyboardInterrupt.
    # `suite.stop` ignores them while it stops.
    cancel = threading.Event()

    def on_signal(signum, frame):  # type: ignore[no-untyped-def]
        cancel.set()
        if not starting.is_set():
            _interrupt(signum, frame)

    state_dir = tempfile.mkdtemp(prefix="harness-demo-")
    procs = []
    starting.set()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        console.print(f"[bold]Harness demo[/]: starting the suite (state in {state_dir})")
        # Tenants authenticate, as in a deployment (`harness tenant add`, `harness up --tenants`).
        tenants_file = f"{state_dir}/tenants.yaml"
        token = tenants.add(tenants_file, TENANT)
        # And every connection is TLS, with the suite's own CA, which this process's clients trust.
        procs = suite.start(state_dir, auto_ports=True, cancel=cancel, tls=True,
                            environ={**private_environ(), suite.TENANTS_FILE_ENV: tenants_file},
                            on_started=lambda p: console.print(f"  [green]started[/] {p.name:8} {p.address}"))
        starting.clear()
        if cancel.is_set():
            raise KeyboardInterrupt
        tls.configure(str(suite.tls_ca(state_dir)), "the demo suite's CA")
        console.print(f"  TLS on every connection (the suite's CA: {suite.tls_ca(state_dir)})")
        addrs = {p.name: p.address for p in procs}
        run(console, addrs["crs"], token)
        from application_manager import demo as am_demo

        console.print("[bold]Application Manager: profile a real application, build its Pareto frontier, "
                      "execute it under an SLO[/]")
        am_demo.run(console, addrs["crs"], addrs["am"], token=token)
        console.print("[bold green]Demo complete.[/]")
        return 0
    except grpc.RpcError as e:
        console.print(f"[red]demo failed: {e.code().name}: {e.details()}[/]")
        return 1
    except (KeyboardInterrupt, suite.Cancelled):
        starting.set()                        # no more exceptions from signals: clean up
        console.print("demo interrupted; stopping the suite")
        return 130
    finally:
        starting.set()
        tls.reset()
        suite.stop(procs)
        if not args.keep:
            shutil.rmtree(state_dir, ignore_errors=True)
