"""The Application Manager across processes: CRS + compute IRM + agent + AM, real runs.

A real application (the RTM-like stencil) is submitted, profiled on the local back-end
(every run reserved through the CRS and executed by the agent inside its VM), the Pareto
frontier is read back, the application executes under an SLO and predicted and measured
time and cost are compared; the model survives a restart of the AM. The memory-hungry
DeltaMerge fails for real in a VM that is too small, and the failure is recorded with its cost.
"""

from __future__ import annotations

import json

import grpc
import pytest

import examples
from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from harness.v1 import irm_pb2, irm_pb2_grpc
from services import suite as suite_mod
from services.errors import field_violations
from services.launcher import spawn
from services.tls import plain_channel
from tests.conftest import eventually

TENANT = "acme"


def start_am(state: str, crs: str):  # type: ignore[no-untyped-def]
    p = spawn("am", name="am", settings={"crs_address": crs, "state_dir": state, "run_timeout_s": 60},
              log_path=f"{state}/logs/am-test.log")
    p.wait_ready()
    return p


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    state = str(tmp_path_factory.mktemp("am"))
    procs = suite_mod.start(state, auto_ports=True)
    addrs = {p.name: p.address for p in procs}
    crs = irm_pb2_grpc.ResourceManagerStub(plain_channel(addrs["crs"]))
    eventually(lambda: len(crs.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) >= 6,
               what="the compute IRM's hosts in the CRS")
    am = next((p for p in procs if p.name == "am"), None) or start_am(state, addrs["crs"])
    box = {"state": state, "crs": addrs["crs"], "am": am}
    yield box
    box["am"].stop()
    suite_mod.stop(procs)


def stub(cloud) -> pb_grpc.ApplicationManagerStub:  # type: ignore[no-untyped-def]
    return pb_grpc.ApplicationManagerStub(plain_channel(cloud["am"].address))


def submit(am, name: str, **params) -> pb.Application:  # type: ignore[no-untyped-def]
    return am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant=TENANT, manifest_json=examples.manifest(name), slo_json=examples.slo(name, **params),
        app_dir=examples.app_dir(name)), timeout=30)


def test_profile_select_execute_and_survive_restart(cloud):
    am = stub(cloud)
    app = submit(am, "rtm", rows=200, steps=20)
    # cores {1,2,4} x memory {256,512,1024}, less (4 cores, 256 MB) by the GlobalConstraint.
    assert app.configurations == 8 and set(app.dimensions) == {"%master_cores", "%master_mem"}

    events = list(am.StartProfiling(pb.StartProfilingRequest(tenant=TENANT, application_id=app.id, profiler="uniform",
                                                             max_runs=6, seed=1), timeout=240))
    final = events[-1].session
    assert final.state == pb.ProfilingSession.STATE_DONE and final.runs == 6, final.message
    runs = [e.run for e in events if e.HasField("run")]
    assert len(runs) == 6 and all(r.ok for r in runs), [r.error for r in runs]
    assert all(r.execution_time_s > 0 and r.cost > 0 for r in runs)
    assert len({r.configuration.summary for r in runs}) == 6
    # cost = CRS price per minute x minutes: a 2-core VM is dearer per second than a 1-core one.
    rate = {r.configuration.summary: r.cost / r.execution_time_s for r in runs}
    assert len(set(round(x, 9) for x in rate.values())) > 1

    model = am.GetModel(pb.GetModelRequest(tenant=TENANT, application_id=app.id), timeout=10)
    assert len(model.runs) == 6 and 1 <= len(model.frontier) <= 6
    times = [p.execution_time_s for p in model.frontier]
    costs = [p.cost for p in model.frontier]
    assert times == sorted(times) and costs == sorted(costs, reverse=True)  # a real trade-off curve

    # Execute under a time bound that the slowest frontier point misses and the fastest meets.
    bound = (times[0] + times[-1]) / 2 if len(times) > 1 else times[0] * 3
    slo = json.dumps({"Manifest": "RTM", "Parameters": {"%rows": 200, "%steps": 20},
                      "Objective": {"Constraints": [f"%execution_time <= {bound * 3:.3f}"], "Optimize": "%cost"}})
    ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant=TENANT, application_id=app.id, slo_json=slo),
                               timeout=120)
    assert ex.state == pb.ApplicationExecution.STATE_SUCCEEDED, ex.error
    cheapest_meeting = min((p for p in model.frontier if p.execution_time_s <= bound * 3), key=lambda p: p.cost)
    assert ex.configuration.summary == cheapest_meeting.configuration.summary
    assert ex.predicted_time_s == pytest.approx(cheapest_meeting.execution_time_s)
    assert ex.measured_time_s > 0 and ex.measured_cost > 0 and "rtm rows=200" in ex.output_tail
    # Same configuration, same program: the measurement is near the prediction (a loaded 2-core box: generous).
    assert 0.25 < ex.measured_time_s / ex.predicted_time_s < 4
    listed = am.ListExecutions(pb.ListExecutionsRequest(tenant=TENANT, application_id=app.id), timeout=10)
    assert [e.id for e in listed.executions] == [ex.id]

    # An SLO nothing meets: FAILED_PRECONDITION naming the best achievable.
    impossible = json.dumps({"Objective": {"Constraints": ["%execution_time <= 0.001"]}})
    with pytest.raises(grpc.RpcError) as e:
        am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant=TENANT, application_id=app.id,
                                                           slo_json=impossible), timeout=30)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "best achievable" in e.value.details()

    # Another tenant sees nothing of it.
    with pytest.raises(grpc.RpcError) as e:
        am.GetModel(pb.GetModelRequest(tenant="intruder", application_id=app.id), timeout=10)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED

    # The model survives a restart of the AM process.
    before = [(p.configuration.summary, p.cost) for p in
              am.GetModel(pb.GetModelRequest(tenant=TENANT, application_id=app.id), timeout=10).frontier]
    cloud["am"].stop()
    cloud["am"] = start_am(cloud["state"], cloud["crs"])
    after = stub(cloud).GetModel(pb.GetModelRequest(tenant=TENANT, application_id=app.id), timeout=10)
    assert [(p.configuration.summary, p.cost) for p in after.frontier] == before
    assert len(after.runs) == 7  # six profiling runs and the execution (online profiling)


