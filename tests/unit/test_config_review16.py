"""`harness serve` with HARNESS_HOME set keeps a service's state there (state_dir; the agent's work_dir in its
`agent` directory), as the CLI looks for it there; any other source (config file, HARNESS_<SECTION>_<FIELD>,
--set) still overrides it. Before, a service started by hand wrote into ~/.harness, the default suite's."""

from __future__ import annotations

import pytest

from services import config as cfg
from services.catalog import SERVICES, config_sections


def load(service: str, environ: dict[str, str], **settings: str) -> object:
    entry = SERVICES[service]
    return cfg.load(entry.load()[0], entry.section, environ=environ, overrides=settings, sections=config_sections())


@pytest.mark.parametrize("service", ["crs", "compute", "fpga", "am"])
def test_harness_home_is_the_state_dir_unless_another_source_says(service, tmp_path):
    home = str(tmp_path / "home")
    assert load(service, {"HARNESS_HOME": home}).state_dir == home
    assert load(service, {}).state_dir == "~/.harness"
    section = SERVICES[service].section.upper()
    env = {"HARNESS_HOME": home, f"HARNESS_{section}_STATE_DIR": "/from/env"}
    assert load(service, env).state_dir == "/from/env"
    assert load(service, {"HARNESS_HOME": home}, state_dir="/from/set").state_dir == "/from/set"


def test_harness_home_holds_the_agents_work_dir(tmp_path):
    home = str(tmp_path / "home")
    assert load("agent", {"HARNESS_HOME": home}).work_dir == f"{home}/agent"
    assert load("agent", {"HARNESS_HOME": home}, work_dir="/w").work_dir == "/w"
