"""`harness bench crs`: reservations per second through the real suite.

Starts a CRS and a compute IRM (separate processes, SQLite by default) over
a generated datacenter, then runs concurrent clients through the CRS in
rounds of two timed phases: every client reserves (committed_per_s, p50_ms,
p99_ms), then every client releases what it holds (released_per_s); some
reserve calls are retried with the same request id, as a client does when a
reply is lost. Before each round it measures a bare unary echo against the
same CRS process with the same concurrency (echo_rps), so the baseline and
the figure share the machine's conditions: what matters is the ratio, and
this machine's speed drifts by 2x within a minute. Afterwards an independent
check of the IRM's database counts overbooked hosts, and the duplicates check
counts retried requests that produced a second reservation.

Throughput plateaus from about 8 clients (measured: 8, 16 and 32 give the
same echo_ratio within noise); the default of 16 keeps requests queued at
every stage when other work on the machine slows one process. What bounds it
is the CRS process: one interpreter, whose gRPC and worker threads hand the
GIL to each other tens of times per reservation, so about a quarter of the
two cores stays idle even at 32 clients. `cpu_idle` is the machine's idle CPU
share during the reserve phases.

Placement latency at scale is measured in-process on synthetic views of 100
and 5,000 hosts: the pure placement function, same request, same pipeline.

The pipeline (filters and weighers) is the CRS's default unless `--filters` /
`--weighers` say otherwise; the JSON records it. The services run without the
caller's HARNESS_* variables (HARNESS_CONFIG, HARNESS_CRS_FILTERS, ...): a
figure must not depend on what a shell happened to export.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import grpc

from bench._common import emit, percentile
from cross_resource_scheduler import constraints as cons
from cross_resource_scheduler.placement import PlacementRequest, Unschedulable, schedule
from cross_resource_scheduler.plugins import GroupDemand, Pipeline, PipelineError, PluginFailed
from cross_resource_scheduler.service import CrsConfig
from cross_resource_scheduler.topology import TopologyModel
from cross_resource_scheduler.view import CapacityView
from harness.v1 import common_pb2, diagnostics_pb2, diagnostics_pb2_grpc, irm_pb2, irm_pb2_grpc
from irm_compute.cost import CostModel
from irm_compute.store import ComputeStore
from services.clock import WallClock
from services.db import Database, scratch_database
from services.launcher import spawn
from services.tls import plain_channel


def _inventory(hosts: int) -> str:
    return f"""
