# ring/: fiber_ring and its rendezvous.
fiber_sources(ring_rdv.c ring.c)
