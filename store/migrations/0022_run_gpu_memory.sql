-- What a run's GPU memory says (issue #44). `peak_gpu_mib`: the most GPU
-- memory the run held, as fvd's pytest plugin measured it (NULL: unknown:
-- no CUDA, no plugin, or an older worker; never 0 for unknown).
-- `next_gpu_mib`: what the component's later runs ask for after this run,
-- bounded by the GPU it ran on: the peak with headroom for a finished run,
-- the ask doubled for one that ran out of memory while it shared its GPU
-- (`shared_oom`). NULL: the run says nothing. A run is queued asking for
-- what its component's recorded runs say, so a restart keeps it.
ALTER TABLE jobs ADD COLUMN peak_gpu_mib INTEGER;
ALTER TABLE jobs ADD COLUMN next_gpu_mib INTEGER;
