"""A recorded log read back: timing-replay (its decisions re-timed by a cost model), execute-replay
(its batches run again on any executor, through ``LoggedPolicy``), re-simulation of its workload,
and the per-request times of a run."""
