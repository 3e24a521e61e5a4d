# wire/: message encoding and strict decoding; no I/O.
fiber_sources(wire.c wire_obj.c wire_stats.c)
