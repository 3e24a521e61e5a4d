# net/: sockets, framing, encryption, the gate, the listener.
fiber_sources(settings.c sock.c conn.c secure.c gate.c listener.c)
