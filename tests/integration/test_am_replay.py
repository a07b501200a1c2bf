"""The Application Manager profiling real measurements through the whole path.

The AM service, the CRS, the compute IRM and an agent with the `replay` back-end are
separate processes; a manifest generated from a replay dataset (`harness app
replay-manifest`) makes every configuration column a Tunable parameter. Each profiling
run is reserved through the CRS and "executed" by the agent, which answers with the
measured time, status and cost; the model's frontier must be the dataset's own.
"""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest

from harness.v1 import application_manager_pb2 as pb
from harness.v1 import application_manager_pb2_grpc as pb_grpc
from harness.v1 import irm_pb2
from services.tls import plain_channel
from tests.conftest import eventually

DATASET = """workload,runtime_s,cost,status,cloud,vcpus
sort,400,0.40,ok,aws,2
sort,210,0.42,ok,aws,4
sort,120,0.48,ok,aws,8
sort,300,0.25,out of memory,gcp,2
sort,200,0.30,ok,gcp,4
sort,100,0.50,ok,gcp,8
"""


def pareto(rows: list[tuple[str, int, float, float]]) -> list[tuple[str, int]]:
    """Computed here, independently of the AM: ok runs no other ok run beats on both time and cost."""
    return sorted([(c, v) for c, v, t, x in rows
                   if not any(t2 <= t and x2 <= x and (t2, x2) != (t, x) for _, _, t2, x2 in rows)])


def _replay_am(suite, tmp_path, dataset: str):  # type: ignore[no-untyped-def]
    """A replay suite over `dataset` (the AM, the CRS, the compute IRM, a replaying agent): (AM stub, the manifest
    `harness app replay-manifest` made of the dataset)."""
    data = tmp_path / "runs.csv"
    data.write_text(dataset)
    manifest = tmp_path / "manifest.json"
    out = subprocess.run([sys.executable, "-m", "services.cli", "app", "replay-manifest", str(data), "sort",
                          "-o", str(manifest)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    crs, c = suite.compute_cloud(backend="replay", dataset=str(data))
    am_proc = suite.start("am", crs_address=crs.address)
    eventually(lambda: len(c.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources) >= 6)
    return pb_grpc.ApplicationManagerStub(plain_channel(am_proc.address)), manifest.read_text()


def _profiled(suite, tmp_path, dataset: str, **limits):  # type: ignore[no-untyped-def]
    """`_replay_am`'s application profiled with `limits` (uniform, seed 1): (AM stub, application, its session as
    it ended, its runs)."""
    am, manifest = _replay_am(suite, tmp_path, dataset)
    app = am.SubmitApplication(pb.SubmitApplicationRequest(tenant="t", manifest_json=manifest), timeout=30)
    events = list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                             seed=1, **limits), timeout=120))
    session = [e.session for e in events if e.HasField("session")][-1]
    return am, app, session, [e.run for e in events if e.HasField("run")]


