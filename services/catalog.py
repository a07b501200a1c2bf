"""Every service Harness can run, by name, imported lazily.

`harness serve NAME` and `harness up` read this table; a later service adds
one line here and one in services.launcher's suite.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceEntry:
    name: str
    # Section of the YAML config and prefix of HARNESS_<SECTION>_* variables.
    section: str
    module: str
    config_class: str
    factory: str = "component"

    def load(self):  # type: ignore[no-untyped-def]
        mod = importlib.import_module(self.module)
        return getattr(mod, self.config_class), getattr(mod, self.factory)


SERVICES: dict[str, ServiceEntry] = {
    e.name: e
    for e in [
        ServiceEntry("crs", "crs", "cross_resource_scheduler.service", "CrsConfig"),
        ServiceEntry("compute", "compute", "irm_compute.service", "ComputeConfig"),
        ServiceEntry("agent", "agent", "irm_compute.agent", "AgentConfig"),
        ServiceEntry("fpga-server", "fpga_server", "irm_fpga.server", "FpgaServerConfig"),
        ServiceEntry("fpga", "orchestrator", "irm_fpga.orchestrator", "OrchestratorConfig"),
        ServiceEntry("am", "am", "application_manager.service", "AppManagerConfig"),
    ]
}


def config_sections() -> dict[str, str]:
    """Every top-level name a config file may use -> its section: a service's name or its section's."""
    return {**{e.section: e.section for e in SERVICES.values()}, **{e.name: e.section for e in SERVICES.values()}}
