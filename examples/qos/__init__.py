"""Scheduling algorithms written outside `irm_fpga`, as a researcher would: see `longest_first`."""
