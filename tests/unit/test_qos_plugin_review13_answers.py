"""A plug-in's answer reaches the job manager as plain data only (irm_fpga.qos.plugin_worker): nothing the worker
sends is unpickled in the manager, all of a reply arrives within the call's time limit, and a reply longer than an
honest answer for the window's jobs is refused. An answer whose unpickling would sleep or end the process, an
over-long answer, a reply that trickles in or a forged one is the plug-in's PolicyError; the manager goes on.

The plug-ins below are loaded by name in the worker (this module is imported there); each misbehaves when 3 devices
are free and answers FCFS at the minimum otherwise, so a test can check that the runner answers again.
"""

import gc
import os
import pickle
import signal
import struct
import sys
import threading
import time
from multiprocessing.connection import Connection

import pytest

from irm_fpga.qos import dispatch
from irm_fpga.qos.hydrogen import HJob
from irm_fpga.qos.plugin_worker import PluginRunner
from irm_fpga.qos.plugins import PolicyError
from tests.conftest import eventually

HERE = "tests.unit.test_qos_plugin_review13_answers"
QUEUE = [HJob("short", 0.0, 0.5, 1, 2), HJob("long", 0.1, 4.0, 2, 4), HJob("mid", 0.2, 1.0, 1, 1)]
SLEEP_S = 10.0          # what the manager would wait for, without the fix, against a time limit of 1 s
TIMEOUT_S = 1.0
MARGIN_S = 1.0
TEXT_BOUND = 10_000    # characters: a message quoting a plug-in's text (plugins.MAX_TEXT_CHARS of it) stays under it


class SleepsWhenUnpickled:
    """A device count whose unpickling sleeps (in the process that unpickles it)."""

    def __reduce__(self):
        return (time.sleep, (SLEEP_S,))


class ExitsWhenUnpickled:
    """A device count whose unpickling ends the process that unpickles it."""

    def __reduce__(self):
        return (os._exit, (7,))


class SlowInt:
    """A device count that takes SLEEP_S to become an int (and pickles as itself)."""

    def __index__(self):
        time.sleep(SLEEP_S)
        return 1


def first_on_min(queue, available):
    return [(queue[0].job_id, queue[0].min_devices)] if queue and queue[0].min_devices <= available else []


def answers_sleeping_when_unpickled(queue, available, window, cost, *, now):
    return [(queue[0].job_id, SleepsWhenUnpickled())] if available == 3 else first_on_min(queue, available)


def answers_exiting_when_unpickled(queue, available, window, cost, *, now):
    return [(queue[0].job_id, ExitsWhenUnpickled())] if available == 3 else first_on_min(queue, available)


def exits_with_a_code_exiting_when_unpickled(queue, available, window, cost, *, now):
    if available == 3:
        sys.exit(ExitsWhenUnpickled())
    return first_on_min(queue, available)


def answers_slowly_converted(queue, available, window, cost, *, now):
    return [(queue[0].job_id, SlowInt())] if available == 3 else first_on_min(queue, available)


def answers_too_much(queue, available, window, cost, *, now):
    """20,000 (job id, devices) pairs: ~460 kB, ~10x what an answer for the window may take (the manager would
    otherwise unpickle and walk them under its lock)."""
    if available == 3:
        return [(f"job-{i:012d}", 1) for i in range(20_000)]
    return first_on_min(queue, available)


def answers_too_much_slowly_converted(queue, available, window, cost, *, now):
    """As many pairs, each device count taking SLEEP_S to become an int: only refused in time if refused unread."""
    if available == 3:
        return [(f"job-{i:012d}", SlowInt()) for i in range(20_000)]
    return first_on_min(queue, available)


def raises_a_huge_message(queue, available, window, cost, *, now):
    if available == 3:
        raise RuntimeError("x" * 1_000_000)
    return first_on_min(queue, available)


def wrong_signature(queue, *, junk="z" * 1_000_000):
    """Cannot be called as an algorithm; the message saying so quotes its signature (a megabyte)."""
    return []


def _pipe() -> Connection:
    """The worker's end of its pipe (a plug-in owns its process: it can find it and write there itself)."""
    return next(o for o in gc.get_objects() if isinstance(o, Connection) and not o.closed)


def forges_a_pickle(queue, available, window, cost, *, now):
    """Writes, in place of the worker's reply, a pickle whose loading would end the manager."""
    if available == 3:
        _pipe().send_bytes(pickle.dumps(ExitsWhenUnpickled()))
        time.sleep(SLEEP_S)
    return first_on_min(queue, available)


