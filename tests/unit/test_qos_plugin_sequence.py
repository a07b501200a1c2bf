"""Replies from a plug-in's worker name the request they answer (irm_fpga.qos.plugin_worker): a frame the plug-in
writes on the pipe by itself is never taken for the answer to the call in progress or to a later one.

The plug-ins below are loaded by name in the worker (this module is imported there); each misbehaves when 3 devices
are free and answers FCFS at the minimum otherwise.
"""

import gc
import time
from multiprocessing.connection import Connection

import pytest

from irm_fpga.qos.hydrogen import HJob
from irm_fpga.qos.plugin_worker import PluginRunner, _encode
from irm_fpga.qos.plugins import PolicyError

HERE = "tests.unit.test_qos_plugin_sequence"
QUEUE = [HJob("short", 0.0, 0.5, 1, 2), HJob("long", 0.1, 4.0, 2, 4)]
TIMEOUT_S = 1.0
MARGIN_S = 1.0
FORGED = ["ok", [["long", 4]]]       # an answer the plug-in never gave as its own


def _pipe() -> Connection:
    return next(o for o in gc.get_objects() if isinstance(o, Connection) and not o.closed)


def first_on_min(queue, available):
    return [(queue[0].job_id, queue[0].min_devices)] if queue and queue[0].min_devices <= available else []


def replays_an_earlier_reply(queue, available, window, cost, *, now):
    """Writes a reply to request 1 (already answered) ahead of the worker's reply to this one."""
    if available == 3:
        _pipe().send_bytes(_encode(FORGED, 1))
    return first_on_min(queue, available)


def answers_ahead(queue, available, window, cost, *, now):
    """Writes a reply to a request the manager has not made."""
    if available == 3:
        _pipe().send_bytes(_encode(FORGED, 10**9))
        time.sleep(10.0)
    return first_on_min(queue, available)


@pytest.fixture
def runner():
    made = []

    def make(name: str) -> PluginRunner:
        made.append(PluginRunner(f"{HERE}:{name}", timeout_s=TIMEOUT_S))
        made[-1].start()
        return made[-1]

    yield make
    for r in made:
        r.close()


@pytest.mark.timeout(60)
def test_a_reply_to_an_earlier_request_is_dropped_and_later_answers_are_not_one_call_late(runner):
    r = runner("replays_an_earlier_reply")
    pid = r.pid
    assert r(QUEUE, 2, 30, now=0.0) == [("short", 1)]         # request 1
    assert r(QUEUE, 3, 30, now=0.1) == [("short", 1)]         # its own answer, not the replayed one
    assert r(QUEUE, 2, 30, now=0.2) == [("short", 1)]         # and the next is this call's
    assert r.pid == pid                                        # dropped quietly: the same worker goes on


@pytest.mark.timeout(60)
def test_a_reply_to_a_request_not_yet_made_is_refused_within_the_time_limit(runner):
    r = runner("answers_ahead")
    assert r(QUEUE, 2, 30, now=0.0) == [("short", 1)]
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=r"not an answer .*a reply to request 1000000000, not yet made \(the last "
                                          r"was 2\).*its worker process was stopped"):
        r(QUEUE, 3, 30, now=0.1)
    assert time.monotonic() - t0 < TIMEOUT_S + MARGIN_S