def test_memory_hungry_run_fails_for_real_and_is_recorded_with_its_cost(cloud):
    am = stub(cloud)
    manifest = json.loads(examples.manifest("deltamerge"))
    attrs = manifest["Modules"][0]["Implementations"][0]["Resources"]["Groups"][0]["Attributes"]
    attrs["Memory"]["Values"], attrs["Cores"] = [128, 1024], {"Value": 1}  # two VMs: too small, and ample
    app = am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant=TENANT, manifest_json=json.dumps(manifest), slo_json=examples.slo("deltamerge", million_rows=4),
        app_dir=examples.app_dir("deltamerge")), timeout=30)
    assert app.configurations == 2
    events = list(am.StartProfiling(pb.StartProfilingRequest(
        tenant=TENANT, application_id=app.id, profiler="uniform", max_runs=2), timeout=120))
    runs = {e.run.configuration.values["%master_mem"]: e.run for e in events if e.HasField("run")}
    assert set(runs) == {"128", "1024"}
    small, ample = runs["128"], runs["1024"]
    assert not small.ok and "memory limit exceeded" in small.error, small
    assert small.cost > 0 and small.memory_percent >= 90
    assert ample.ok, ample.error
    model = am.GetModel(pb.GetModelRequest(tenant=TENANT, application_id=app.id), timeout=10)
    assert [p.configuration.values["%master_mem"] for p in model.frontier] == ["1024"]
    assert sum(r.cost for r in model.runs) == pytest.approx(small.cost + ample.cost)


