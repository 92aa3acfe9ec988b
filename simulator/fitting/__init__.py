"""Fitting cost models from logs: the candidates and their selection, calibration to a machine's
level, the front door's intake delay and service time by re-simulation, and the profile sweep's
plan (the step shapes ``minivllm profile`` runs). Apart from simulator/cost because fitting the
front door re-simulates logs (simulator/replay), which prices steps with the cost models."""