def announces_a_huge_reply(queue, available, window, cost, *, now):
    """Sends 10 MB of its own on the worker's pipe, ahead of the worker's reply."""
    if available == 3:
        _pipe().send_bytes(b"\0" * 10_000_000)
    return first_on_min(queue, available)


def trickles_a_reply(queue, available, window, cost, *, now):
    """Starts a 64-byte reply (its first bytes arrive at once) and sends the rest after SLEEP_S."""
    if available == 3:
        os.write(_pipe().fileno(), struct.pack("!i", 64) + b"\x80")
        time.sleep(SLEEP_S)
    return first_on_min(queue, available)


def stops_its_process_soon(queue, available, window, cost, *, now):
    """Answers, then its process stops (SIGSTOP) and reads no request any more."""
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGSTOP)).start()
    return first_on_min(queue, available)


def starts_all(queue, available, window, cost, *, now):
    return [(j.job_id, 1) for j in queue[:window]]


@pytest.fixture
def runner():
    made = []

    def make(name: str, timeout_s: float = TIMEOUT_S) -> PluginRunner:
        made.append(PluginRunner(f"{HERE}:{name}", timeout_s=timeout_s))
        made[-1].start()
        return made[-1]

    yield make
    for r in made:
        r.close()


def decide(r: PluginRunner, pool: int):
    """The live job manager's decision (dispatch.decide with its PluginRunner), in this process."""
    s = dispatch.scheduler_for(r.name)
    return dispatch.decide(s, QUEUE, now=0.3, pool=pool, pool_max=4, plugin=r).allocation


def timed_refusal(r: PluginRunner, match: str) -> float:
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=match):
        decide(r, 3)
    return time.monotonic() - t0


@pytest.mark.timeout(60)
def test_an_answer_whose_unpickling_sleeps_is_refused_at_once_and_the_worker_goes_on(runner):
    r = runner("answers_sleeping_when_unpickled")
    pid = r.pid
    took = timed_refusal(r, r"failed: its answer cannot be sent back: it returned \[\('short', "
                            r"<.*SleepsWhenUnpickled object .*>\)\] \('short' got <.*> devices: a "
                            r"SleepsWhenUnpickled, not an integer\); expected a list of \(job id, devices\)")
    assert took < TIMEOUT_S + MARGIN_S
    assert decide(r, 2) == [("short", 1)] and r.pid == pid       # a fault reported as data: same worker


@pytest.mark.timeout(60)
def test_converting_an_answer_is_within_the_time_limit(runner):
    r = runner("answers_slowly_converted")
    looping = r.pid
    took = timed_refusal(r, r"did not answer within 1 s .*jobs_plugin_timeout_s")
    assert took < TIMEOUT_S + MARGIN_S
    fresh = eventually(lambda: r.pid, what="the replacement worker")
    assert fresh != looping
    assert decide(r, 2) == [("short", 1)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "match"), [
    ("answers_exiting_when_unpickled", r"cannot be sent back: it returned \[\('short', <.*ExitsWhenUnpickled"),
    ("exits_with_a_code_exiting_when_unpickled", r"called exit\(<.*ExitsWhenUnpickled object at .*>\)"),
], ids=["in-its-answer", "in-its-exit-code"])
def test_an_answer_whose_unpickling_ends_its_process_leaves_the_manager_alive(runner, name, match):
    me = os.getpid()
    r = runner(name)
    pid = r.pid
    timed_refusal(r, match)
    assert os.getpid() == me                   # this test is still running: the manager's process lives
    assert decide(r, 2) == [("short", 1)] and r.pid == pid