def test_profiling_a_dataset_through_the_services_finds_its_frontier(suite, tmp_path):
    am, manifest = _replay_am(suite, tmp_path, DATASET)
    slo = json.dumps({"Manifest": "replay-sort", "Objective": {"Constraints": ["%execution_time <= 150"],
                                                               "Optimize": "%cost"}})
    app = am.SubmitApplication(pb.SubmitApplicationRequest(tenant="t", manifest_json=manifest,
                                                           slo_json=slo), timeout=30)
    assert app.configurations == 6 and set(app.dimensions) == {"%cloud", "%vcpus"}
    events = list(am.StartProfiling(pb.StartProfilingRequest(tenant="t", application_id=app.id, profiler="uniform",
                                                             max_runs=6, seed=1), timeout=120))
    runs = [e.run for e in events if e.HasField("run")]
    assert len(runs) == 6
    measured = {(r.configuration.values["%cloud"], int(r.configuration.values["%vcpus"])): r for r in runs}
    for line in DATASET.splitlines()[1:]:
        _, t, cost, status, cloud, vcpus = line.split(",")
        r = measured[(cloud, int(vcpus))]
        # The measured time, status and cost come back through CRS + agent, not the VM's price.
        assert (r.ok, r.execution_time_s, r.cost) == (status == "ok", pytest.approx(float(t)),
                                                      pytest.approx(float(cost))), r
    oom = measured[("gcp", 2)]
    assert "out of memory" in oom.error

    model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), timeout=10)
    ok_rows = [(cl, int(v), float(t), float(x)) for _, t, x, st, cl, v in
               (ln.split(",") for ln in DATASET.splitlines()[1:]) if st == "ok"]
    assert sorted((p.configuration.values["%cloud"], int(p.configuration.values["%vcpus"]))
                  for p in model.frontier) == pareto(ok_rows)

    # Under 150 s the cheapest is aws/8 (120 s, 0.48); with a budget of 0.45, the fastest is gcp/4.
    ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id), timeout=60)
    assert ex.state == pb.ApplicationExecution.STATE_SUCCEEDED, ex.error
    assert (ex.configuration.values["%cloud"], ex.configuration.values["%vcpus"]) == ("aws", "8")
    assert ex.measured_time_s == pytest.approx(120) and ex.measured_cost == pytest.approx(0.48)
    budget = json.dumps({"Objective": {"Constraints": ["%cost <= 0.45"], "Optimize": "%execution_time"}})
    ex = am.ExecuteApplication(pb.ExecuteApplicationRequest(tenant="t", application_id=app.id, slo_json=budget),
                               timeout=60)
    assert (ex.configuration.values["%cloud"], ex.configuration.values["%vcpus"]) == ("gcp", "4")
    assert ex.predicted_time_s == pytest.approx(200) and ex.measured_time_s == pytest.approx(200)

    # A Tunable parameter is the manager's to choose: an SLO that fixes it is refused, naming it.
    with pytest.raises(grpc.RpcError) as e:
        am.SubmitApplication(pb.SubmitApplicationRequest(
            tenant="t", manifest_json=manifest,
            slo_json=json.dumps({"Parameters": {"%cloud": "aws"}})), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Tunable" in e.value.details()


# Runs of seconds that cost far more than their VMs' quoted price for that long (a budget bound by time from the
# quote let a session overspend), and DATASET's runs of minutes that cost less (it cut runs short of the budget).
EXPENSIVE = """workload,runtime_s,cost,status,cloud,vcpus
sort,4,0.09,ok,aws,2
sort,3,0.10,ok,aws,4
sort,2,0.12,ok,aws,8
sort,5,0.05,ok,gcp,2
sort,3,0.08,ok,gcp,4
sort,2,0.20,ok,gcp,8
"""


@pytest.mark.parametrize(("dataset", "budget"), [(DATASET, 0.45), (EXPENSIVE, 0.15)])
def test_a_profiling_budget_bounds_replayed_runs_by_what_they_cost(suite, tmp_path, dataset, budget):
    """A replayed run costs what the measured run cost, not the quoted price of its VMs for its time: the agent
    ends the run that would overspend at what is left of the budget, and no limit from the quote cuts a run short
    of it (a session of budget 0.15 spent 0.19; one of 0.45 ended at 0.39)."""
    am, app, session, runs = _profiled(suite, tmp_path, dataset, max_runs=6, max_cost=budget)
    assert session.state == pb.ProfilingSession.STATE_DONE and session.message == "budget"
    assert session.spent == pytest.approx(budget) and sum(r.cost for r in runs) == pytest.approx(budget)
    # The runs before the last cost what was measured; the last one is cut where its cost reached what was left of
    # the budget, and it is not taken as a measurement of its configuration.
    measured = {(cloud, vcpus): float(cost) for _, _, cost, _, cloud, vcpus in
                (line.split(",") for line in dataset.splitlines()[1:])}
    *whole, cut = runs
    for r in whole:
        assert r.cost == pytest.approx(measured[(r.configuration.values["%cloud"], r.configuration.values["%vcpus"])])
    assert sum(r.cost for r in whole) < budget and cut.cost == pytest.approx(budget - sum(r.cost for r in whole))
    assert cut.cost < measured[(cut.configuration.values["%cloud"], cut.configuration.values["%vcpus"])]
    assert not cut.ok and cut.error.startswith("cost limit: cut at") and f"max_cost={budget:g}" in cut.error
    model = am.GetModel(pb.GetModelRequest(tenant="t", application_id=app.id), timeout=10)
    assert cut.configuration not in [p.configuration for p in model.frontier]


CHEAP = """workload,runtime_s,cost,status,cloud,vcpus
sort,400,0.010,ok,aws,2
sort,300,0.012,ok,aws,4
sort,200,0.014,ok,aws,8
sort,500,0.008,ok,gcp,2
sort,350,0.009,ok,gcp,4
sort,250,0.011,ok,gcp,8
"""


def test_a_first_replayed_run_cut_by_a_time_from_the_quote_does_not_end_the_session(suite, tmp_path):
    """Before its first run ends, a session cannot know its agents replay: that run is bounded by a time from the
    quoted price (minutes of these VMs cost far more than these measured runs), and is cut. It is not a
    measurement, and the session goes on to spend its budget (it ended there, 'budget', nearly all of it left)."""
    am, app, session, runs = _profiled(suite, tmp_path, CHEAP, max_runs=12, max_cost=0.05)
    first, *rest = runs
    assert not first.ok and "a limit from the quoted price; the run was replayed" in first.error
    assert first.execution_time_s < 200 and first.cost < 0.01        # cut well short of any measured run
    assert session.message == "budget" and session.spent == pytest.approx(0.05)
    assert sum(r.ok for r in rest) >= 4 and rest[-1].error.startswith("cost limit: cut at")
