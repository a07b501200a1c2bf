"""Review 19: `harness bench crs --filters ...,<a filter that raises>` died with a 54-line traceback (PluginFailed
from the placement latency measurement) and printed no JSON. Now the bench tries its pipeline in-process before it
starts anything, and prints its one JSON document with an `error` saying which plug-in failed and how (one line),
exit status 1 (a plug-in failing only later, in the latency measurement after the run, is reported the same way:
tests/integration/test_crs_review19_plugins_grpc.py)."""

from __future__ import annotations

import json

import bench.crs

EX = "tests.crs_plugin_examples"
FILTERS = ["traits", "capacity", "affinity", "distance"]


def run(capsys, *argv: str) -> tuple[int, dict, str]:
    rc = bench.crs.main(["--json", "--quick", *argv])
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def no_spawn(service: str, **kw):  # type: ignore[no-untyped-def]
    raise AssertionError(f"the bench started {service} although its pipeline cannot place")


def test_a_plugin_failing_while_placing_is_one_json_error_before_anything_starts(monkeypatch, capsys) -> None:
    monkeypatch.setattr(bench.crs, "spawn", no_spawn)
    filters = [*FILTERS, f"{EX}:AlwaysBoom"]
    rc, out, err = run(capsys, "--filters", ",".join(filters))
    assert rc == 1 and err == ""
    assert set(out) == {"benchmark", "pipeline", "error"}
    assert (out["benchmark"], out["pipeline"]["filters"]) == ("crs", filters)
    error = out["error"]
    assert error.startswith(f"placing failed: the filter plug-in 'always_boom' ({EX}:AlwaysBoom) raised "
                            "RuntimeError: the always_boom filter broke (while checking compute/h"), error
    assert "\n" not in error and error.endswith("; fix the plug-in or leave it out of --filters/--weighers")


def test_a_weigher_failing_while_placing_is_one_json_error_too(monkeypatch, capsys) -> None:
    monkeypatch.setattr(bench.crs, "spawn", no_spawn)
    rc, out, _ = run(capsys, "--weighers", f"pack=1,{EX}:AlwaysNaN=1")
    assert rc == 1
    assert out["error"].startswith(f"placing failed: the weigher plug-in 'always_nan' ({EX}:AlwaysNaN) scored nan "
                                   "for compute/h"), out["error"]
