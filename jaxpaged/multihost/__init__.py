"""Multi-host serving on jax.distributed: one process per host, process 0 leads, the others follow.

Process 0 tokenizes, schedules and serves HTTP. Before each step it broadcasts the step's padded, fixed-shape
plan (which data-parallel rank, which bucket, the bucket's StepInputs) over JAX's own collectives; every process
then runs the same compiled step on its shards. Followers serve nothing and never schedule: one scheduler, so
nothing can drift. See runtime.py (joining the job), step_plan.py (the broadcast), watchdog.py (bounded
waits), leader.py and follower.py (the two roles).
"""
