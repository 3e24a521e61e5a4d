# backend/docker/: the docker backend: jobs are containers (Engine API), and
# image building.
fiber_sources(runs.c docker.c engine.c elf.c ldso.c pathset.c tar.c image.c)
