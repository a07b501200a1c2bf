"""A state directory's suite.json is the suite's only while something holds the directory's lock (`harness up` and
each service it started hold it): one left by a crash or a reboot sent the CLI to dead services, or to another
suite's on the same ports. And a suite whose `harness up` is gone, nothing restarting its services, fails
`harness status`. Here the state directory is made as those cases leave it;
tests/integration/test_review18_suite_killed.py makes it with a real suite and kill -9."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from services import cli, pidlock, suite

ADDRESSES = {"crs": "127.0.0.1:1", "compute": "127.0.0.1:2"}


def _reaped() -> int:
    """The pid of a process that has exited."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.fixture
def left(tmp_path: Path) -> Path:
    """A state directory as a suite leaves it when all its processes are killed: its files, nobody's lock."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "suite.json").write_text(json.dumps(ADDRESSES))
    (state / "processes.json").write_text(json.dumps({"crs": {"pid": _reaped(), "argv": ["harness", "serve"]}}))
    (state / ".lock").write_text(f"{_reaped()}\n")
    return state


@pytest.fixture
def held(left: Path) -> Iterator[Path]:
    """`left`, its lock held as a suite's services hold it (the lock names a `harness up` that is gone)."""
    fd = os.open(left / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield left
    os.close(fd)


def test_a_suite_json_nobody_holds_the_lock_of_is_no_suite_and_is_removed(left: Path) -> None:
    with pytest.raises(suite.NoSuite) as e:
        suite.addresses(str(left))
    assert e.value.message == f"no suite runs from {left}: start one with `harness up`"
    assert not (left / "suite.json").exists() and not (left / "processes.json").exists()
    assert suite.down(str(left)) == f"no suite runs from {left}"


def test_status_says_no_suite_runs_rather_than_checking_the_stale_addresses(left: Path, capsys) -> None:
    assert cli.main(["status", "--state-dir", str(left)]) == 1
    out, err = capsys.readouterr()
    assert f"no suite runs from {left}: start one with `harness up`" in " ".join(err.split())
    assert "UNREACHABLE" not in out and not (left / "suite.json").exists()


def test_the_tls_ca_of_a_suite_that_is_gone_is_not_trusted(left: Path) -> None:
    (left / "tls").mkdir()
    (left / "tls" / suite.TLS_IN_USE).write_text("")
    assert suite.tls_ca(str(left)) is None


def test_while_a_service_holds_the_lock_the_addresses_stand(held: Path) -> None:
    assert suite.addresses(str(held)) == ADDRESSES
    assert (held / "suite.json").exists() and (held / "processes.json").exists()


def test_status_fails_when_the_suites_harness_up_is_gone(held: Path, capsys) -> None:
    expected = (f"the suite's `harness up` (pid {(held / '.lock').read_text().strip()}) has exited: its services "
                f"run unsupervised, and nothing restarts one that exits; run `harness down --state-dir {held}`, "
                "then `harness up`")
    assert suite.unsupervised(str(held)) == expected
    assert cli.main(["status", "--json", "--state-dir", str(held)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["problems"][0] == expected
    assert [s["name"] for s in report["services"]] == list(ADDRESSES)
    assert cli.main(["status", "--state-dir", str(held)]) == 1
    assert f"harness status: {expected}" in capsys.readouterr().err


def test_a_suite_whose_starter_still_holds_the_lock_is_not_unsupervised(tmp_path: Path) -> None:
    # A program that calls `suite.start` itself (as the integration tests do) runs its suite for as long as it lives.
    state = tmp_path / "state"
    state.mkdir()
    (state / "suite.json").write_text(json.dumps(ADDRESSES))
    fd = pidlock.take(state / ".lock")
    try:
        assert suite.unsupervised(str(state)) is None
    finally:
        os.close(fd)


def test_harness_up_waits_out_a_command_that_looks_at_the_lock(tmp_path: Path, monkeypatch) -> None:
    # A command finding no suite holds the lock for an instant while it removes the stale files: a `harness up`
    # starting then must not take that for another suite.
    real, tries = pidlock.take, []

    def take(path: Path) -> int:
        tries.append(path)
        if len(tries) == 1:
            raise pidlock.Held(path, str(_reaped()))
        return real(path)

    monkeypatch.setattr(pidlock, "take", take)
    fd = suite._lock(str(tmp_path))
    os.close(fd)
    assert len(tries) == 2


def test_a_lock_the_file_system_cannot_take_is_not_a_stopped_suite(left: Path, monkeypatch) -> None:
    # On NFS flock of a file open read-only fails (EBADF): not a crash of every command, nor "no suite" (which
    # would remove a running suite's files), but "cannot tell": its suite.json is taken as it is.
    import errno
    import fcntl

    def refuse(fd, op):  # noqa: ANN001, ANN202
        raise OSError(errno.EBADF, "Bad file descriptor")
    monkeypatch.setattr(fcntl, "flock", refuse)
    assert suite._stopped(str(left)) is False
    assert suite.state_file(str(left)).exists()


def test_a_suite_of_a_harness_from_before_the_lock_still_answering_is_seen_and_not_joined(tmp_path: Path) -> None:
    # Upgrade review: a state directory without a lock file whose suite.json's services still answer (a Harness
    # from before the lock, not stopped before the upgrade) was taken for "no suite": `harness up` started a
    # second suite on its databases, migrating them under the running one, and status/down did not see it.
    import socket

    state = tmp_path / "state"
    state.mkdir()
    with socket.socket() as old:
        old.bind(("127.0.0.1", 0))
        old.listen()
        address = f"127.0.0.1:{old.getsockname()[1]}"
        (state / "suite.json").write_text(json.dumps({"crs": "127.0.0.1:1", "compute": address}))
        assert not suite._stopped(str(state))
        assert (state / "suite.json").exists()                     # its addresses kept for status and down
        with pytest.raises(suite.SuiteRunning, match=f"earlier Harness .* still answers at {address}"):
            suite.start(str(state))
        assert not (state / ".lock").exists()                      # nothing started, no lock taken
    # Nothing answers any more: no suite runs there.
    assert suite._stopped(str(state))


def test_harness_down_stops_a_suite_of_a_harness_from_before_the_lock(tmp_path: Path) -> None:
    # Its services recorded in processes.json, no lock file: `down` said "no suite runs" and stopped nothing, while
    # `up` refused (the state directory stuck).
    import subprocess
    import sys

    state = tmp_path / "state"
    state.mkdir()
    code = ("import socket, sys, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
            "print(s.getsockname()[1], flush=True)\ntime.sleep(600)\n")
    argv = [sys.executable, "-c", code]
    old = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        port = int(old.stdout.readline())
        (state / "suite.json").write_text(json.dumps({"crs": f"127.0.0.1:{port}"}))
        (state / "processes.json").write_text(json.dumps({"crs": {"pid": old.pid, "argv": argv}}))
        assert not suite._stopped(str(state))
        said = suite.down(str(state))
        assert said.startswith(f"stopped the services of {state}") and f"crs (pid {old.pid})" in said
        assert old.wait(10) is not None
        assert not (state / "suite.json").exists() and suite._stopped(str(state))
    finally:
        old.kill()
        old.wait()


def test_harness_down_of_a_stale_suite_json_that_something_else_answers_says_what_to_remove(tmp_path: Path) -> None:
    import socket

    state = tmp_path / "state"
    state.mkdir()
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        (state / "suite.json").write_text(json.dumps({"crs": f"127.0.0.1:{other.getsockname()[1]}"}))
        with pytest.raises(suite.SuiteRunning, match="remove .*suite.json"):
            suite.down(str(state), timeout=0.5)
        assert (state / "suite.json").exists()              # not the CLI's to decide: the operator removes it
