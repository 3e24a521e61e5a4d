/*
 * endian.h -- little-endian loads and stores of 16, 32 and 64-bit
 * integers at any alignment: the byte order of every message fiber sends
 * (wire/, the encryption's record lengths in net/secure.c, a ring's
 * rendezvous fields).  Written once, here.
 */
#ifndef FB_ENDIAN_H
#define FB_ENDIAN_H

#include <stdint.h>

static inline void fb_put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void fb_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void fb_put_le64(uint8_t *p, uint64_t v)
{
    fb_put_le32(p, (uint32_t)v);
    fb_put_le32(p + 4, (uint32_t)(v >> 32));
}

static inline uint16_t fb_get_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (unsigned)p[1] << 8);
}

static inline uint32_t fb_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static inline uint64_t fb_get_le64(const uint8_t *p)
{
    return (uint64_t)fb_get_le32(p) | (uint64_t)fb_get_le32(p + 4) << 32;
}

#endif /* FB_ENDIAN_H */
