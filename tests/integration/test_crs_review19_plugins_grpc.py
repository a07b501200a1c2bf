"""Review 19, through real processes: a researcher's filter on `node.used` leaves a busy cloud RESOURCE_EXHAUSTED
CAPACITY_IN_USE (it was FAILED_PRECONDITION NEVER_FITS: the never-fits proof showed the plug-in the nodes as they
are, not empty); `harness reserve` failing with no definite answer prints the request id it used and the command
that retries it without reserving twice; `harness bench crs` with a plug-in that fails only in its latency
measurement (after the run) prints one JSON document with an `error`, exit status 1."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import grpc

from harness.v1 import irm_pb2
from services import cli
from services.errors import CAPACITY_IN_USE, error_info
from tests.conftest import eventually
from tests.integration.standin_manager import Standin
from tests.integration.test_crs_plugins_external_grpc import (  # noqa: F401 - procs: the fixture
    DEFAULT_FILTERS,
    ROOT,
    cloud,
    procs,
    vm,
)

EX = "tests.crs_plugin_examples"


def test_a_filter_on_node_used_leaves_a_busy_cloud_in_use_not_never_fits(procs, tmp_path) -> None:  # noqa: F811
    stub = cloud(procs, tmp_path, crs={"filters": [*DEFAULT_FILTERS, f"{EX}:LowLoad"]})["crs"]

    def used() -> dict[str, float]:
        return {h.id: h.used["cores"] for h in stub.DiscoverResources(irm_pb2.DiscoverResourcesRequest()).resources}

    # Hosts a, b, c have 4, 8, 16 cores: 9 cores go to c, then 5 to b (c is past half), then 3 to a.
    for n, cores in enumerate((9, 5, 3)):
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id=f"fill{n}", groups=[vm(cores=cores)]), timeout=30)
        eventually(lambda cores=cores: cores in used().values(), what=f"the {cores} cores in use in the CRS's view")
    assert used() == {"a": 3, "b": 5, "c": 9}  # every host past half its cores
    try:
        stub.Reserve(irm_pb2.ReserveRequest(tenant="t", request_id="one", groups=[vm(cores=1)]), timeout=30)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
        assert error_info(e)[0] == CAPACITY_IN_USE and "lowload removed 3" in e.details(), e.details()
    else:
        raise AssertionError("reserved on a host past half its cores")


def test_reserve_with_no_answer_prints_its_request_id_and_the_command_retrying_it(suite, tmp_path, capsys) -> None:
    crs = suite.start("crs", heartbeat_interval_s=0.3, heartbeat_timeout_s=5.0, irm_timeout_s=20.0)
    gate = tmp_path / "commit"
    slow = Standin(tmp_path, crs.address, "slow", type="gadget", hb=0.3, reserve_gate=str(gate))
    try:
        eventually(lambda: cli.main(["discover", "--crs", crs.address]) == 0 and '"gadget"' in capsys.readouterr().out,
                   what="the manager's host in the CRS")
        argv = ["reserve", "--crs", crs.address, "--tenant", "t", "--timeout", "1", "--priority", "2",
                "--group", "name=g,type=gadget,units=1", "--constraint", "different_host(g, g)"]
        assert cli.main(argv) == 1
        out, err = capsys.readouterr()
        assert out == ""
        lines = err.splitlines()
        assert lines[0].startswith("error: DEADLINE_EXCEEDED"), err
        assert "no answer came, so the reservation may have been made all the same. Its request id is " in lines[1]
        rid = lines[1].split("Its request id is ")[1].split(".")[0]
        assert len(rid) == 32, err
        retry = shlex.split(lines[2].strip())
        # The same command, the request id added (options in an order of their own), waiting twice as long: the
        # CRS gives back what it placed for a caller that left first, so the same deadline would fail again.
        assert retry[0] == "harness" and lines[1].endswith(", waiting 2 s:"), err
        parse = cli.build_parser().parse_args
        longer = [*argv[:argv.index("--timeout")], "--timeout", "2", *argv[argv.index("--timeout") + 2:]]
        assert parse(retry[1:]) == parse([*longer, "--request-id", rid]), err
        assert lines[3] == f"  If it was made, `harness reservations` lists it with request_id {rid}."

        # Let the manager commit: the printed command answers the reservation (made by the first call, or by this
        # one), never a second one.
        gate.write_text("")
        eventually(lambda: cli.main(retry[1:]) == 0, what="the retry answered", timeout=60)
        placed = json.loads(capsys.readouterr().out)  # only the answered call prints (its errors go to stderr)
        assert placed["request_id"] == rid and placed["state"] == "STATE_ACTIVE"
        assert cli.main(["reservations", "--crs", crs.address, "--tenant", "t"]) == 0
        held = json.loads(capsys.readouterr().out)["reservations"]
        assert [(r["request_id"], r["id"]) for r in held] == [(rid, placed["id"])]  # one reservation, not two
        assert len(slow.held("t")) == 1
    finally:
        slow.kill()


def test_reserve_refused_definitely_prints_no_request_id(suite, tmp_path, capsys) -> None:
    crs = suite.start("crs", heartbeat_interval_s=0.3)
    assert cli.main(["reserve", "--crs", crs.address, "--tenant", "t", "--group", "type=nothing,units=1"]) == 1
    err = capsys.readouterr().err
    assert "request id" not in err and "--request-id" not in err, err


def _bench_refusing(monkeypatch, capsys, plugin: str) -> tuple[dict, str]:  # type: ignore[no-untyped-def]
    """`harness bench crs` on 4 hosts with `plugin` after the default filters: its one JSON document, which must be
    an error (exit status 1), and its stderr."""
    import bench.crs

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    filters = ["capacity", "affinity", "distance", f"{EX}:{plugin}"]
    rc = bench.crs.main(["--quick", "--json", "--hosts", "4", "--clients", "2", "--reservations", "2",
                         "--filters", ",".join(filters)])
    out, err = capsys.readouterr()
    assert rc == 1
    doc = json.loads(out)  # the one JSON document
    assert set(doc) == {"benchmark", "pipeline", "error"} and doc["pipeline"]["filters"] == filters
    return doc, err


def test_bench_crs_with_a_plugin_failing_after_the_run_prints_one_json_error(monkeypatch, capsys) -> None:
    doc, err = _bench_refusing(monkeypatch, capsys, "FailsPastH999")
    assert doc["error"].startswith(f"placing failed: the filter plug-in 'fails_past_h999' ({EX}:FailsPastH999) "
                                   "raised LookupError: no rule for h"), doc["error"]
    assert "Traceback" not in err


def test_harness_bench_crs_with_a_failing_plugin_prints_only_the_json_error() -> None:
    # As a researcher runs it: the process's stdout is the one JSON document, its stderr empty (no traceback).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    filters = "traits,capacity,affinity,distance,tests.crs_plugin_examples:AlwaysBoom"
    ran = subprocess.run([sys.executable, "-m", "services.cli", "bench", "crs", "--json", "--quick", "--filters",
                          filters], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert (ran.returncode, ran.stderr) == (1, "")
    error = json.loads(ran.stdout)["error"]
    assert error.startswith(f"placing failed: the filter plug-in 'always_boom' ({EX}:AlwaysBoom) raised "
                            "RuntimeError: the always_boom filter broke (while checking compute/h"), error


def test_bench_crs_with_a_plugin_failing_only_on_the_runs_requests_prints_one_json_error(monkeypatch, capsys) -> None:
    # Review 25: it passed the in-process trials, failed every request of the run (INTERNAL), and the bench printed
    # figures with exit status 0.
    doc, err = _bench_refusing(monkeypatch, capsys, "FailsOnGeneratedSites")
    assert doc["error"].startswith("placing failed on 4 of the run's requests (round 1): the CRS's filter plug-in "
                                   f"'fails_on_generated_sites' ({EX}:FailsOnGeneratedSites) raised LookupError: no "
                                   "rule for site site-"), doc["error"]
    assert "Traceback" not in err
