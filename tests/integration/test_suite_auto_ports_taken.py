"""`harness up --auto-ports` when a port it chose free is taken before its service listens there: the suite
starts again on other ports instead of failing (another process on a busy machine binds it meanwhile)."""

from __future__ import annotations

import json
import socket

import pytest

from services import suite as suite_mod
from services.launcher import LaunchError


@pytest.fixture
def listening():
    """A port another process listens on (held by this test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _first_port_taken(monkeypatch, taken: int, times: int = 1, at: int = 0) -> list[int]:
    """The suite's choice of a free port answers `taken` at its `at`-th call and the `times` - 1 after it (as if
    another process bound it right after the check), really free ports otherwise. Returns the ports it handed
    out."""
    real = suite_mod._free_port
    handed: list[int] = []

    def free_port() -> int:
        handed.append(taken if at <= len(handed) < at + times else real())
        return handed[-1]

    monkeypatch.setattr(suite_mod, "_free_port", free_port)
    return handed


def test_a_port_taken_before_its_service_listens_is_chosen_again(tmp_path, monkeypatch, listening):
    state = str(tmp_path / "state")
    _first_port_taken(monkeypatch, listening)
    procs = suite_mod.start(state, auto_ports=True)
    try:
        addrs = {p.name: p.address for p in procs}
        assert all(p.alive() for p in procs) and len(procs) == len(suite_mod.DEFAULT_PORTS)
        assert f"127.0.0.1:{listening}" not in addrs.values()
        # What `harness down` and the CLI read names the services that run, on the ports they hold.
        recorded = json.loads(suite_mod.processes_file(state).read_text())
        assert {name: v["pid"] for name, v in recorded.items()} == {p.name: p.proc.pid for p in procs}
        assert json.loads(suite_mod.state_file(state).read_text()) == addrs
    finally:
        suite_mod.stop(procs)


def test_a_later_service_whose_port_was_taken_starts_the_started_ones_again_on_the_new_plan(tmp_path, monkeypatch,
                                                                                           listening):
    # The agent's port (the third service started) taken: the CRS and the compute IRM already run, wired to the
    # old plan (the compute IRM to the agent's address), so they are stopped and started again with the new one.
    state = str(tmp_path / "state")
    order = list(suite_mod.DEFAULT_PORTS)
    _first_port_taken(monkeypatch, listening, at=order.index("agent"))
    first: list[int] = []
    procs = suite_mod.start(state, auto_ports=True, on_started=lambda p: first.append(p.proc.pid))
    try:
        assert all(p.alive() for p in procs) and len(procs) == len(order)
        addrs = {p.name: p.address for p in procs}
        assert addrs["agent"] != f"127.0.0.1:{listening}"
        # The compute IRM now runs wired to the agent's new address (its command line names it).
        compute = next(p for p in procs if p.name == "compute")
        assert any(addrs["agent"] in arg for arg in compute.proc.args)
        # Each started once more after the failed plan's (its crs and compute were stopped, not kept).
        assert len(first) == len(order) + 2 and {p.proc.pid for p in procs}.isdisjoint(first[:2])
        recorded = json.loads(suite_mod.processes_file(state).read_text())
        assert {name: v["pid"] for name, v in recorded.items()} == {p.name: p.proc.pid for p in procs}
    finally:
        suite_mod.stop(procs)


def test_ports_taken_at_every_attempt_fail_saying_so(tmp_path, monkeypatch, listening):
    state = str(tmp_path / "state")
    handed = _first_port_taken(monkeypatch, listening, times=10**6)
    with pytest.raises(LaunchError, match="could not listen on"):
        suite_mod.start(state, auto_ports=True)
    # One plan per attempt, each stopped: nothing left running, the state directory free again.
    assert handed.count(listening) >= suite_mod.PORT_ATTEMPTS
    assert not suite_mod.processes_file(state).exists()
    assert suite_mod._stopped(state)


def test_a_port_the_operator_set_is_not_replaced(tmp_path, monkeypatch, listening):
    # An address the operator chose (config) is theirs to fix: the start fails on it at once.
    state = str(tmp_path / "state")
    conf = tmp_path / "harness.yaml"
    conf.write_text(f"crs:\n  address: 127.0.0.1:{listening}\n")
    handed = _first_port_taken(monkeypatch, listening, times=0)
    with pytest.raises(LaunchError, match=f"could not listen on 127.0.0.1:{listening}"):
        suite_mod.start(state, auto_ports=True, config_file=str(conf))
    assert not suite_mod.processes_file(state).exists() and suite_mod._stopped(state)
    assert len(handed) == len(suite_mod.DEFAULT_PORTS)      # one plan: no second attempt
