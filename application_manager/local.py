"""The `local` back-end: every run is real (thesis §5.3, steps 2-4).

A configuration becomes a CRS reservation (one group per manifest group, Distances as
constraints between groups); the implementation's Command, with `%var` substituted, runs
through the execution agent of the MASTER group's first VM (confined to its cores and
memory); time is the agent's wall time, cost is the reservation's price per minute (the CRS
quote) x minutes run, utilisation is the agent's samples; the reservation is released
whatever happens. A failed run (non-zero exit, memory limit, timeout) is an observation
with its cost, not an error.
"""

from __future__ import annotations

import logging
import math
import shlex
import uuid
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from application_manager.manifest import Implementation, Manifest, substitute
from application_manager.profilers.base import BENCHMARK, Observation, Proposal
from application_manager.space import IMPLEMENTATION, Space
from harness.v1 import agent_pb2, agent_pb2_grpc, common_pb2, irm_pb2, irm_pb2_grpc
from services import client

log = logging.getLogger(__name__)


@dataclass
class RunDetail:
    observation: Observation
    reservation_id: str = ""
    output_tail: str = ""
    notes: list[str] = field(default_factory=list)


def _attr_value(name: str, value: Any) -> tuple[str, float]:
    key = name.lower()
    if key == "memory":
        return "memory_gb", float(value) / 1024.0
    if key == "frequency":
        return "frequency_ghz", float(value)
    return "cores", float(value)


