"""Compute IRM: physical hosts, custom-shape VMs, cost model, execution agents."""
