"""Distances between physical resources: hops, latency and bandwidth.

The default model is a tree (host - rack switch - site core - WAN): two
resources on the same host are 0 hops apart, in the same rack 2, in the same
site 4, in different sites 6. Latency and bandwidth per level are settings,
and explicit links (from configuration or IRMs' discovery) override a level
for a pair of racks or sites.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.v1 import common_pb2


@dataclass(frozen=True)
class Distance:
    hops: int
    latency_ms: float
    bandwidth_gbps: float


@dataclass
class TopologyModel:
    same_host: Distance = Distance(0, 0.0, 1000.0)
    same_rack: Distance = Distance(2, 0.05, 10.0)
    same_site: Distance = Distance(4, 0.2, 10.0)
    cross_site: Distance = Distance(6, 5.0, 1.0)
    # (node a, node b) -> overriding link, where a node is a rack or site name.
    links: dict[tuple[str, str], common_pb2.Link] = field(default_factory=dict)

    def add_link(self, link: common_pb2.Link) -> None:
        self.links[(link.a, link.b)] = link
        self.links[(link.b, link.a)] = link

    def distance(self, a: common_pb2.Location, b: common_pb2.Location) -> Distance:
        if a.host and a.host == b.host and a.site == b.site:
            return self.same_host
        if a.site == b.site and a.rack == b.rack and a.rack:
            return self.same_rack
        if a.site == b.site:
            base, key = self.same_site, (a.rack, b.rack)
        else:
            base, key = self.cross_site, (a.site, b.site)
        link = self.links.get(key)
        if link is None:
            return base
        return Distance(base.hops, link.latency_ms or base.latency_ms, link.bandwidth_gbps or base.bandwidth_gbps)

    def level_links(self) -> list[common_pb2.Link]:
        return list({(min(k), max(k)): v for k, v in self.links.items()}.values())

    @property
    def max_hops(self) -> int:
        return self.cross_site.hops
