/*
 * runs.c -- the slurm backend's run ops (backend/runops.h).  For now only
 * describe (fiber doctor); the other ops are NULL, so fiber run, ps, logs,
 * kill and clean answer FIBER_ENOTSUP for slurm.  (A placeholder: the
 * slurm run ops replace this file.)
 */
#include "backend/runops.h"
#include "backend/slurm/slurm.h"

const struct fb_run_ops fb_run_ops_slurm = {
    .name = "slurm",
    .describe = fb_slurm_describe,
};
