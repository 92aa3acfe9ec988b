"""The simulation as SimPy processes: engine replicas running the live StepLoop in virtual time,
the arrivals (open loop) or the clients of sessions (closed loop), the front door and a router."""
