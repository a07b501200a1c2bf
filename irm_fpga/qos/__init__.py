"""QoS-driven allocation and elasticity policies for FPGA jobs (issue 5).

Pure policies (no clock reads): `edf` (seed 000 §III-A), `throughput`
(seed 000 §III-B), Hydrogen's algorithms, managed mode and elasticity manager
(seed 001 §IV). `registry.get_policy(name)` selects one by name; `sim` runs
them on virtual time.
"""

from irm_fpga.qos.jobs import DEADLINE, THROUGHPUT, JobProgress, QosJob
from irm_fpga.qos.registry import get_policy

__all__ = ["DEADLINE", "THROUGHPUT", "JobProgress", "QosJob", "get_policy"]
