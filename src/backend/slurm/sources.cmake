# backend/slurm/: the slurm backend: jobs are Slurm jobs.
fiber_sources(runs.c slurm.c tool.c)