def test_two_module_application_starts_its_service_first_and_fails_when_it_dies(cloud):
    am = stub(cloud)
    app = submit(am, "wordcount", shards=4)
    # master cores {1,2} x master memory {256,512} x store cores {1,2}: one variant of two modules.
    assert app.configurations == 8
    assert set(app.dimensions) == {"%master_cores", "%master_mem", "%store_cores"}
    events = list(am.StartProfiling(pb.StartProfilingRequest(tenant=TENANT, application_id=app.id, profiler="uniform",
                                                             max_runs=6, seed=3), timeout=240))
    runs = [e.run for e in events if e.HasField("run")]
    assert len(runs) == 6 and all(r.ok for r in runs), [r.error for r in runs]
    model = am.GetModel(pb.GetModelRequest(tenant=TENANT, application_id=app.id), timeout=10)
    assert len(model.runs) == 6 and model.frontier
    ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant=TENANT, application_id=app.id), timeout=120)
    assert ex.state == pb.ApplicationExecution.STATE_SUCCEEDED, ex.error
    # The main module reached the store through the endpoint the store announced, and counted every word.
    assert "800000 words in 4 shards from 127.0.0.1:" in ex.output_tail
    assert ex.predicted_time_s > 0 and ex.measured_time_s > 0 and ex.measured_cost > 0
    # Every VM of every run was given back (the services were stopped, the reservations released).
    crs = irm_pb2_grpc.ResourceManagerStub(plain_channel(cloud["crs"]))
    eventually(lambda: not crs.ListReservations(irm_pb2.ListReservationsRequest(tenant=TENANT)).reservations,
               what="no reservation left")

    # A store that dies before it is ready fails the run, named, and the run still costs its reservation time.
    broken = json.loads(examples.manifest("wordcount"))
    broken["Modules"][1]["Implementations"][0]["Command"] = ["%python", "-c", "import sys; sys.exit(3)"]
    app = am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant=TENANT, manifest_json=json.dumps(broken), slo_json=examples.slo("wordcount", shards=4),
        app_dir=examples.app_dir("wordcount")), timeout=30)
    events = list(am.StartProfiling(pb.StartProfilingRequest(tenant=TENANT, application_id=app.id, profiler="uniform",
                                                             max_runs=1), timeout=120))
    (run,) = [e.run for e in events if e.HasField("run")]
    assert not run.ok and "service module 'Store'" in run.error and "exit code 3" in run.error, run.error
    assert run.cost > 0


def test_bad_input_names_the_fields(cloud):
    am = stub(cloud)
    bad = json.loads(examples.manifest("rtm"))
    bad["Modules"][0]["Implementations"][0]["Resources"]["Groups"][0]["Attributes"]["Cores"] = {
        "Var": "%master_cores", "Range": [4, 1]}
    with pytest.raises(grpc.RpcError) as e:
        am.SubmitApplication(pb.SubmitApplicationRequest(tenant=TENANT, manifest_json=json.dumps(bad),
                                                         slo_json='{"Objective": {"Optimize": "%speed"}}'), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    fields = dict(field_violations(e.value))
    assert "manifest_json.Modules[0].Implementations[0].Resources.Groups[0].Attributes.Cores.Range" in fields
    with pytest.raises(grpc.RpcError) as e:
        am.SubmitApplication(pb.SubmitApplicationRequest(tenant="", manifest_json="{}"), timeout=10)
    assert dict(field_violations(e.value)).keys() == {"tenant"}
    # More cores than any host of the CRS's compute IRM has: refused at submit, saying what the managers offer (every
    # run failed at the CRS before).
    absurd = json.loads(examples.manifest("rtm"))
    for impl in absurd["Modules"][0]["Implementations"]:
        impl["Resources"]["Groups"][0]["Attributes"]["Cores"] = {"Var": "%master_cores", "Values": [1e300]}
    with pytest.raises(grpc.RpcError) as e:
        am.SubmitApplication(pb.SubmitApplicationRequest(tenant=TENANT, manifest_json=json.dumps(absurd)), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Cores 1e+300 is outside what the managers offer (1..32 cores)" in dict(field_violations(e.value))[
        "manifest"]
    app = submit(am, "option_pricing", million_options=0.25)
    # The suite has an FPGA IRM, so the FPGA implementation is part of the search space.
    assert not any("BlackScholes-FPGA" in n for n in app.notes)
    with pytest.raises(grpc.RpcError) as e:
        list(am.StartProfiling(pb.StartProfilingRequest(tenant=TENANT, application_id=app.id, profiler="magic",
                                                        max_runs=0 - 1), timeout=10))
    assert set(dict(field_violations(e.value))) == {"profiler", "max_runs"}
    # Nothing profiled yet: FAILED_PRECONDITION, unless online profiling may try a configuration.
    with pytest.raises(grpc.RpcError) as e:
        am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant=TENANT, application_id=app.id), timeout=30)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # Another input than the one the application was submitted (and is profiled) with: its model says nothing of it.
    other = json.dumps({"Manifest": "OptionPricing", "Parameters": {"%million_options": 1}})
    with pytest.raises(grpc.RpcError) as e:
        am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant=TENANT, application_id=app.id, online=True,
                                                           slo_json=other), timeout=30)
    assert [f for f, _ in field_violations(e.value)] == ["slo_json.Parameters"]
    assert "%million_options=0.25" in e.value.details()
    assert am.ListExecutions(pb.ListExecutionsRequest(tenant=TENANT, application_id=app.id), timeout=10).executions \
        == []
    small = json.dumps({"Manifest": "OptionPricing", "Parameters": {"%million_options": 0.25}})
    ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant=TENANT, application_id=app.id, online=True,
                                                            slo_json=small), timeout=120)
    assert ex.state == pb.ApplicationExecution.STATE_SUCCEEDED and ex.predicted_time_s == 0, ex.error
    model = am.GetModel(pb.GetModelRequest(tenant=TENANT, application_id=app.id), timeout=10)
    assert len(model.runs) == 1 and len(model.frontier) == 1
    # Its memory is the agent's measured peak over the VM's (a run shorter than one sampling interval has no
    # sample; it read as 0%, "uses no memory", to the white-box profiler's hints).
    (run,) = model.runs
    assert 5 < run.memory_percent < 100, run


