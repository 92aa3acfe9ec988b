"""Step-time cost models: features, the model structures (linear, trees, recorded, roofline), host
timing and launch, the profiled ranges, what a simulation asks of a model (``EngineTiming``), and
the shipped models (cost_models/)."""