@pytest.mark.timeout(60)
def test_a_forged_pickle_on_the_pipe_is_never_loaded(runner):
    r = runner("forges_a_pickle")
    forger = r.pid
    took = timed_refusal(r, r"sent what is not an answer when asked for a decision \(not JSON.*its worker process "
                            r"was stopped")
    assert took < TIMEOUT_S + MARGIN_S
    fresh = eventually(lambda: r.pid, what="the replacement worker")
    assert fresh != forger
    assert decide(r, 2) == [("short", 1)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("plugin", ["answers_too_much",
                                    # each item's device count takes 10 s to become an int: refused unchecked
                                    "answers_too_much_slowly_converted"])
def test_an_over_long_answer_is_the_plug_ins_error_refused_before_its_items_are_checked(runner, plugin):
    r = runner(plugin)
    pid = r.pid
    took = timed_refusal(r, r"returned 20000 items, at least \d+ bytes to send back as \(job id, devices\) pairs; "
                            r"an answer for the first 30 queued jobs takes at most \d+")
    assert took < TIMEOUT_S + MARGIN_S
    assert decide(r, 2) == [("short", 1)] and r.pid == pid


@pytest.mark.timeout(60)
def test_a_reply_announced_longer_than_an_answer_is_refused_unread(runner):
    r = runner("announces_a_huge_reply")
    took = timed_refusal(r, r"announced an answer of 10000000 bytes when asked for a decision, more than an answer "
                            r"for the window's jobs takes \(\d+ bytes\)")
    assert took < TIMEOUT_S + MARGIN_S
    eventually(lambda: r.pid, what="the replacement worker")
    assert decide(r, 2) == [("short", 1)]


@pytest.mark.timeout(60)
def test_a_reply_that_trickles_in_is_bounded_by_the_time_limit(runner):
    r = runner("trickles_a_reply")
    took = timed_refusal(r, r"did not answer within 1 s .*jobs_plugin_timeout_s")
    assert took < TIMEOUT_S + MARGIN_S
    eventually(lambda: r.pid, what="the replacement worker")
    assert decide(r, 2) == [("short", 1)]


@pytest.mark.timeout(60)
def test_sending_a_request_to_a_worker_that_reads_no_more_is_bounded_by_the_time_limit(runner):
    r = runner("stops_its_process_soon")
    assert r(QUEUE, 2, 30, now=0.0) == [("short", 1)]
    stopped = r.pid
    eventually(lambda: open(f"/proc/{stopped}/stat").read().rsplit(")", 1)[1].split()[0] == "T",
               what="the worker stopped")
    big = [HJob(f"job-{i:06d}", float(i), 1.0, 1, 1) for i in range(20_000)]    # megabytes: more than the pipe holds
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match=r"did not answer within 1 s .*jobs_plugin_timeout_s"):
        r(big, 2, 30, now=1.0)
    assert time.monotonic() - t0 < TIMEOUT_S + MARGIN_S
    assert eventually(lambda: r.pid, what="the replacement worker") != stopped


@pytest.mark.timeout(60)
def test_a_plug_ins_texts_come_back_bounded(runner):
    r = runner("raises_a_huge_message")
    with pytest.raises(PolicyError, match="failed: RuntimeError: xxx") as e:
        decide(r, 3)
    assert len(str(e.value)) < TEXT_BOUND
    with pytest.raises(PolicyError, match="cannot be loaded in its worker process: .*must accept .*zzz") as e:
        runner("wrong_signature")
    assert len(str(e.value)) < TEXT_BOUND


def test_an_honest_answer_for_the_whole_window_always_fits(runner):
    # Job ids of characters JSON escapes at the most length (a surrogate pair each), every window job started.
    queue = [HJob(f"{chr(0x1F600) * 200}-{i}", float(i), 1.0, 1, 1) for i in range(30)]
    r = runner("starts_all")
    got = r(queue, 30, 30, now=0.0)
    assert got == [(j.job_id, 1) for j in queue]


class _OwnBase(BaseException):
    pass


@pytest.mark.parametrize("raised", [KeyboardInterrupt, _OwnBase])
def test_a_plug_in_raising_what_is_no_exception_in_process_is_its_policy_error(raised) -> None:
    # In process (the simulator's path without a worker), as live: its PolicyError, not the caller's interrupt.
    # Off the main thread: there a KeyboardInterrupt is the user's Ctrl-C, and goes on as one.
    def policy(queue, free, window, cost, now):  # type: ignore[no-untyped-def]
        raise raised("not an Exception")

    s = dispatch.scheduler_for(f"{HERE}:starts_all")
    got: list[BaseException] = []

    def decide_() -> None:
        try:
            dispatch.decide(s, QUEUE, now=0.3, pool=2, pool_max=4, plugin=policy)
        except BaseException as e:  # noqa: BLE001 - looked at below
            got.append(e)

    t = threading.Thread(target=decide_)
    t.start()
    t.join(10)
    assert len(got) == 1 and isinstance(got[0], PolicyError), got
    assert f"failed: {raised.__name__}" in str(got[0])
    if raised is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            dispatch.decide(s, QUEUE, now=0.3, pool=2, pool_max=4, plugin=policy)