generate:
  - count: {hosts}
    prefix: h
    sites: 2
    racks_per_site: {max(1, hosts // 40)}
    cores: 16
    memory_gb: 64
    frequency_ghz: 2.4
    traits: [ssd]
"""


def _group(rng: random.Random) -> irm_pb2.ResourceGroup:
    return irm_pb2.ResourceGroup(name="g", resource_type="vm", count=rng.randint(1, 2), attributes={
        "cores": common_pb2.AttributeRequest(number=rng.choice([1, 2, 4])),
        "memory_gb": common_pb2.AttributeRequest(number=rng.choice([1, 2, 4]))})


def run_echo(address: str, clients: int, seconds: float) -> tuple[int, float]:
    """Echo calls made by `clients` threads in about `seconds`: (calls, elapsed seconds)."""
    stop = time.monotonic() + seconds
    counts = [0] * clients

    def worker(i: int) -> None:
        stub = diagnostics_pb2_grpc.DiagnosticsStub(plain_channel(address))
        req = diagnostics_pb2.EchoRequest(payload=b"x" * 64)
        while time.monotonic() < stop:
            stub.Echo(req, timeout=10)
            counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts), time.monotonic() - t0


def _cpu_ticks() -> tuple[int, int]:
    """(idle, total) CPU ticks of the whole machine so far; (0, 0) where /proc is missing."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0, 0
    fields = fields[:8]  # user .. steal: guest and guest_nice are counted in user and nice already
    return fields[3] + fields[4], sum(fields)


def run_clients(address: str, clients: int, per_client: int, retry_share: float, round_no: int = 0) -> dict:
    """Two timed phases with the same clients: all reserve, then all release what they hold.

    Reservations are committed while other clients reserve concurrently; the
    release phase frees every one of them. A share of reserve calls is retried
    with the same request id, as a client does when a reply is lost.
    """
    latencies: list[float] = []
    release_latencies: list[float] = []
    lock = threading.Lock()
    stats = {"committed": 0, "exhausted": 0, "errors": 0, "retried": 0, "duplicates": 0, "released": 0,
             "error_codes": {}, "internal": []}
    held: dict[int, list[tuple[str, str]]] = {i: [] for i in range(clients)}

    def reserver(i: int) -> None:
        rng = random.Random(round_no * 1000 + i)
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(address))
        local: list[float] = []
        for n in range(per_client):
            req = irm_pb2.ReserveRequest(tenant=f"bench-{i % 4}", request_id=f"r{round_no}-c{i}-{n}",
                                         groups=[_group(rng)])
            t0 = time.perf_counter()
            try:
                res = stub.Reserve(req, timeout=60)
            except grpc.RpcError as e:
                with lock:
                    stats["exhausted" if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else "errors"] += 1
                    stats["error_codes"][e.code().name] = stats["error_codes"].get(e.code().name, 0) + 1
                    if e.code() == grpc.StatusCode.INTERNAL and len(stats["internal"]) < 1:
                        stats["internal"].append(e.details())     # a plug-in failing (or a bug): the run's error
                continue
            local.append((time.perf_counter() - t0) * 1000)
            if rng.random() < retry_share:
                again = stub.Reserve(req, timeout=60)
                with lock:
                    stats["retried"] += 1
                    stats["duplicates"] += int(again.id != res.id)
            held[i].append((req.tenant, res.id))
        with lock:
            stats["committed"] += len(held[i])
            latencies.extend(local)

    def releaser(i: int) -> None:
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(address))
        local: list[float] = []
        for tenant, rid in held[i]:
            t0 = time.perf_counter()
            stub.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=tenant, reservation_id=rid), timeout=60)
            local.append((time.perf_counter() - t0) * 1000)
        with lock:
            stats["released"] += len(local)
            release_latencies.extend(local)

    for phase, target in (("reserve", reserver), ("release", releaser)):
        threads = [threading.Thread(target=target, args=(i,)) for i in range(clients)]
        t0, ticks0 = time.monotonic(), _cpu_ticks()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats[f"{phase}_s"] = time.monotonic() - t0
        if phase == "reserve":
            ticks1 = _cpu_ticks()
            stats["idle_ticks"], stats["all_ticks"] = ticks1[0] - ticks0[0], ticks1[1] - ticks0[1]
    stats["latencies"] = latencies
    stats["release_latencies"] = release_latencies
    return stats


