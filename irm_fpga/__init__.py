"""FPGA IRM, pure core: the implementation library of designs (`designs`), the
emulated FPGA-server state machine (`engine`), the autoscaling policies
(`autoscaler`) and the discrete-event simulations that reproduce thesis
chapter 3 (`sim`). Nothing here speaks gRPC, touches a database or reads the
time by itself: time comes from an injected `services.clock.Clock` or from the
simulation's own virtual time, so the same code runs live and simulated.
"""
