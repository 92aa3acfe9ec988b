"""Capacity planning: many simulations of one workload, one per point of a grid of engine and fleet
settings and loads (``sweep``), or as many as a bisection needs to find the highest load that meets
latency SLOs, or the fewest replicas that carry a load (``search``). The points run as tasks on Ray
(``ray_runner``) or in this process (``local_runner``); each point's metrics are cached by what
decides them (``cache``), so an interrupted sweep resumes and a repeated one costs nothing.

Layer: above the simulator and the analysis (it runs the one and summarizes with the other), below
the CLI; never imports torch, the executor, serving or the benchmarks.
"""
