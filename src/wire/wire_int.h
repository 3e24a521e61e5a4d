/*
 * wire_int.h -- what the encoders and decoders of wire/ (wire.c,
 * wire_obj.c, wire_stats.c) share and nothing else uses.
 */
#ifndef FB_WIRE_INT_H
#define FB_WIRE_INT_H

#include <stddef.h>

#include "fiber/fiber.h"

/* Writes a decoding failure (printf-style) into err when the caller gave
 * room for it (errlen > 0) and into the thread's last error, and returns
 * FIBER_EPROTO. */
int fb_wire_fail(char *err, size_t errlen, const char *fmt, ...)
    FIBER_PRINTF(3, 4);

#endif /* FB_WIRE_INT_H */
