"""The CRS's `topology_file` setting: the links between its sites and racks (latency, bandwidth), read into the
TopologyModel placement weighs distances with. Anything the file says that would not be a link (a typo'd key, an
ambiguous rack) is refused at start-up, in one line naming the file and what to fix.
"""

from __future__ import annotations

from collections import defaultdict

from cross_resource_scheduler.topology import TopologyModel
from harness.v1 import common_pb2
from services.config import ConfigError, known_keys, mapping_list, read_yaml

_TOPOLOGY_KEYS = ("links",)
_LINK_KEYS = ("a", "b", "latency_ms", "bandwidth_gbps")


def load_topology(path: str, topology: TopologyModel) -> None:
    """The links of the YAML file `path` ({links: [{a, b, latency_ms, bandwidth_gbps}, ...]}); ValueError,
    one line naming the file and what to fix, for anything else (a typo'd key would be a link lost)."""
    data = read_yaml(path, "topology_file", ValueError)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"topology_file {path}: expected a mapping with 'links' (a list of "
                         f"{{a, b, latency_ms, bandwidth_gbps}}), got a {type(data).__name__}")
    where = f"topology_file {path}"
    known_keys(data, _TOPOLOGY_KEYS, where, ValueError)
    links = mapping_list(data, "links", where, "{a, b, latency_ms, bandwidth_gbps}", ValueError)
    # Racks named with their site anywhere in the file: a bare name of one of them would be ambiguous (it
    # applies to the racks of that name in every site).
    sites_of: dict[str, set[str]] = defaultdict(set)
    for link in links:
        for side in ("a", "b"):
            site, sep, rack = str(link.get(side, "")).partition("/")
            if sep:
                sites_of[rack].add(site)
    for i, link in enumerate(links):
        for side in ("a", "b"):
            name = str(link.get(side, ""))
            if "/" not in name and name in sites_of:
                qualified = ", ".join(f"{site}/{name}" for site in sorted(sites_of[name]))
                raise ConfigError(
                    f"{where}: links[{i}].{side}: rack {name!r} is ambiguous: this file names it with its "
                    f"site elsewhere ({qualified}), and a bare rack name applies to the racks of that name in "
                    "every site; write it as site/rack here too")
        known_keys(link, _LINK_KEYS, f"{where}: links[{i}]", ValueError)
        try:
            topology.add_link(common_pb2.Link(a=str(link["a"]), b=str(link["b"]),
                                                   latency_ms=float(link.get("latency_ms", 0)),
                                                   bandwidth_gbps=float(link.get("bandwidth_gbps", 0))))
        except KeyError as e:
            raise ValueError(f"topology_file {path}: links[{i}]: missing {e.args[0]}") from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"topology_file {path}: links[{i}]: {e}") from None
