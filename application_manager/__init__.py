"""The Application Manager (thesis ch. 4, §5.3): manifests, SLOs, profiling, the Pareto model,
SLO-driven execution."""