def _view(hosts: int, rng: random.Random) -> CapacityView:
    view = CapacityView()
    racks = max(1, hosts // 40)
    for n in range(hosts):
        used = rng.choice([0, 4, 8, 12, 16])
        view.upsert("compute", common_pb2.PhysicalResource(
            id=f"h{n}", resource_type="vm", capacity={"cores": 16, "memory_gb": 64},
            used={"cores": used, "memory_gb": used * 4}, properties={"frequency_ghz": 2.4}, traits=["ssd"],
            location=common_pb2.Location(site=f"s{n % 2}", rack=f"r{(n // 2) % racks}", host=f"h{n}"),
            generation=1))
    return view


def _latency_request() -> PlacementRequest:
    return PlacementRequest(
        [GroupDemand("master", "vm", 1, {"cores": 2, "memory_gb": 4}, {}, frozenset({"ssd"})),
         GroupDemand("workers", "vm", 4, {"cores": 1, "memory_gb": 2})],
        [cons.parse("hops(master, workers) <= 4"), cons.parse("different_host(workers, workers)")])


def placement_p50_ms(hosts: int, repeats: int, pipeline: Pipeline) -> float:
    rng = random.Random(hosts)
    view = _view(hosts, rng)
    req = _latency_request()
    topo = TopologyModel()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        schedule(req, view, pipeline, topo, rng)
        times.append((time.perf_counter() - t0) * 1000)
    return percentile(times, 0.5)


def run_shaped_trials(pipeline: Pipeline, n: int = 20) -> None:
    """Place `n` requests shaped as the run's (`_group`: no constraints) on an empty 100-host view, each placed
    alone: PluginFailed or Unschedulable as `schedule` raises them."""
    rng = random.Random(7)
    view = _view(100, rng)
    topo = TopologyModel()
    for _ in range(n):
        g = _group(rng)
        demand = {k: a.number for k, a in g.attributes.items()}
        schedule(PlacementRequest([GroupDemand(g.name, g.resource_type, g.count, demand)]), view, pipeline, topo, rng)


def _filters(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected filter names separated by commas, e.g. capacity,traits")
    return names


def _weighers(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for pair in (p for p in text.split(",") if p.strip()):
        name, sep, value = pair.partition("=")
        try:
            multiplier = float(value)
        except ValueError:
            multiplier = math.nan
        if not sep or not name.strip() or not math.isfinite(multiplier):
            raise argparse.ArgumentTypeError(f"{pair!r}: expected name=multiplier pairs separated by commas, "
                                             "e.g. pack=1,topology=2")
        out[name.strip()] = multiplier
    return out


def _plugin_failed(args: argparse.Namespace, e: PluginFailed) -> int:
    """A plug-in of the pipeline failed while placing: the JSON document says which and how (one line)."""
    emit({"benchmark": "crs", "pipeline": {"filters": list(args.filters), "weighers": dict(args.weighers)},
          "error": f"placing failed: {e.problem or e}; fix the plug-in or leave it out of --filters/--weighers"})
    return 1


def service_environ() -> dict[str, str]:
    """This process's environment without HARNESS_* (HARNESS_CONFIG included): the services are configured
    by the bench's own settings alone, whatever the caller's shell exported."""
    return {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}


def main(argv: list[str]) -> int:
    defaults = CrsConfig()
    p = argparse.ArgumentParser(prog="harness bench crs")
    p.add_argument("--quick", action="store_true", help="a smaller run (under 60 s)")
    p.add_argument("--json", action="store_true", help="print JSON (the only output format)")
    p.add_argument("--hosts", type=int)
    p.add_argument("--clients", type=int, default=16, help="concurrent clients")
    p.add_argument("--reservations", type=int, help="per client")
    p.add_argument("--database", help="SQLAlchemy URL for the CRS and the compute IRM (default: SQLite files); "
                                      "on a PostgreSQL server the run makes a scratch database, any other URL "
                                      "is used as given and must be empty")
    p.add_argument("--filters", type=_filters, default=defaults.filters,
                   help=f"the CRS's filters, by name, comma-separated (default: {','.join(defaults.filters)})")
    p.add_argument("--weighers", type=_weighers, default=defaults.weighers,
                   help="the CRS's weighers, name=multiplier, comma-separated (default: "
                        f"{','.join(f'{k}={v:g}' for k, v in defaults.weighers.items())})")
    args = p.parse_args([a for a in argv if a != "--"])
    try:
        # Checked here, before any process starts; the same pipeline places in-process below.
        pipeline = Pipeline.from_names(args.filters, args.weighers)
    except PipelineError as e:
        print(f"harness bench crs: {e}", file=sys.stderr)
        return 2
    missing = pipeline.missing_filters(_latency_request().constraints)
    if missing:
        # Else the placement latency figures, measured last, would be refused after the whole run.
        print(f"harness bench crs: --filters must include {' and '.join(sorted(missing))}: the placement latency "
              "request has hops and different_host constraints", file=sys.stderr)
        return 2
    # The in-process placements' plug-in failures are this JSON's `error`: not also a traceback on stderr (the
    # CRS logs it for its operator; with no logging configured here it would go to stderr).
    plugins_log = logging.getLogger("cross_resource_scheduler.plugins")
    if not any(isinstance(h, logging.NullHandler) for h in plugins_log.handlers):
        plugins_log.addHandler(logging.NullHandler())
    try:
        # A plug-in failing while placing is found now, in a moment, rather than after the whole run: on the
        # latency request, and on requests shaped as the run's (a plug-in may fail on one and not the other).
        placement_p50_ms(100, 1, pipeline)
        run_shaped_trials(pipeline)
    except PluginFailed as e:
        return _plugin_failed(args, e)
    except Unschedulable as e:
        emit({"benchmark": "crs", "pipeline": {"filters": list(args.filters), "weighers": dict(args.weighers)},
              "error": f"the pipeline places no trial request on a cloud of 100 hosts: {e}; a pipeline whose "
                       "filters remove every host measures nothing"})
        return 1
    environ = service_environ()
    hosts = args.hosts or (300 if args.quick else 1000)
    per_client = args.reservations or (50 if args.quick else 150)
    tmp = Path(tempfile.mkdtemp(prefix="harness-bench-crs-"))
    procs = []
    scratch = ExitStack()
    try:
        # --database: the CRS and the compute IRM share it, as in compose.yaml; on a PostgreSQL
        # server a scratch database of the run's own (an earlier run's reservations would answer
        # this run's request ids).
        database = scratch.enter_context(scratch_database(args.database, "harness_bench")) if args.database else ""
        (tmp / "inventory.yaml").write_text(_inventory(hosts))
        crs_db = {"database": database} if database else {}
        crs = spawn("crs", settings={"state_dir": tmp, "heartbeat_interval_s": 1.0, "filters": args.filters,
                                     "weighers": args.weighers, **crs_db}, environ=environ)
        procs.append(crs)
        crs.wait_ready()
        compute_db = database or f"sqlite:///{tmp}/compute.db"
        compute = spawn("compute", settings={"state_dir": tmp, "crs_address": crs.address, "database": compute_db,
                                             "inventory": tmp / "inventory.yaml", "heartbeat_interval_s": 1.0},
                        environ=environ)
        procs.append(compute)
        compute.wait_ready()
        stub = irm_pb2_grpc.ResourceManagerStub(plain_channel(crs.address))
        deadline = time.monotonic() + 60
        while len(stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) < hosts:
            if time.monotonic() > deadline:
                raise RuntimeError("the compute IRM's hosts never reached the CRS")
            time.sleep(0.05)

        rounds = 4 if args.quick else 8
        echo_n = echo_s = 0.0
        stats: dict = {}
        for r in range(rounds):
            n, secs = run_echo(crs.address, args.clients, (3.0 if args.quick else 8.0) / rounds)
            echo_n, echo_s = echo_n + n, echo_s + secs
            one = run_clients(crs.address, args.clients, per_client, retry_share=0.1, round_no=r)
            for k, v in one.items():
                if isinstance(v, dict):
                    merged = stats.setdefault(k, {})
                    for code, n in v.items():
                        merged[code] = merged.get(code, 0) + n
                else:
                    stats[k] = stats.get(k, 0 if not isinstance(v, list) else []) + v
            if stats["internal"]:
                # Figures of a run whose placements failed are no pipeline's: said as the trial's failure is.
                emit({"benchmark": "crs", "pipeline": {"filters": list(args.filters), "weighers": dict(args.weighers)},
                      "error": f"placing failed on {stats['error_codes'].get('INTERNAL', 0)} of the run's requests "
                               f"(round {r + 1}): {stats['internal'][0]}; fix the plug-in or leave it out of "
                               "--filters/--weighers"})
                return 1
        echo_rps = echo_n / echo_s
        db = Database(compute_db)
        overbooked = len(ComputeStore(db, CostModel(), WallClock()).overbooking())
        db.dispose()

        repeats = 100 if args.quick else 400
        try:
            p100 = placement_p50_ms(100, repeats, pipeline)
            p5000 = placement_p50_ms(5000, repeats, pipeline)
        except PluginFailed as e:
            return _plugin_failed(args, e)
        committed_per_s = stats["committed"] / stats["reserve_s"]
        released_per_s = stats["released"] / stats["release_s"]
        emit({
            "benchmark": "crs",
            "hosts": hosts,
            "clients": args.clients,
            "pipeline": {"filters": list(args.filters), "weighers": dict(args.weighers)},
            "rounds": rounds,
            "reservations": stats["committed"],
            "exhausted": stats["exhausted"],
            "errors": stats["errors"],
            "error_codes": stats["error_codes"],      # of the refusals, exhausted included, by gRPC status
            "committed_per_s": round(committed_per_s, 1),
            "p50_ms": round(percentile(stats["latencies"], 0.5), 2),
            "p99_ms": round(percentile(stats["latencies"], 0.99), 2),
            "released": stats["released"],
            "released_per_s": round(released_per_s, 1),
            "release_p50_ms": round(percentile(stats["release_latencies"], 0.5), 2),
            "echo_rps": round(echo_rps, 1),
            "echo_ratio": round(committed_per_s / echo_rps, 3),
            "cpu_idle": round(stats["idle_ticks"] / stats["all_ticks"], 3) if stats["all_ticks"] else None,
            "overbooked": overbooked,
            "retried": stats["retried"],
            "duplicates": stats["duplicates"],
            "placement_p50_ms_100": round(p100, 3),
            "placement_p50_ms_5000": round(p5000, 3),
            "latency_ratio_5000_vs_100": round(p5000 / p100, 2),
            "database": "postgresql" if compute_db.startswith("postgres") else "sqlite",
        })
        return 0
    finally:
        for proc in reversed(procs):
            proc.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        scratch.close()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
