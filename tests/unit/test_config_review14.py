"""Settings that would break a service are refused at start-up, naming the setting, its value and what is expected
(services.config.check_settings, as `harness serve` loads them, and each service's own checks for configs built
in-process); documented meanings of 0 are kept. And a database error at start-up is told apart: one this
configuration cannot use (exit 2) from one that may pass (exit 3)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from cross_resource_scheduler.service import Crs, CrsConfig
from irm_compute.agent import Agent, AgentConfig
from irm_fpga import orchestrator as orch_mod
from irm_fpga.orchestrator import Orchestrator, OrchestratorConfig
from services import cli
from services import config as cfg
from services.catalog import SERVICES, config_sections
from services.config import ConfigError


def load(service: str, **settings: str) -> object:
    """The config `harness serve SERVICE --set k=v ...` builds (no file, no environment)."""
    entry = SERVICES[service]
    return cfg.load(entry.load()[0], entry.section, environ={}, overrides=settings, sections=config_sections())


# -- refused: waits and deadlines of 0 or less, negative seconds, impossible pairs, an empty server list ------------
@pytest.mark.parametrize("service, settings, fragments", [
    # The reviewer's: IRMs flapping down and up, a first reserve DEADLINE_EXCEEDED, a busy loop, no device at all.
    ("crs", {"heartbeat_timeout_s": "1"},
     ["crs.heartbeat_timeout_s = 1.0: expected more than heartbeat_interval_s (2.0)", "marked down between two"]),
    ("crs", {"heartbeat_timeout_s": "2", "heartbeat_interval_s": "2"}, ["crs.heartbeat_timeout_s = 2.0"]),
    ("crs", {"irm_timeout_s": "0"}, ["crs.irm_timeout_s = 0.0: expected seconds, more than 0", "a deadline"]),
    ("fpga", {"autoscaler_interval_s": "0"},
     ["orchestrator.autoscaler_interval_s = 0.0: expected seconds, more than 0", "back to back"]),
    ("fpga", {"server_timeout_s": "0"}, ["orchestrator.server_timeout_s = 0.0: expected seconds, more than 0"]),
    ("fpga", {"servers": ""}, ["orchestrator.servers = []: expected at least one FPGA-server address"]),
    # The same trap elsewhere.
    ("fpga", {"jobs_control_period_s": "0"}, ["orchestrator.jobs_control_period_s = 0.0: expected seconds, more"]),
    ("fpga", {"jobs_plugin_timeout_s": "-1"}, ["orchestrator.jobs_plugin_timeout_s = -1.0: expected seconds, more"]),
    ("fpga", {"servers": "localhost"}, ["orchestrator.servers: address 'localhost': expected HOST:PORT"]),
    ("agent", {"compute_timeout_s": "0"}, ["agent.compute_timeout_s = 0.0: expected seconds, more than 0"]),
    ("am", {"run_timeout_s": "0"}, ["am.run_timeout_s = 0.0: expected seconds, more than 0"]),
    # 0 means something there; less than 0 does not.
    ("fpga", {"reconcile_interval_s": "-1"},
     ["orchestrator.reconcile_interval_s = -1.0: expected seconds, 0 or more (0: no reconcile rounds"]),
    ("agent", {"vm_check_interval_s": "-0.5"}, ["agent.vm_check_interval_s = -0.5: expected seconds, 0 or more (0: "]),
    ("fpga", {"server_backoff_s": "-1"}, ["orchestrator.server_backoff_s = -1.0: expected seconds, 0 or more"]),
    ("fpga", {"jobs_silent_server_s": "-1"}, ["orchestrator.jobs_silent_server_s = -1.0: expected seconds, 0 or"]),
    ("crs", {"delegation_wait_s": "-1"}, ["crs.delegation_wait_s = -1.0: expected seconds, 0 or more"]),
    ("crs", {"in_doubt_horizon_s": "-5"}, ["crs.in_doubt_horizon_s = -5.0: expected seconds, 0 or more"]),
    ("fpga-server", {"reconfig_mean_s": "-1"}, ["fpga_server.reconfig_mean_s = -1.0: expected seconds, 0 or more"]),
])
def test_a_setting_that_would_break_the_service_is_refused_naming_it(service: str, settings: dict[str, str],
                                                                    fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        load(service, **settings)
    message = str(e.value)
    assert all(f in message for f in fragments), message
    assert "\n" not in message


@pytest.mark.parametrize("service, settings", [
    ("fpga", {"reconcile_interval_s": "0"}),            # documented: no reconcile rounds, only at start
    ("fpga", {"server_backoff_s": "0", "server_backoff_max_s": "0"}),     # documented: no breaker
    ("fpga", {"jobs_silent_server_s": "0", "jobs_lookahead_budget_s": "0", "jobs_late_after_s": "0"}),
    ("fpga", {"autoscaler": "none"}),
    ("agent", {"vm_check_interval_s": "0"}),            # documented: the VM confirmed on every Execute
    ("crs", {"delegation_wait_s": "0", "in_doubt_horizon_s": "0"}),
    ("crs", {"heartbeat_interval_s": "0.2", "heartbeat_timeout_s": "1"}),
    ("fpga-server", {"reconfig_mean_s": "0", "reconfig_std_s": "0"}),
])
def test_documented_zeros_and_sound_values_are_still_taken(service: str, settings: dict[str, str]) -> None:
    conf = load(service, **settings)
    for key, value in settings.items():
        got = getattr(conf, key)
        assert got == (float(value) if isinstance(got, float) else value)


# -- the services' own checks: configs built in-process, as tests and embedders do ------------------------------------
def test_the_crs_refuses_a_heartbeat_timeout_not_above_its_interval_and_a_zero_irm_timeout(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"crs.heartbeat_timeout_s = 1: expected more than heartbeat_interval_s"):
        Crs(CrsConfig(state_dir=str(tmp_path), heartbeat_interval_s=2, heartbeat_timeout_s=1))
    with pytest.raises(ConfigError, match=r"crs.irm_timeout_s = 0: expected seconds, more than 0"):
        Crs(CrsConfig(state_dir=str(tmp_path), irm_timeout_s=0))
    # Taken as 1 further on: the operator's 0 would have been silently another setting.
    for name in ("place_attempts", "max_delegations_per_manager"):
        with pytest.raises(ConfigError, match=rf"crs.{name} = 0: expected a whole number, 1 or more"):
            Crs(CrsConfig(state_dir=str(tmp_path), **{name: 0}))
    assert not list(tmp_path.iterdir()), "refused before its database was made"


def test_the_orchestrator_refuses_a_zero_autoscaler_interval_and_server_timeout(tmp_path: Path) -> None:
    base = {"database": f"sqlite:///{tmp_path / 'o.db'}", "servers": []}
    for name in ("autoscaler_interval_s", "server_timeout_s", "heartbeat_interval_s"):
        with pytest.raises(ConfigError, match=rf"orchestrator.{name} = 0: expected seconds, more than 0"):
            Orchestrator(OrchestratorConfig(**base, **{name: 0}))
    assert not (tmp_path / "o.db").exists(), "refused before its database was made"


def test_the_fpga_irm_component_refuses_no_servers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"orchestrator.servers = \[\]: expected at least one FPGA-server"):
        orch_mod.component(OrchestratorConfig(database=f"sqlite:///{tmp_path / 'o.db'}", servers=[]))
    assert not (tmp_path / "o.db").exists()


def test_the_agent_refuses_a_zero_compute_timeout_and_keeps_a_zero_vm_check(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"agent.compute_timeout_s = 0: expected seconds, more than 0"):
        Agent(AgentConfig(work_dir=str(tmp_path), compute_timeout_s=0), None)  # type: ignore[arg-type]
    Agent(AgentConfig(work_dir=str(tmp_path), vm_check_interval_s=0), None)  # type: ignore[arg-type]


# -- database errors at start-up: what to fix (2) or what may pass (3) ------------------------------------------------
def _driver_error(path: Path, *, locked: bool) -> sqlite3.Error:
    """A real sqlite3 error: a lock another connection holds, or a file that is no database."""
    if locked:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN EXCLUSIVE")
        try:
            sqlite3.connect(path, timeout=0).execute("SELECT * FROM t")
        except sqlite3.Error as e:
            return e
        finally:
            holder.close()
    path.write_bytes(b"no database " * 100)
    try:
        sqlite3.connect(path).execute("PRAGMA journal_mode=WAL")
    except sqlite3.Error as e:
        return e
    raise AssertionError("sqlite3 raised nothing")


def test_a_locked_sqlite_database_is_retryable_and_a_file_that_is_no_database_is_not(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'crs.db'}"
    locked = OperationalError("SELECT", {}, _driver_error(tmp_path / "crs.db", locked=True))
    status, message = cli.database_problem(locked, url, "state_dir")
    assert status == 3 and "the database did not answer: database is locked" in message
    assert str(tmp_path / "crs.db") in message
    notadb = OperationalError("PRAGMA", {}, _driver_error(tmp_path / "other.db", locked=False))
    status, message = cli.database_problem(notadb, f"sqlite:///{tmp_path / 'other.db'}", "database")
    assert status == 2
    assert message == f"the SQLite database {tmp_path / 'other.db'} cannot be used: file is not a database; fix database"


def test_a_broken_schema_at_start_up_is_a_traceback_not_a_database_that_did_not_answer(tmp_path) -> None:
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from services.cli import database_problem

    url = f"sqlite:///{tmp_path}/x.db"
    broken = sqlite3.OperationalError("duplicate column name: request_hash")
    broken.sqlite_errorcode = sqlite3.SQLITE_ERROR                # type: ignore[attr-defined]
    assert database_problem(OperationalError("ALTER TABLE", {}, broken), url, "database") == (None, "")
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = sqlite3.SQLITE_BUSY                   # type: ignore[attr-defined]
    status, line = database_problem(OperationalError("BEGIN", {}, busy), url, "database")
    assert status == 3 and "a later start may succeed" in line
