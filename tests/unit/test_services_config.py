"""Configuration layering and coercion (services.config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from services import config as cfg
from services.config import ConfigError


@dataclass
class Sample:
    address: str = "127.0.0.1:1"
    workers: int = 4
    ratio: float = 0.5
    debug: bool = False
    filters: list[str] = field(default_factory=lambda: ["a"])
    ports: list[int] = field(default_factory=list)
    weighers: dict[str, float] = field(default_factory=lambda: {"pack": 1.0})
    labels: dict[str, str] = field(default_factory=dict)
    limit: float | None = None


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "harness.yaml"
    p.write_text(text)
    return str(p)


def test_defaults_when_nothing_is_given() -> None:
    assert cfg.load(Sample, "svc", environ={}) == Sample()


def test_precedence_defaults_yaml_env_set(tmp_path: Path) -> None:
    path = write(tmp_path, "svc:\n  workers: 8\n  ratio: 0.75\n  address: yaml:1\nother:\n  anything: 1\n")
    env = {"HARNESS_SVC_WORKERS": "16", "HARNESS_SVC_ADDRESS": "env:2"}
    c = cfg.load(Sample, "svc", config_file=path, environ=env, overrides={"address": "flag:3"})
    assert c.address == "flag:3"   # --set beats env and YAML
    assert c.workers == 16         # env beats YAML
    assert c.ratio == 0.75         # YAML beats the default
    assert c.debug is False        # default
    # without the flag, env wins; without env, YAML wins
    assert cfg.load(Sample, "svc", config_file=path, environ=env).address == "env:2"
    assert cfg.load(Sample, "svc", config_file=path, environ={}).address == "yaml:1"


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = write(tmp_path, "svc:\n  workers: 9\n")
    assert cfg.load(Sample, "svc", environ={"HARNESS_CONFIG": path}).workers == 9


def test_none_override_is_ignored() -> None:
    c = cfg.load(Sample, "svc", environ={"HARNESS_SVC_WORKERS": "3"}, overrides={"workers": None})
    assert c.workers == 3


def test_other_sections_and_variables_are_ignored(tmp_path: Path) -> None:
    path = write(tmp_path, "crs:\n  bogus: 1\nsvc:\n")
    c = cfg.load(Sample, "svc", config_file=path, environ={"HARNESS_CRS_BOGUS": "1", "PATH": "/bin"})
    assert c == Sample()


def test_unknown_yaml_key_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "svc:\n  workrs: 8\n")
    with pytest.raises(ConfigError) as info:
        cfg.load(Sample, "svc", config_file=path, environ={})
    assert "svc.workrs" in str(info.value) and "workers" in str(info.value)


def test_unknown_env_key_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        cfg.load(Sample, "svc", environ={"HARNESS_SVC_DEBUGG": "1"})
    assert "HARNESS_SVC_DEBUGG" in str(info.value) and "svc.debugg" in str(info.value)


def test_unknown_set_key_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        cfg.load(Sample, "svc", environ={}, overrides={"nope": "1"})
    assert "nope" in str(info.value) and "known" in str(info.value)


def test_bad_yaml_shapes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mapping of sections"):
        cfg.load(Sample, "svc", config_file=write(tmp_path, "- a\n- b\n"), environ={})
    with pytest.raises(ConfigError, match="must be a mapping"):
        cfg.load(Sample, "svc", config_file=write(tmp_path, "svc: [1, 2]\n"), environ={})
    # an empty file is fine
    assert cfg.load(Sample, "svc", config_file=write(tmp_path, ""), environ={}) == Sample()


@pytest.mark.parametrize(("text", "value"), [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("0", False), ("false", False), ("No", False), ("off", False),
])
def test_bool_coercion_from_strings(text: str, value: bool) -> None:
    assert cfg.load(Sample, "svc", environ={"HARNESS_SVC_DEBUG": text}).debug is value
    assert cfg.load(Sample, "svc", environ={}, overrides={"debug": text}).debug is value


def test_bool_rejects_other_strings() -> None:
    with pytest.raises(ConfigError) as info:
        cfg.load(Sample, "svc", environ={"HARNESS_SVC_DEBUG": "maybe"})
    assert "expected bool" in str(info.value) and "maybe" in str(info.value)


def test_yaml_native_types(tmp_path: Path) -> None:
    path = write(tmp_path, "svc:\n  debug: true\n  filters: [x, y]\n  weighers: {spread: 2, topology: 0.5}\n"
                           "  ports: ['80', 443]\n  limit: 3\n")
    c = cfg.load(Sample, "svc", config_file=path, environ={})
    assert c.debug is True
    assert c.filters == ["x", "y"]
    assert c.weighers == {"spread": 2.0, "topology": 0.5}
    assert all(isinstance(v, float) for v in c.weighers.values())
    assert c.ports == [80, 443]
    assert c.limit == 3.0 and isinstance(c.limit, float)


def test_list_from_comma_separated_string() -> None:
    c = cfg.load(Sample, "svc", environ={"HARNESS_SVC_FILTERS": "a, b,,c "},
                 overrides={"ports": "1,2"})
    assert c.filters == ["a", "b", "c"]
    assert c.ports == [1, 2]
    assert cfg.load(Sample, "svc", environ={}, overrides={"filters": ""}).filters == []


def test_dict_from_pairs() -> None:
    c = cfg.load(Sample, "svc", environ={"HARNESS_SVC_WEIGHERS": "a=1,b=2.5"},
                 overrides={"labels": "zone = east , tier=gold"})
    assert c.weighers == {"a": 1.0, "b": 2.5}
    assert c.labels == {"zone": "east", "tier": "gold"}


def test_lists_and_mappings_as_the_yaml_file_writes_them_from_set_or_the_environment() -> None:
    # `--set filters=[capacity,x]` (README's YAML form) was taken as the names '[capacity' and 'x]'.
    c = cfg.load(Sample, "svc", environ={"HARNESS_SVC_WEIGHERS": "{pack: 1.0, mylab.w:W: 2}"},
                 overrides={"filters": "[capacity, mylab.filters:Drain]", "ports": "[1, 2]"})
    assert c.filters == ["capacity", "mylab.filters:Drain"]
    assert c.ports == [1, 2]
    assert c.weighers == {"pack": 1.0, "mylab.w:W": 2.0}
    with pytest.raises(ConfigError, match="filters: '\\[a, \\[b\\]' is not a YAML list"):
        cfg.load(Sample, "svc", environ={}, overrides={"filters": "[a, [b]"})


def test_dict_rejects_a_pair_without_equals() -> None:
    with pytest.raises(ConfigError, match="name=value"):
        cfg.load(Sample, "svc", environ={}, overrides={"weighers": "a=1,b"})


def test_dict_value_type_errors_name_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        cfg.load(Sample, "svc", environ={}, overrides={"weighers": "a=x"})
    assert "weighers.a" in str(info.value) and "expected float" in str(info.value)


def test_number_coercion_errors() -> None:
    with pytest.raises(ConfigError, match="expected int"):
        cfg.load(Sample, "svc", environ={"HARNESS_SVC_WORKERS": "four"})
    with pytest.raises(ConfigError, match="expected float"):
        cfg.load(Sample, "svc", environ={}, overrides={"ratio": "half"})
    with pytest.raises(ConfigError, match="expected a list"):
        cfg.load(Sample, "svc", environ={}, overrides={"filters": 5})
    with pytest.raises(ConfigError, match="expected a mapping"):
        cfg.load(Sample, "svc", environ={}, overrides={"weighers": ["a"]})


def test_optional_fields() -> None:
    assert cfg.load(Sample, "svc", environ={"HARNESS_SVC_LIMIT": "2.5"}).limit == 2.5
    assert cfg.load(Sample, "svc", environ={}).limit is None


def test_parse_sets() -> None:
    assert cfg.parse_sets(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}
    with pytest.raises(ConfigError):
        cfg.parse_sets(["novalue"])
    with pytest.raises(ConfigError):
        cfg.parse_sets(["=1"])


def test_real_service_config_loads_from_env() -> None:
    from irm_compute.service import ComputeConfig

    c = cfg.load(ComputeConfig, "compute", environ={"HARNESS_COMPUTE_HEARTBEAT_INTERVAL_S": "0.5",
                                                    "HARNESS_COMPUTE_NAME": "c2"})
    assert c.heartbeat_interval_s == 0.5 and c.name == "c2"


def test_sections_named_for_their_service_or_section_and_nothing_else(tmp_path: Path) -> None:
    from services.catalog import config_sections

    sections = config_sections()
    assert sections["fpga-server"] == sections["fpga_server"] == "fpga_server" and sections["fpga"] == "orchestrator"
    # Named for the service (`harness serve fpga-server`): applied, and its typos caught.
    path = write(tmp_path, "fpga-server:\n  workers: 2\n")
    assert cfg.load(Sample, "fpga_server", config_file=path, environ={}, sections=sections).workers == 2
    with pytest.raises(ConfigError, match="fpga_server.workrs"):
        cfg.load(Sample, "fpga_server", config_file=write(tmp_path, "fpga-server:\n  workrs: 2\n"), environ={},
                 sections=sections)
    # A section nobody reads is an error, not silence; two names for one section too.
    with pytest.raises(ConfigError, match=r"unknown section\(s\) \['fpga_servr'\]"):
        cfg.load(Sample, "crs", config_file=write(tmp_path, "fpga_servr:\n  devices: 2\n"), environ={},
                 sections=sections)
    with pytest.raises(ConfigError, match="name the same section"):
        cfg.load(Sample, "orchestrator", config_file=write(tmp_path, "fpga: {}\norchestrator: {}\n"), environ={},
                 sections=sections)


def test_the_app_managers_default_address_is_the_suites_am_port() -> None:
    from application_manager.service import AppManagerConfig
    from services.suite import DEFAULT_PORTS

    assert AppManagerConfig().address == f"127.0.0.1:{DEFAULT_PORTS['am']}"


# -- files that cannot be read or parsed, addresses: a ConfigError naming what to fix, not a traceback -----

def test_a_missing_config_file_is_named_with_where_its_name_came_from(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=f"cannot read config file {missing}: No such file or directory"):
        cfg.load(Sample, "svc", config_file=missing, environ={})
    with pytest.raises(ConfigError, match=f"cannot read HARNESS_CONFIG file {missing}: No such file"):
        cfg.load(Sample, "svc", environ={"HARNESS_CONFIG": missing})
    with pytest.raises(ConfigError, match="cannot read config file .*: Is a directory"):
        cfg.load(Sample, "svc", config_file=str(tmp_path), environ={})


def test_malformed_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "svc:\n  workers: 8\n  filters: [a, b\n")
    with pytest.raises(ConfigError) as info:
        cfg.load(Sample, "svc", config_file=path, environ={})
    message = str(info.value)
    assert message.startswith(f"config file {path} is not valid YAML: line 4, column 1: ")
    assert message.endswith("(while parsing a flow sequence at line 3)") and "\n" not in message
    with pytest.raises(ConfigError, match=r"line 2, column 13: mapping values are not allowed here"):
        cfg.load(Sample, "svc", config_file=write(tmp_path, "svc:\n  workers: 8: 9\n"), environ={})


def test_a_config_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    path = tmp_path / "harness.yaml"
    path.write_bytes(b"svc:\n  workers: \xff\xfe\n")
    with pytest.raises(ConfigError, match=f"cannot read config file {path}: not UTF-8 text"):
        cfg.load(Sample, "svc", config_file=str(path), environ={})


@pytest.mark.parametrize("address", ["127.0.0.1:50051", "0.0.0.0:0", "localhost:65535", "[::1]:50051", "[::]:0",
                                     "agent:50071"])
def test_host_port_addresses_are_taken(address: str) -> None:
    assert cfg.check_address(address) == address


@pytest.mark.parametrize("address", ["localhost", "127.0.0.1:99999", "127.0.0.1:65536", "127.0.0.1:", ":50051",
                                     "127.0.0.1:http", "127.0.0.1:-1", "::1:50051", "[]:1", "127.0.0.1:５００５１"])
def test_other_addresses_are_refused_with_an_example(address: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg.check_address(address)
    assert repr(address) in str(info.value) and "HOST:PORT with PORT in 0..65535" in str(info.value)
    assert "[::1]:50051" in str(info.value)


# -- the compute inventory file (irm_compute.inventory.load) ---------------------------------------------

@pytest.mark.parametrize(("text", "fragment"), [
    ("hosts: [\n", "inventory {path} is not valid YAML: line 2, column 1"),
    ("hosts:\n  - {id: a, cores: 1, memory_gb: 1\n", "inventory {path} is not valid YAML: line 3"),
    ("generate:\n  - 5\n", "inventory {path}: generate[0] must be a mapping"),
    ("generate:\n  - [count, 2]\n", "inventory {path}: generate[0] must be a mapping"),
    ("generate: {count: 2, cores: 1, memory_gb: 1}\n", "inventory {path}: generate must be a list"),
    ("hosts:\n  - a-r1-h1\n", "inventory {path}: hosts[0] must be a mapping"),
    ("hosts: 3\n", "inventory {path}: hosts must be a list"),
    ("generate:\n  - {count: many, cores: 1, memory_gb: 1}\n",
     "inventory {path}: generate[0]: count, sites and racks_per_site must be integers"),
    ("- a\n", "inventory {path}: expected a mapping"),
])
def test_a_bad_inventory_file_is_an_inventory_error_naming_it(tmp_path: Path, text: str, fragment: str) -> None:
    from irm_compute import inventory as inv

    path = tmp_path / "hosts.yaml"
    path.write_text(text)
    with pytest.raises(inv.InventoryError) as info:
        inv.load(str(path))
    assert fragment.format(path=path) in str(info.value) and "\n" not in str(info.value)


def test_a_missing_inventory_file_is_an_inventory_error(tmp_path: Path) -> None:
    from irm_compute import inventory as inv

    with pytest.raises(inv.InventoryError, match="cannot read inventory .*nope.yaml: No such file or directory"):
        inv.load(str(tmp_path / "nope.yaml"))
