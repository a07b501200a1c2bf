"""The Application Manager part of `harness demo`: submit, profile, model, execute under an SLO.

`run(console, crs_address, am_address)` submits the RTM-like example (small input), profiles
it on the local back-end with a rich progress bar (every run reserved through the CRS and
executed by the agent), prints the Pareto frontier as a table, writes a PNG plot of all
runs and the frontier (the path is printed), executes the application under a time bound
and prints predicted against measured. `python -m application_manager.demo` starts a
private suite (CRS, compute IRM, agent, AM) and runs it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import grpc
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import examples
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from services.tenants import tenant_channel

TENANT = "demo-tenant"
RUNS = 6
PARAMS = {"rows": 1600, "steps": 40}


def plot(model: pb.PerformanceModel, path: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    ok = [r for r in model.runs if r.ok and r.input == pb.ProfileRun.INPUT_PRODUCTION]
    bad = [r for r in model.runs if not r.ok]
    ax.scatter([r.execution_time_s for r in ok], [r.cost for r in ok], c="#888888", label="profiling runs")
    if bad:
        ax.scatter([r.execution_time_s for r in bad], [r.cost for r in bad], c="#d62728", marker="x",
                   label="failed runs")
    front = sorted(model.frontier, key=lambda p: p.execution_time_s)
    ax.plot([p.execution_time_s for p in front], [p.cost for p in front], "o-", c="#1f77b4", label="Pareto frontier")
    for p in front:
        ax.annotate(f"{p.configuration.values.get('%master_cores', '?')}c/"
                    f"{p.configuration.values.get('%master_mem', '?')}MB",
                    (p.execution_time_s, p.cost), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("execution time (s)")
    ax.set_ylabel("cost (CRS price x minutes)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def run(console: Console, crs_address: str, am_address: str, out_dir: str | None = None,
        profiler: str = "bo", token: str = "") -> pb.ApplicationExecution:
    """`token`: the tenant's (services.tenants), for an AM that checks them."""
    am = pb_grpc.ApplicationManagerStub(tenant_channel(am_address, token))
    console.rule("[bold]Application Manager: profile, model, execute under an SLO")
    app = am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant=TENANT, manifest_json=examples.manifest("rtm"), slo_json=examples.slo("rtm", **PARAMS),
        app_dir=examples.app_dir("rtm")), timeout=30)
    console.print(f"Submitted {app.name} ({app.id}): {app.configurations} configurations over "
                  f"{', '.join(app.dimensions)} (after the manifest's GlobalConstraints)")
    columns = [TextColumn("[bold]profiling ({task.fields[profiler]})"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[last]}"), TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("profiling", total=RUNS, profiler=profiler, last="")
        for ev in am.StartProfiling(pb.StartProfilingRequest(tenant=TENANT, application_id=app.id, profiler=profiler,
                                                             max_runs=RUNS, seed=1), timeout=600):
            if ev.HasField("run"):
                r = ev.run
                status = "ok" if r.ok else f"[red]{r.error}[/]"
                progress.update(task, advance=1, last=f"{r.configuration.summary.replace('implementation=RTM-CPU, ', '')}"
                                f" -> {r.execution_time_s:.2f} s, {r.cost:.5f} ({status})")
            final = ev.session
    console.print(f"Profiling ended ({final.message}): {final.runs} runs, profiling cost {final.spent:.5f}")
    model = am.GetModel(pb.GetModelRequest(tenant=TENANT, application_id=app.id), timeout=30)
    table = Table(title="Pareto frontier (time x cost), the performance model")
    for col in ("cores", "memory MB", "time s", "cost", "mean CPU %"):
        table.add_column(col, justify="right")
    cpu = {r.configuration.summary: r.cpu_percent for r in model.runs}
    for p in model.frontier:
        table.add_row(p.configuration.values.get("%master_cores", ""), p.configuration.values.get("%master_mem", ""),
                      f"{p.execution_time_s:.2f}", f"{p.cost:.5f}",
                      # 0: the run ended before the agent's first utilisation sample (every 0.5 s), not idle
                      f"{c:.0f}" if (c := cpu.get(p.configuration.summary, 0.0)) else "-")
    console.print(table)
    out = Path(out_dir or tempfile.gettempdir())
    out.mkdir(parents=True, exist_ok=True)
    png = plot(model, str(out / f"harness-frontier-{app.id}.png"), f"{app.name}: {len(model.runs)} runs")
    console.print(f"Frontier plot written to [bold]{png}[/]")
    times = sorted(p.execution_time_s for p in model.frontier)
    bound = round(times[len(times) // 2] * 1.5, 2)
    slo = json.dumps({"Manifest": app.name, "Parameters": {f"%{k}": v for k, v in PARAMS.items()},
                      "Objective": {"Constraints": [f"%execution_time <= {bound}"], "Optimize": "%cost"}})
    console.print(f"Executing under the SLO: execution time <= {bound} s, as cheap as possible")
    ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant=TENANT, application_id=app.id, slo_json=slo),
                               timeout=600)
    table = Table(title=f"Execution {ex.id}: {ex.configuration.values['%master_cores']} cores, "
                        f"{ex.configuration.values['%master_mem']} MB")
    for col in ("", "time s", "cost"):
        table.add_column(col, justify="right")
    table.add_row("predicted", f"{ex.predicted_time_s:.2f}", f"{ex.predicted_cost:.5f}")
    table.add_row("measured", f"{ex.measured_time_s:.2f}", f"{ex.measured_cost:.5f}")
    console.print(table)
    console.print(("[green]SLO met[/]" if ex.slo_met else "[red]SLO missed[/]") +
                  (f"; output: {ex.output_tail.splitlines()[-1]}" if ex.output_tail else ""))
    return ex


def main() -> int:
    """Start a private suite plus the AM, run the demo, stop everything."""
    import shutil

    from services import suite, tls
    from services.demo import private_environ
    from services.launcher import spawn

    console = Console()
    state = tempfile.mkdtemp(prefix="harness-am-demo-")
    procs = []
    try:
        # A plaintext suite, whatever CA this process's environment names for other suites (reset after).
        tls.configure("")
        procs = suite.start(state, auto_ports=True, environ=private_environ(),
                            on_started=lambda p: console.print(f"  [green]started[/] {p.name:8} {p.address}"))
        addr = {p.name: p.address for p in procs}
        if "am" not in addr:
            p = spawn("am", name="am", settings={"crs_address": addr["crs"], "state_dir": state},
                      log_path=os.path.join(state, "logs", "am.log"))
            procs.append(p)
            addr["am"] = p.wait_ready()
            console.print(f"  [green]started[/] am       {addr['am']}")
        run(console, addr["crs"], addr["am"])
        console.print("[bold green]Demo complete.[/]")
        return 0
    except grpc.RpcError as e:
        console.print(f"[red]demo failed: {e.code().name}: {e.details()}[/]")
        return 1
    finally:
        tls.reset()
        suite.stop(procs)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
