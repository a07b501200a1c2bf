"""Distances between physical resources: hops, latency and bandwidth.

The default model is a tree (host - rack switch - site core - WAN): two
resources on the same host are 0 hops apart, in the same rack 2, in the same
site 4, in different sites 6. Latency and bandwidth per level are settings,
and explicit links (from configuration or IRMs' discovery) override a level
for a pair of racks or sites. A rack of a link is named by itself ("r1": the
racks of that name in every site) or with its site ("site-a/r1": that site's).
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
    # (node a, node b) -> overriding link, as configured: a node is a site, a rack ("r1": that rack name in
    # every site) or a rack of one site ("site-a/r1").
    links: dict[tuple[str, str], common_pb2.Link] = field(default_factory=dict)
    # ((site, rack), (site, rack)) -> the link between two racks of one site named with their site.
    site_racks: dict[tuple[tuple[str, str], tuple[str, str]], common_pb2.Link] = field(default_factory=dict)

    def add_link(self, link: common_pb2.Link) -> None:
        """Add (or replace) a link. A side "site/rack" names a rack of one site: both sides must then be racks
        of the same site (between sites, links join sites). ValueError saying what to fix otherwise."""
        qualified = [side for side in (link.a, link.b) if "/" in side]
        if qualified:
            if len(qualified) != 2:
                raise ValueError(f"link {link.a!r} - {link.b!r}: name both racks as site/rack, or neither")
            (sa, _, ra), (sb, _, rb) = link.a.partition("/"), link.b.partition("/")
            if not (sa and ra and sb and rb) or "/" in ra or "/" in rb:
                raise ValueError(f"link {link.a!r} - {link.b!r}: a rack of one site is named site/rack, "
                                 "both non-empty")
            if sa != sb:
                raise ValueError(f"link {link.a!r} - {link.b!r}: racks of different sites; a link between "
                                 f"sites joins the sites ({sa!r} - {sb!r})")
            self.site_racks[((sa, ra), (sb, rb))] = link
            self.site_racks[((sb, rb), (sa, ra))] = link
        self.links[(link.a, link.b)] = link
        self.links[(link.b, link.a)] = link

    def distance(self, a: common_pb2.Location, b: common_pb2.Location) -> Distance:
        return self.distance_between((a.site, a.rack, a.host), (b.site, b.rack, b.host))

    def distance_between(self, a: tuple[str, str, str], b: tuple[str, str, str]) -> Distance:
        """The distance between two locations given as (site, rack, host)."""
        a_site, a_rack, a_host = a
        b_site, b_rack, b_host = b
        if a_host and a_host == b_host and a_site == b_site:
            return self.same_host
        if a_site == b_site and a_rack == b_rack and a_rack:
            return self.same_rack
        if a_site == b_site:
            base = self.same_site
            link = (self.site_racks.get(((a_site, a_rack), (b_site, b_rack))) if self.site_racks else None) \
                or self.links.get((a_rack, b_rack))
        else:
            base, link = self.cross_site, self.links.get((a_site, b_site))
        if link is None:
            return base
        return Distance(base.hops, link.latency_ms or base.latency_ms, link.bandwidth_gbps or base.bandwidth_gbps)

    def level_links(self) -> list[common_pb2.Link]:
        return list({(min(k), max(k)): v for k, v in self.links.items()}.values())

    @property
    def max_hops(self) -> int:
        return self.cross_site.hops
