"""Review 25 (a researcher plugging in CRS filters and weighers): what a broken plug-in did unseen.

* A placement stuck in a plug-in (a filter looping forever) held every request, read and release of the CRS with
  nothing logged: now a warning while it runs names the plug-in and its line (`Crs.check_stuck_placement`).
* A service that hung while starting (a plug-in that never finishes importing) was reported by `harness up` as
  "crs did not start (exit code -15):" and nothing: the -15 was the launcher's own SIGTERM.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import tests.crs_plugin_examples as ex
from cross_resource_scheduler import service as crs_service
from harness.v1 import irm_pb2
from services.launcher import LaunchError, ServiceProcess
from tests.unit.test_crs_reserve import make_crs
from tests.unit.test_crs_service_parse import _group


def _process(code: str) -> ServiceProcess:
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    sp = ServiceProcess("crs", "crs", proc)
    threading.Thread(target=sp._pump, daemon=True).start()
    return sp


def test_a_service_hung_while_starting_is_said_to_have_hung_not_to_have_exited():
    sp = _process("import sys, time; sys.stderr.write('loading plug-ins\\n'); sys.stderr.flush(); time.sleep(60)")
    with pytest.raises(LaunchError) as e:
        sp.wait_ready(timeout=1.0)
    assert str(e.value) == ("crs did not serve within 1 s and was stopped: it hung while starting (a plug-in that "
                            "does not finish importing, say); its last lines:\nloading plug-ins")
    assert sp.proc.poll() is not None                  # stopped


def test_a_service_that_exited_while_starting_gives_its_exit_code_and_lines():
    sp = _process("import sys; sys.stderr.write('bad setting\\n'); sys.exit(2)")
    with pytest.raises(LaunchError) as e:
        sp.wait_ready(timeout=30.0)
    assert str(e.value) == "crs did not start (exit code 2):\nbad setting"


def test_a_placement_stuck_in_a_plug_in_is_said_while_it_runs_naming_the_plug_in_and_its_line(tmp_path, caplog):
    crs = make_crs(tmp_path, filters=["traits", "properties", "capacity", "affinity", "distance",
                                      "tests.crs_plugin_examples:Blocks"])
    ex.ENTERED.clear()
    ex.RELEASED.clear()
    ended: list[object] = []

    def quote() -> None:
        try:
            ended.append(crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant="t", groups=[_group(2)]), None))
        except Exception as e:  # noqa: BLE001 - how the quote ends (no manager stands in) is not this test's
            ended.append(e)

    quoting = threading.Thread(target=quote, daemon=True)
    try:
        assert crs.check_stuck_placement() is None                    # nothing placing
        quoting.start()
        assert ex.ENTERED.wait(10)
        started = crs._placing[1]
        assert crs.check_stuck_placement(now=started + crs_service.STUCK_PLACEMENT_S - 1) is None     # not yet
        said = crs.check_stuck_placement(now=started + crs_service.STUCK_PLACEMENT_S + 1)
        line = next(i for i, text in enumerate(open(ex.__file__).read().splitlines(), 1) if "RELEASED.wait(30)" in text)
        assert said == (
            f"a placement has been running for {crs_service.STUCK_PLACEMENT_S + 1:.0f} s and goes on; every request, "
            f"read and release of the CRS waits for it (placements hold the capacity view): it is in filter 'blocks' "
            f"(tests.crs_plugin_examples:Blocks), at {ex.__file__}:{line} in host_passes: remove the plug-in from the "
            f"CRS's settings and restart the CRS (a running placement cannot be stopped)")
        assert said in caplog.text
        # Said again only STUCK_SAID_EVERY_S later.
        assert crs.check_stuck_placement(now=started + crs_service.STUCK_PLACEMENT_S + 2) is None
        assert crs.check_stuck_placement(now=started + crs_service.STUCK_PLACEMENT_S + 2
                                         + crs_service.STUCK_SAID_EVERY_S) is not None
    finally:
        ex.RELEASED.set()
        quoting.join(10)
        crs.db.dispose()
    assert ended and crs._placing is None and crs.check_stuck_placement() is None      # it ended
