"""The local back-end's translation of a configuration into a CRS request and a command line."""

from __future__ import annotations

import json

import examples
from application_manager.local import LocalBackend
from application_manager.manifest import parse_manifest
from application_manager.slo import parse_slo
from application_manager.space import from_manifest


def backend(name: str, **params) -> LocalBackend:  # type: ignore[no-untyped-def]
    m = parse_manifest(examples.manifest(name))
    slo = parse_slo(examples.slo(name, **params), m)
    space = from_manifest(m, slo.parameters, {"vm"})
    # The channel is lazy: nothing connects until a call is made.
    return LocalBackend("127.0.0.1:1", "t", m, space, slo.parameters, "/apps/" + name, "/usr/bin/python3", 30)


def test_configuration_becomes_groups_and_argv():
    b = backend("rtm", rows=800, steps=40)
    i = b.space.index({"implementation": "RTM-CPU", "%master_cores": 2, "%master_mem": 512})
    groups, constraints = b.request(b.space.configs[i])
    assert len(groups) == 1 and groups[0].name == "master" and groups[0].resource_type == "vm"
    assert groups[0].attributes["cores"].number == 2 and groups[0].attributes["memory_gb"].number == 0.5
    assert constraints == []
    argv, env = b.argv_env(b.space.configs[i], "production")
    assert argv == ["/usr/bin/python3", "/apps/rtm/app.py", "800", "40"]
    assert env == {"OMP_NUM_THREADS": "2"}
    bench_argv, _ = b.argv_env(b.space.configs[i], "benchmark")
    assert bench_argv[2] == "100"  # the manifest's Benchmark input


def test_fpga_implementation_slot_and_distances():
    raw = json.loads(examples.manifest("option_pricing"))
    m = parse_manifest(raw)
    space = from_manifest(m, {}, {"vm", "vfpga"})  # once an FPGA IRM offers the type
    b = LocalBackend("127.0.0.1:1", "t", m, space, {"%million_options": 1}, "/a", "py", 30)
    i = next(k for k, c in enumerate(space.configs)
             if c["implementation"] == "BlackScholes-FPGA" and c["%fpga_devices"] == 4)
    groups, constraints = b.request(space.configs[i])
    dfe = next(g for g in groups if g.name == "dfe")
    assert dfe.resource_type == "vfpga" and dfe.attributes["design"].text == "black_scholes"
    assert dfe.attributes["devices"].number == 4
    assert [c.expression for c in constraints] == ["hops(host, dfe) <= 4"]
    assert b.argv_env(space.configs[i], "production")[0][-1] == "--fpga"
    assert len(from_manifest(m, {}, {"vm"})) == 6  # today: the CPU implementation only
