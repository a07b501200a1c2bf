"""Review 25: `harness bench crs` with a plug-in that passed its one trial placement (the latency request, with
constraints) but failed on the run's own requests printed figures (reservations 0, errors 3200) with exit status 0;
one whose filters removed every host died with a traceback. Now requests shaped as the run's are tried too, a
pipeline placing nothing is one JSON error, and an INTERNAL during the run ends it as the trial's failure does
(tests/integration/test_crs_review19_plugins_grpc.py: the run's own)."""

from __future__ import annotations

import bench.crs
from tests.unit.test_crs_review19_plugins_bench import EX, FILTERS, no_spawn, run


def test_a_plugin_failing_on_requests_shaped_as_the_runs_is_found_before_anything_starts(monkeypatch, capsys):
    monkeypatch.setattr(bench.crs, "spawn", no_spawn)
    filters = [*FILTERS, f"{EX}:FirstConstraint"]
    rc, out, err = run(capsys, "--filters", ",".join(filters))
    assert rc == 1 and err == "" and set(out) == {"benchmark", "pipeline", "error"}
    assert out["error"].startswith(f"placing failed: the filter plug-in 'first_constraint' ({EX}:FirstConstraint) "
                                   "raised IndexError"), out["error"]


def test_a_pipeline_that_places_nothing_is_one_json_error(monkeypatch, capsys):
    monkeypatch.setattr(bench.crs, "spawn", no_spawn)
    rc, out, err = run(capsys, "--filters", ",".join([*FILTERS, f"{EX}:DrainAll"]))
    assert rc == 1 and err == "" and set(out) == {"benchmark", "pipeline", "error"}
    assert out["error"].startswith("the pipeline places no trial request on a cloud of 100 hosts: group "), \
        out["error"]
    assert "drain_all removed" in out["error"]
