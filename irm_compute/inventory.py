"""The physical hosts a compute IRM manages, from YAML or an embedded default.

YAML shape:

    hosts:
      - id: a-r1-h1
        site: site-a
        rack: r1
        cores: 32
        memory_gb: 128
        frequency_ghz: 2.2
        traits: [ssd, avx512]
        agent: 127.0.0.1:50071      # optional; else the IRM's default agent
    # or generate many alike:
    generate:
      - count: 100
        prefix: h
        sites: 2
        racks_per_site: 5
        cores: 16
        memory_gb: 64
        frequency_ghz: 2.4
        traits: [ssd]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from services.config import known_keys, mapping_list, read_yaml


@dataclass(frozen=True)
class HostSpec:
    id: str
    site: str
    rack: str
    cores: int
    memory_mb: int
    frequency_ghz: float
    traits: tuple[str, ...] = ()
    agent: str = ""


@dataclass
class Inventory:
    hosts: list[HostSpec] = field(default_factory=list)


class InventoryError(ValueError):
    pass


HOST_KEYS = ("id", "site", "rack", "cores", "memory_gb", "frequency_ghz", "traits", "agent")
GENERATE_KEYS = ("count", "sites", "racks_per_site", "prefix", "site_prefix", "cores", "memory_gb", "frequency_ghz",
                 "traits", "agent")
TOP_KEYS = ("hosts", "generate")
# Cores and MiB are stored as the database's integers (32-bit on PostgreSQL).
MAX_UNITS = 2**31 - 1


def _known(entry: dict, keys: tuple[str, ...], where: str) -> None:
    known_keys(entry, keys, where, InventoryError)


def _host(entry: dict, where: str, default_agent: str) -> HostSpec:
    traits = entry.get("traits") or []
    if not isinstance(traits, list | tuple):
        raise InventoryError(f"{where}: traits must be a list (e.g. traits: [ssd, avx512]), got {traits!r}")
    try:
        given = {"cores": entry["cores"], "memory_gb": entry["memory_gb"],
                 "frequency_ghz": entry.get("frequency_ghz", 2.2)}
        for key, value in given.items():
            # YAML's .inf and .nan: an infinite size has no whole number of MiB, and a host of NaN or infinite
            # frequency would price its VMs so.
            if not math.isfinite(float(value)):
                raise InventoryError(f"{where}: {key} must be a finite number, got {value!r}")
        cores = int(given["cores"])
        memory_mb = int(round(float(given["memory_gb"]) * 1024))
        freq = float(given["frequency_ghz"])
    except KeyError as e:
        raise InventoryError(f"{where}: missing {e.args[0]}") from None
    except InventoryError:
        raise
    except (TypeError, ValueError) as e:
        raise InventoryError(f"{where}: {e}") from None
    if cores < 1 or memory_mb < 1 or freq <= 0:
        raise InventoryError(f"{where}: cores, memory_gb and frequency_ghz must be positive")
    if cores > MAX_UNITS or memory_mb > MAX_UNITS:
        raise InventoryError(f"{where}: at most {MAX_UNITS} cores and {MAX_UNITS // 1024} GB of memory a host")
    return HostSpec(
        id=str(entry.get("id") or ""),
        site=str(entry.get("site", "site-a")),
        rack=str(entry.get("rack", "rack-1")),
        cores=cores,
        memory_mb=memory_mb,
        frequency_ghz=freq,
        traits=tuple(sorted(str(t) for t in traits)),
        agent=str(entry.get("agent", default_agent)),
    )


def _entries(data: dict, key: str, where: str) -> list[dict]:
    """`data[key]`, a list of mappings: anything else would fail later with no word of where."""
    return mapping_list(data, key, where, "{cores: 16, memory_gb: 64}", InventoryError)


def _generated(gen: dict, i: int, where: str, default_agent: str) -> list[HostSpec]:
    try:
        count = int(gen.get("count", 1))
        sites = max(1, int(gen.get("sites", 1)))
        racks = max(1, int(gen.get("racks_per_site", 1)))
    except (TypeError, ValueError, OverflowError) as e:     # OverflowError: .inf
        raise InventoryError(f"{where}: generate[{i}]: count, sites and racks_per_site must be integers ({e})") \
            from None
    prefix = str(gen.get("prefix", f"g{i}-h"))
    site_prefix = str(gen.get("site_prefix", "site-"))
    _known(gen, GENERATE_KEYS, f"{where}: generate[{i}]")
    hosts = []
    for n in range(count):
        site = n % sites
        rack = (n // sites) % racks
        entry = dict(gen, id=f"{prefix}{n}", site=f"{site_prefix}{site}", rack=f"rack-{site}-{rack}")
        hosts.append(_host(entry, f"{where}: generate[{i}]", default_agent))
    return hosts


def from_dict(data: dict, default_agent: str = "", where: str = "inventory") -> Inventory:
    _known(data, TOP_KEYS, where)
    hosts: list[HostSpec] = []
    for i, entry in enumerate(_entries(data, "hosts", where)):
        _known(entry, HOST_KEYS, f"{where}: hosts[{i}]")
        h = _host(entry, f"{where}: hosts[{i}]", default_agent)
        if not h.id:
            raise InventoryError(f"{where}: hosts[{i}]: missing id")
        hosts.append(h)
    for i, gen in enumerate(_entries(data, "generate", where)):
        hosts.extend(_generated(gen, i, where, default_agent))
    seen: set[str] = set()
    for h in hosts:
        if h.id in seen:
            raise InventoryError(f"{where}: duplicate host id {h.id!r}")
        seen.add(h.id)
    if not hosts:
        raise InventoryError(f"{where}: no hosts")
    return Inventory(hosts)


def load(path: str | Path | None, default_agent: str = "") -> Inventory:
    if not path:
        return default(default_agent)
    data = read_yaml(path, "inventory", InventoryError) or {}
    if not isinstance(data, dict):
        raise InventoryError(f"inventory {path}: expected a mapping with 'hosts' or 'generate'")
    return from_dict(data, default_agent, f"inventory {path}")


def default(agent: str = "") -> Inventory:
    """A small embedded datacenter: one site, two racks, mixed host shapes."""
    return from_dict(
        {
            "hosts": [
                {"id": "r1-h1", "rack": "rack-1", "cores": 16, "memory_gb": 64, "frequency_ghz": 2.2, "traits": ["ssd"]},
                {"id": "r1-h2", "rack": "rack-1", "cores": 16, "memory_gb": 64, "frequency_ghz": 2.2, "traits": ["ssd"]},
                {"id": "r1-h3", "rack": "rack-1", "cores": 20, "memory_gb": 128, "frequency_ghz": 2.2, "traits": ["ssd", "avx512"]},
                {"id": "r2-h1", "rack": "rack-2", "cores": 8, "memory_gb": 32, "frequency_ghz": 3.0, "traits": ["high-frequency"]},
                {"id": "r2-h2", "rack": "rack-2", "cores": 8, "memory_gb": 32, "frequency_ghz": 3.0, "traits": ["high-frequency"]},
                {"id": "r2-h3", "rack": "rack-2", "cores": 32, "memory_gb": 256, "frequency_ghz": 2.0, "traits": ["ssd", "large-memory"]},
            ]
        },
        agent,
        "embedded default inventory",
    )