def test_schema_migrates_and_round_trips_on_postgresql(fresh_pg_url):
    from application_manager import models as m
    from application_manager.service import MIGRATIONS
    from services.db import Database

    db = Database(fresh_pg_url)
    try:
        db.migrate(MIGRATIONS, "alembic_version_am")
        db.migrate(MIGRATIONS, "alembic_version_am")  # idempotent
        cfg = {"implementation": "RTM-CPU", "%master_cores": 2, "%master_mem": 512}

        def add(s) -> None:  # type: ignore[no-untyped-def]
            s.add(m.Application(id="app-1", tenant="t", request_id=None, name="RTM", manifest="{}", slo="{}",
                                app_dir="", created_at=1.0))
            s.flush()
            s.add(m.Run(application_id="app-1", session_id="s", ordinal=1, config=cfg, input="production", ok=True,
                        error="", time_s=1.5, cost=0.01, cpu_percent=None, memory_percent=40.0, reason="",
                        created_at=2.0))
            s.add(m.Model(application_id="app-1", frontier=[{"config": cfg, "time_s": 1.5, "cost": 0.01,
                                                             "predicted": False}], predictions=[],
                          extrapolation={"family": "linear", "params": [0.0, 2.0], "r2": 1.0, "points": 3},
                          updated_at=3.0))
        db.transact(add)
        with db.read() as s:
            run = s.query(m.Run).one()
            model = s.get(m.Model, "app-1")
        assert run.config == cfg and run.cpu_percent is None
        assert model.frontier[0]["config"] == cfg and model.extrapolation["params"] == [0.0, 2.0]
    finally:
        db.dispose()


def test_extrapolated_profiling_learns_the_memory_bottleneck_for_real(cloud):
    """Algorithm 7 on DeltaMerge: discovery on the small benchmarking input, production runs that
    die at the VM's memory limit, bottleneck detection, a fitted curve and predicted points."""
    am = stub(cloud)
    manifest = json.loads(examples.manifest("deltamerge"))
    attrs = manifest["Modules"][0]["Implementations"][0]["Resources"]["Groups"][0]["Attributes"]
    attrs["Memory"]["Values"], attrs["Cores"] = [96, 512, 1024], {"Value": 1}  # 4 M rows need ~125 MB
    app = am.SubmitApplication(pb.SubmitApplicationRequest(
        tenant=TENANT, manifest_json=json.dumps(manifest), slo_json=examples.slo("deltamerge", million_rows=4),
        app_dir=examples.app_dir("deltamerge")), timeout=30)
    events = list(am.StartProfiling(pb.StartProfilingRequest(
        tenant=TENANT, application_id=app.id, profiler="extrapolated", max_runs=9, seed=2), timeout=240))
    assert events[-1].session.state == pb.ProfilingSession.STATE_DONE, events[-1].session.message
    runs = [e.run for e in events if e.HasField("run")]
    bench = [r for r in runs if r.input == pb.ProfileRun.INPUT_BENCHMARK]
    prod = [r for r in runs if r.input == pb.ProfileRun.INPUT_PRODUCTION]
    assert len(bench) == 3 and all(r.ok for r in bench)  # 0.5 M rows fit even in 96 MB
    small = [r for r in prod if r.configuration.values["%master_mem"] == "96"]
    assert small and not small[0].ok and "memory limit exceeded" in small[0].error
    assert any(r.ok for r in prod)
    model = am.GetModel(pb.GetModelRequest(tenant=TENANT, application_id=app.id), timeout=10)
    x = model.extrapolation
    assert x.family and x.points >= 1
    assert any(c.startswith("%master_mem >= ") for c in x.constraints), list(x.constraints)
    assert all(p.configuration.values["%master_mem"] != "96" for p in model.frontier)
