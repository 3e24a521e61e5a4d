# base/: buffers, errors, logging, clocks, threads: used by every layer.
fiber_sources(error.c buf.c util.c thread.c log.c)
