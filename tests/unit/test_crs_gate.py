"""PriorityGate: one holder at a time, waiters enter by priority then arrival (cross_resource_scheduler.gate)."""

from __future__ import annotations

import threading

from cross_resource_scheduler.gate import PriorityGate

TIMEOUT = 10.0


def _waiter(gate: PriorityGate, priority: int, name: str, order: list[str], inside: list[int],
            lock: threading.Lock) -> threading.Thread:
    def run() -> None:
        with gate.hold(priority):
            with lock:
                inside[0] += 1
                inside[1] = max(inside[1], inside[0])
                order.append(name)
            with lock:
                inside[0] -= 1

    t = threading.Thread(target=run, name=f"gate-{name}", daemon=True)
    t.start()
    return t


def _run(arrivals: list[tuple[str, int]]) -> tuple[list[str], int]:
    """Hold the gate, queue waiters one after another (in this arrival order), then let them in."""
    gate = PriorityGate()
    order: list[str] = []
    inside = [0, 0]  # current, max concurrently inside
    lock = threading.Lock()
    threads = []
    with gate.hold(0):
        for i, (name, prio) in enumerate(arrivals, start=1):
            threads.append(_waiter(gate, prio, name, order, inside, lock))
            assert gate.wait_for_waiters(i, TIMEOUT), f"waiter {name} never queued"
        assert gate.waiting() == len(arrivals)
        assert order == []  # nobody got in while the gate is held
    for t in threads:
        t.join(TIMEOUT)
        assert not t.is_alive()
    assert gate.waiting() == 0
    return order, inside[1]


def test_high_priority_overtakes_an_earlier_low_priority_waiter() -> None:
    order, _ = _run([("low", 0), ("high", 5)])
    assert order == ["high", "low"]


def test_fifo_among_equal_priorities() -> None:
    order, _ = _run([(f"w{i}", 1) for i in range(6)])
    assert order == [f"w{i}" for i in range(6)]


def test_priority_then_arrival_order_mixed() -> None:
    order, max_inside = _run([("a0", 0), ("b2", 2), ("c1", 1), ("d2", 2), ("e0", 0), ("f-1", -1), ("g1", 1)])
    assert order == ["b2", "d2", "c1", "g1", "a0", "e0", "f-1"]
    assert max_inside == 1  # mutual exclusion


def test_gate_is_reusable_and_released_on_error() -> None:
    gate = PriorityGate()
    try:
        with gate.hold(3):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    done = threading.Event()

    def enter() -> None:
        with gate.hold(0):
            done.set()

    t = threading.Thread(target=enter, daemon=True)
    t.start()
    assert done.wait(TIMEOUT), "the gate stayed closed after an exception inside hold()"
    t.join(TIMEOUT)


def test_wait_for_waiters_times_out_without_waiters() -> None:
    gate = PriorityGate()
    assert gate.wait_for_waiters(1, 0.01) is False
    assert gate.wait_for_waiters(0, 0.01) is True