class LocalBackend:
    def __init__(self, crs_address: str, tenant: str, manifest: Manifest, space: Space,
                 parameters: dict[str, Any], app_dir: str, python: str, timeout_s: float) -> None:
        self.crs = irm_pb2_grpc.ResourceManagerStub(client.channel(crs_address))
        self.tenant = tenant
        self.manifest = manifest
        self.space = space
        self.parameters = dict(parameters)
        self.app_dir = app_dir
        self.python = python
        self.timeout_s = timeout_s
        self.has_benchmark = any(p.benchmark is not None for p in manifest.module.parameters)

    def implementation(self, config: dict[str, Any]) -> Implementation:
        name = config.get(IMPLEMENTATION)
        for impl in self.manifest.module.implementations:
            if impl.name == name:
                return impl
        return self.manifest.module.implementations[0]

    def values(self, config: dict[str, Any], input: str = "production") -> dict[str, Any]:
        impl = self.implementation(config)
        params = dict(self.parameters)
        if input == BENCHMARK:
            for p in self.manifest.module.parameters:
                if p.benchmark is not None:
                    params[p.var] = p.benchmark
        env = {**params, **impl.fixed(), **{k: v for k, v in config.items() if k.startswith("%") and v is not None}}
        env["%python"] = self.python
        env["%app_dir"] = self.app_dir
        return env

    def request(self, config: dict[str, Any]) -> tuple[list[irm_pb2.ResourceGroup], list[irm_pb2.GroupConstraint]]:
        impl = self.implementation(config)
        env = self.values(config)
        groups = []
        for g in impl.groups:
            count = int(env.get(g.instances.var, g.instances.values[0]) if g.instances.var else g.instances.values[0])
            attrs = {}
            for aname, choice in g.attributes.items():
                val = env.get(choice.var, choice.values[0]) if choice.var else choice.values[0]
                if g.type == "vm":
                    key, num = _attr_value(aname, val)
                    attrs[key] = common_pb2.AttributeRequest(number=num)
                elif isinstance(val, int | float):
                    attrs[aname.lower()] = common_pb2.AttributeRequest(number=float(val))
                else:
                    attrs[aname.lower()] = common_pb2.AttributeRequest(text=str(val))
            groups.append(irm_pb2.ResourceGroup(name=g.id, resource_type=g.type, count=count, attributes=attrs))
        constraints = [irm_pb2.GroupConstraint(expression=c) for d in impl.distances for c in d.constraints]
        return groups, constraints

    def quote_per_minute(self, config: dict[str, Any]) -> float:
        groups, constraints = self.request(config)
        return self.crs.QuotePrice(irm_pb2.QuotePriceRequest(tenant=self.tenant, groups=groups,
                                                             constraints=constraints), timeout=10).price_per_minute

    def prices(self) -> np.ndarray:
        """Price per second of every configuration, from CRS quotes (NaN where the CRS cannot quote)."""
        out = np.full(len(self.space), math.nan)
        cache: dict[str, float] = {}
        for i, c in enumerate(self.space.configs):
            groups, _ = self.request(c)
            key = str([g.SerializeToString(deterministic=True) for g in groups])
            if key not in cache:
                try:
                    cache[key] = self.quote_per_minute(c) / 60.0
                except grpc.RpcError as e:
                    log.warning("no quote", extra={"config": self.space.describe(i), "code": str(e.code())})
                    cache[key] = math.nan
            out[i] = cache[key]
        return out

    def argv_env(self, config: dict[str, Any], input: str) -> tuple[list[str], dict[str, str]]:
        impl = self.implementation(config)
        values = self.values(config, input)
        argv = [substitute(a, values) for a in impl.command]
        if impl.execution_args.strip():
            argv += shlex.split(substitute(impl.execution_args, values))
        env = {k: substitute(v, values) for k, v in impl.env.items()}
        if impl.deployment_args:
            env["HARNESS_DEPLOYMENT_ARGS"] = substitute(impl.deployment_args, values)
        return argv, env

    def run(self, proposal: Proposal, *, request_id: str = "", timeout_s: float = 0.0) -> RunDetail:
        config = self.space.configs[proposal.config]
        groups, constraints = self.request(config)
        impl = self.implementation(config)
        rid = request_id or f"am-{uuid.uuid4().hex[:16]}"
        try:
            res = self.crs.Reserve(irm_pb2.ReserveRequest(tenant=self.tenant, request_id=rid, groups=groups,
                                                          constraints=constraints), timeout=60)
        except grpc.RpcError as e:
            return RunDetail(Observation(proposal.config, False, 0.0, 0.0, proposal.input,
                                         error=f"could not reserve: {e.code().name}: {e.details()}"))
        try:
            master = impl.master().id
            vm = next(r for g in res.groups if g.name == master for r in g.resources)
            argv, env = self.argv_env(config, proposal.input)
            env.update(resource_env(self.tenant, res))
            stub = agent_pb2_grpc.ExecutionAgentStub(client.channel(vm.address))
            limit = timeout_s or self.timeout_s
            exited = None
            samples: list[agent_pb2.UtilisationSample] = []
            out = b""
            notes: list[str] = []
            for ev in stub.Execute(agent_pb2.ExecuteRequest(tenant=self.tenant, vm_id=vm.id, argv=argv, env=env,
                                                            timeout_s=limit), timeout=limit + 60):
                kind = ev.WhichOneof("event")
                if kind in ("stdout", "stderr"):
                    out = (out + getattr(ev, kind))[-4000:]
                elif kind == "sample":
                    samples.append(ev.sample)
                elif kind == "started":
                    notes = list(ev.started.notes)
                elif kind == "exited":
                    exited = ev.exited
            if exited is None:
                raise RuntimeError("the agent's stream ended without an exit status")
            minutes = exited.wall_time_s / 60.0
            # A replaying agent knows what the measured run cost; a live run costs its reservation.
            cost = exited.replayed_cost or res.price_per_minute * minutes
            ok = exited.exit_code == 0 and not exited.reason
            tail = out.decode(errors="replace").strip()
            error = ""
            if not ok:
                last = tail.splitlines()[-1] if tail else ""
                error = exited.reason or f"exit code {exited.exit_code}" + (f": {last}" if last else "")
            mem = max((s.memory_percent for s in samples), default=None)
            if exited.reason and "memory" in exited.reason:
                mem = max(mem or 0.0, 100.0)
            cpu = exited.mean_cpu_percent if samples else None
            return RunDetail(Observation(proposal.config, ok, exited.wall_time_s, cost, proposal.input, cpu, mem, error),
                             res.id, tail[-2000:], notes)
        except grpc.RpcError as e:
            return RunDetail(Observation(proposal.config, False, 0.0, 0.0, proposal.input,
                                         error=f"could not run: {e.code().name}: {e.details()}"), res.id)
        finally:
            try:
                self.crs.ReleaseReservation(irm_pb2.ReleaseReservationRequest(tenant=self.tenant,
                                                                              reservation_id=res.id), timeout=30)
            except grpc.RpcError as e:
                log.warning("release failed", extra={"reservation": res.id, "code": str(e.code())})


def resource_env(tenant: str, res: irm_pb2.Reservation) -> dict[str, str]:
    """What the application learns of its reservation: per group, the resource ids and addresses.

    HARNESS_TENANT, HARNESS_GROUP_<GROUPID>_IDS (comma-separated) and
    HARNESS_GROUP_<GROUPID>_ADDRESSES; for a virtual FPGA the id is the FPGA
    group to attach to and the address the Orchestrator.
    """
    env = {"HARNESS_TENANT": tenant}
    for g in res.groups:
        key = "".join(ch if ch.isalnum() else "_" for ch in g.name).upper()
        ids = [r.id for r in g.resources]
        addrs = [r.address for r in g.resources]
        prev_ids = env.get(f"HARNESS_GROUP_{key}_IDS")
        env[f"HARNESS_GROUP_{key}_IDS"] = ",".join(([prev_ids] if prev_ids else []) + ids)
        prev = env.get(f"HARNESS_GROUP_{key}_ADDRESSES")
        env[f"HARNESS_GROUP_{key}_ADDRESSES"] = ",".join(([prev] if prev else []) + addrs)
    return env
