"""What `harness serve fpga` configures the Orchestrator with (irm_fpga.orchestrator), and its FpgaJobs service."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.tls import TlsSettings


@dataclass
class OrchestratorConfig(TlsSettings):
    address: str = "127.0.0.1:50091"
    name: str = "fpga"
    database: str = ""
    state_dir: str = "~/.harness"
    # FPGA-server addresses (comma-separated in env/--set).
    servers: list[str] = field(default_factory=lambda: ["127.0.0.1:50081"])
    # Sent with every call to the FPGA-servers, whose `control_token` must match (services.control); a
    # WatchCapacity without a tenant that sends it (the CRS's) takes a control-plane slot.
    control_token: str = ""
    # Tenants and their tokens' digests (services.tenants): a call naming a tenant must carry its token, or the
    # delegation token of the services acting for tenants (the CRS, the AM), checked against `delegation_sha256`.
    # Empty: any caller may name any tenant (development).
    tenants_file: str = ""
    # The SHA-256 of the CRS's and the AM's delegation_token ("sha256:<hex>"; `harness tenant delegation`): never
    # the token itself, which would let whoever reads this service's settings act for every tenant.
    delegation_sha256: str = ""
    site: str = "site-a"
    rack: str = "rack-fpga"
    crs_address: str = ""
    advertise_address: str = ""
    heartbeat_interval_s: float = 2.0
    # Price of one device per minute (an FPGA-equipped instance, roughly).
    price_per_device_minute: float = 0.05
    # Autoscaler for elastic groups: a policy name from irm_fpga.autoscaler
    # ("thesis", "improved", "static"), or "none".
    autoscaler: str = "improved"
    autoscaler_interval_s: float = 10.0
    server_timeout_s: float = 10.0
    # A server that hangs (a stopped process, a partition; not one that refuses connections) would cost every
    # call its server_timeout_s: once a call to it timed out, calls to it fail at once (UNAVAILABLE) for this
    # long, then one call tries it again (irm_fpga.server_breaker); each try that fails doubles the wait, up to
    # server_backoff_max_s. 0: no breaker.
    server_backoff_s: float = 2.0
    server_backoff_max_s: float = 30.0
    # How often every FPGA-server is made to hold what the database says (a server that restarted came back
    # empty; a delete that could not reach one left its part there). 0: only at start.
    reconcile_interval_s: float = 5.0
    # QoS job manager (harness.v1.FpgaJobs): "edf" | "throughput" (seed 000 §III), or a Hydrogen
    # scheduler (seed 001: "fcfs_min", ..., "managed_deadline", "managed_lookahead"; irm_fpga.jobs).
    jobs_policy: str = "edf"
    jobs_control_period_s: float = 1.0
    jobs_alpha: float = 0.5
    # Hydrogen policies: window, start-latency bound, the managed modes' elastic pool (0: all) and beta.
    jobs_window: int = 30
    jobs_late_after_s: float = 1.0
    jobs_pool_min: int = 1
    jobs_pool_max: int = 0
    jobs_beta: float = 2.5
    # managed_lookahead: seconds one dispatching decision may search (registrations wait for it).
    jobs_lookahead_budget_s: float = 0.25
    # A plug-in scheduling algorithm (module:function) runs in a process of its own and answers each decision
    # within this (else its process is killed and the queue waits for the next decision).
    jobs_plugin_timeout_s: float = 1.0
    # Jobs of one tenant waiting in a Hydrogen ready queue at once; one more RegisterJob is RESOURCE_EXHAUSTED.
    jobs_max_queued_per_tenant: int = 1000
    # A server holding job groups silent longer than this is taken as gone by the job manager (irm_fpga.jobs).
    jobs_silent_server_s: float = 60.0
