# runs/: runs from outside: start, list, logs, kill, clean, watch.
fiber_sources(runs.c launch.c watch.c)
