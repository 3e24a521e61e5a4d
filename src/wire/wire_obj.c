/*
 * wire_obj.c -- encoding and strict decoding of the shared-blob messages
 * (OBJ_GET, OBJ_DATA, OBJ_FROM, OBJ_NONE, OBJ_HAVE, OBJ_BAD, OBJ_FILE,
 * OBJ_AT, OBJ_DROP, OBJ_CALL; wire.h has
 * their layouts).  No I/O.  Like wire.c, every decoder checks each length
 * against what is there, each string against its rule, and rejects
 * trailing bytes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "base/endian.h"
#include "wire/wire.h"
#include "wire/wire_int.h"

static int frame(fiber_buf *out, unsigned type, int32_t code, uint64_t id,
                 const void *a, size_t an, const void *b, size_t bn);

/* 0 when s[0, n) is an address by wire.h's rule, else why not in why. */
static int addr_problem(const char *s, size_t n, char *why, size_t size)
{
    if (n < 5 || n > FB_WIRE_ADDR_MAX) {
        snprintf(why, size, "length %zu is outside 5..%u", n,
                 FB_WIRE_ADDR_MAX);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] < 0x21 || (uint8_t)s[i] > 0x7e) {
            snprintf(why, size, "byte %zu (0x%02x) is not printable ASCII", i,
                     (uint8_t)s[i]);
            return -1;
        }
    if (strncmp(s, "unix:", 5) != 0 && strncmp(s, "tcp:", 4) != 0) {
        snprintf(why, size, "starts with neither unix: nor tcp:");
        return -1;
    }
    return 0;
}

int fb_wire_get_obj_get(const uint8_t *p, size_t len, const uint8_t **ref,
                        char *err, size_t errlen)
{
    if (len != FB_WIRE_REF_LEN)
        return fb_wire_fail(err, errlen, "OBJ_GET payload: %zu bytes, a ref is %u",
                    len, FB_WIRE_REF_LEN);
    *ref = p;
    return 0;
}

static int path_problem(const char *s, size_t n, char *why, size_t size)
{
    if (n < 2 || n > 4095 || s[0] != '/') {
        snprintf(why, size, "not an absolute path of 2..4095 bytes");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] < 0x21 || (uint8_t)s[i] > 0x7e) {
            snprintf(why, size, "byte %zu (0x%02x) is not printable ASCII", i,
                     (uint8_t)s[i]);
            return -1;
        }
    return 0;
}

int fb_wire_get_obj_file(const uint8_t *p, size_t len, const char **path,
                         uint32_t *path_len, char *err, size_t errlen)
{
    char why[128];
    if (path_problem((const char *)p, len, why, sizeof why))
        return fb_wire_fail(err, errlen, "OBJ_FILE path: %s", why);
    *path = (const char *)p;
    *path_len = (uint32_t)len;
    return 0;
}

int fb_wire_put_obj_file(fiber_buf *out, uint64_t id, const char *path)
{
    char why[128];
    if (path_problem(path, strlen(path), why, sizeof why))
        return fb_err(FIBER_EINVAL, "OBJ_FILE path: %s", why);
    return frame(out, FB_MSG_OBJ_FILE, 0, id, path, strlen(path), NULL, 0);
}

int fb_wire_get_obj_at(const uint8_t *p, size_t len, uint64_t *offset,
                       const char **path, uint32_t *path_len, char *err,
                       size_t errlen)
{
    char why[128];
    if (len < 8)
        return fb_wire_fail(err, errlen, "OBJ_AT offset: truncated: needs 8 "
                            "bytes, %zu left", len);
    if (path_problem((const char *)p + 8, len - 8, why, sizeof why))
        return fb_wire_fail(err, errlen, "OBJ_AT path: %s", why);
    *offset = fb_get_le64(p);
    *path = (const char *)p + 8;
    *path_len = (uint32_t)(len - 8);
    return 0;
}

int fb_wire_put_obj_at(fiber_buf *out, uint64_t id, uint64_t offset,
                       const char *path)
{
    char why[128];
    if (path_problem(path, strlen(path), why, sizeof why))
        return fb_err(FIBER_EINVAL, "OBJ_AT path: %s", why);
    uint8_t off[8];
    fb_put_le64(off, offset);
    return frame(out, FB_MSG_OBJ_AT, 0, id, off, sizeof off, path,
                 strlen(path));
}

int fb_wire_get_obj_drop(const uint8_t *p, size_t len, const uint8_t **ref,
                         char *err, size_t errlen)
{
    if (len != FB_WIRE_REF_LEN)
        return fb_wire_fail(err, errlen, "OBJ_DROP payload: %zu bytes, a ref "
                            "is %u", len, FB_WIRE_REF_LEN);
    *ref = p;
    return 0;
}

int fb_wire_put_obj_drop(fiber_buf *out, const uint8_t ref[FB_WIRE_REF_LEN])
{
    return frame(out, FB_MSG_OBJ_DROP, 0, 0, ref, FB_WIRE_REF_LEN, NULL, 0);
}

int fb_wire_get_obj_call(const uint8_t *p, size_t len, const uint8_t **ref,
                         char *err, size_t errlen)
{
    if (len != 0 && len != FB_WIRE_REF_LEN)
        return fb_wire_fail(err, errlen, "OBJ_CALL payload: %zu bytes, neither "
                    "empty nor a ref (%u)", len, FB_WIRE_REF_LEN);
    *ref = len ? p : NULL;
    return 0;
}

int fb_wire_get_obj_data(const uint8_t *p, size_t len,
                         struct fb_msg_obj_data *m, char *err, size_t errlen)
{
    if (len < 8)
        return fb_wire_fail(err, errlen, "OBJ_DATA offset: truncated: needs 8 bytes, "
                    "%zu left", len);
    m->offset = fb_get_le64(p);
    m->bytes = p + 8;
    m->len = (uint32_t)(len - 8);
    return 0;
}

int fb_wire_get_obj_from(const uint8_t *p, size_t len, const char **addr,
                         uint32_t *addr_len, char *err, size_t errlen)
{
    char why[128];
    if (addr_problem((const char *)p, len, why, sizeof why))
        return fb_wire_fail(err, errlen, "OBJ_FROM address: %s", why);
    *addr = (const char *)p;
    *addr_len = (uint32_t)len;
    return 0;
}

int fb_wire_get_obj_none(int32_t code, const uint8_t *p, size_t len,
                         struct fb_msg_text *m, char *err, size_t errlen)
{
    if (code >= 0)
        return fb_wire_fail(err, errlen, "OBJ_NONE code: %d is not a failure code",
                    (int)code);
    if (len > FB_WIRE_TEXT_MAX)
        return fb_wire_fail(err, errlen, "OBJ_NONE text: %zu bytes, at most %u", len,
                    FB_WIRE_TEXT_MAX);
    if (len && memchr(p, '\0', len))
        return fb_wire_fail(err, errlen, "OBJ_NONE text: holds a NUL byte");
    m->text = (const char *)p;
    m->len = (uint32_t)len;
    return 0;
}

/* Reads "u16 n | bytes[n]" at *at as an address (or nothing, when
 * may_be_empty and n == 0). */
static int take_addr(const char *msg, const char *field, const uint8_t *p,
                     size_t len, size_t *at, int may_be_empty,
                     const char **s, uint16_t *n, char *err, size_t errlen)
{
    if (len - *at < 2)
        return fb_wire_fail(err, errlen, "%s %s: truncated length", msg, field);
    *n = fb_get_le16(p + *at);
    *at += 2;
    if (*n > len - *at)
        return fb_wire_fail(err, errlen, "%s %s: truncated: needs %u bytes, %zu left",
                    msg, field, *n, len - *at);
    *s = (const char *)p + *at;
    *at += *n;
    char why[128];
    if (*n == 0 && may_be_empty)
        return 0;
    if (addr_problem(*s, *n, why, sizeof why))
        return fb_wire_fail(err, errlen, "%s %s: %s", msg, field, why);
    return 0;
}

static int get_have(const char *msg, int with_from, const uint8_t *p,
                    size_t len, struct fb_msg_obj_have *m, char *err,
                    size_t errlen)
{
    memset(m, 0, sizeof *m);
    if (len < FB_WIRE_REF_LEN)
        return fb_wire_fail(err, errlen, "%s ref: truncated: needs %u bytes, %zu left",
                    msg, FB_WIRE_REF_LEN, len);
    m->ref = p;
    size_t at = FB_WIRE_REF_LEN;
    int rc = take_addr(msg, "address", p, len, &at, 0, &m->addr, &m->addr_len,
                       err, errlen);
    if (rc == 0 && with_from)
        rc = take_addr(msg, "from", p, len, &at, 1, &m->from, &m->from_len,
                       err, errlen);
    if (rc == 0 && at != len)
        rc = fb_wire_fail(err, errlen, "%s payload: %zu trailing bytes", msg,
                  len - at);
    return rc;
}

int fb_wire_get_obj_have(const uint8_t *p, size_t len,
                         struct fb_msg_obj_have *m, char *err, size_t errlen)
{
    return get_have("OBJ_HAVE", 1, p, len, m, err, errlen);
}

int fb_wire_get_obj_bad(const uint8_t *p, size_t len,
                        struct fb_msg_obj_have *m, char *err, size_t errlen)
{
    return get_have("OBJ_BAD", 0, p, len, m, err, errlen);
}

int fb_wire_check_obj(const struct fb_wire_hdr *h, const uint8_t *p,
                      char *err, size_t errlen)
{
    const uint8_t *ref;
    struct fb_msg_obj_data d;
    struct fb_msg_text t;
    struct fb_msg_obj_have hv;
    const char *a;
    uint32_t an;
    switch (h->type) {
    case FB_MSG_OBJ_GET:
        return fb_wire_get_obj_get(p, h->len, &ref, err, errlen);
    case FB_MSG_OBJ_DATA:
        return fb_wire_get_obj_data(p, h->len, &d, err, errlen);
    case FB_MSG_OBJ_FROM:
        return fb_wire_get_obj_from(p, h->len, &a, &an, err, errlen);
    case FB_MSG_OBJ_NONE:
        return fb_wire_get_obj_none(h->code, p, h->len, &t, err, errlen);
    case FB_MSG_OBJ_HAVE:
        return fb_wire_get_obj_have(p, h->len, &hv, err, errlen);
    case FB_MSG_OBJ_BAD:
        return fb_wire_get_obj_bad(p, h->len, &hv, err, errlen);
    case FB_MSG_OBJ_CALL:
        return fb_wire_get_obj_call(p, h->len, &ref, err, errlen);
    case FB_MSG_OBJ_FILE:
        return fb_wire_get_obj_file(p, h->len, &a, &an, err, errlen);
    case FB_MSG_OBJ_AT: {
        uint64_t off;
        return fb_wire_get_obj_at(p, h->len, &off, &a, &an, err, errlen);
    }
    case FB_MSG_OBJ_DROP:
        return fb_wire_get_obj_drop(p, h->len, &ref, err, errlen);
    }
    return 1;
}

/* ---- encoding ------------------------------------------------------------ */

static int frame(fiber_buf *out, unsigned type, int32_t code, uint64_t id,
                 const void *a, size_t an, const void *b, size_t bn)
{
    struct fb_wire_hdr h = {.type = (uint8_t)type, .code = code, .id = id,
                            .len = (uint32_t)(an + bn)};
    uint8_t hdr[FB_WIRE_HDR_LEN];
    fb_wire_hdr_encode(hdr, &h);
    size_t start = out->len;
    int rc = fiber_buf_reserve(out, sizeof hdr + an + bn);
    if (rc == 0)
        rc = fiber_buf_append(out, hdr, sizeof hdr);
    if (rc == 0 && an)
        rc = fiber_buf_append(out, a, an);
    if (rc == 0 && bn)
        rc = fiber_buf_append(out, b, bn);
    if (rc)
        out->len = start;
    return rc;
}

int fb_wire_put_obj_get(fiber_buf *out, uint64_t id,
                        const uint8_t ref[FB_WIRE_REF_LEN])
{
    return frame(out, FB_MSG_OBJ_GET, 0, id, ref, FB_WIRE_REF_LEN, NULL, 0);
}

int fb_wire_put_obj_call(fiber_buf *out, const uint8_t *ref)
{
    return frame(out, FB_MSG_OBJ_CALL, 0, 0, ref, ref ? FB_WIRE_REF_LEN : 0,
                 NULL, 0);
}

int fb_wire_put_obj_data_hdr(fiber_buf *out, uint64_t id, uint64_t offset,
                             uint32_t len)
{
    struct fb_wire_hdr h = {.type = FB_MSG_OBJ_DATA, .id = id, .len = 8 + len};
    uint8_t b[FB_WIRE_HDR_LEN + 8];
    fb_wire_hdr_encode(b, &h);
    fb_put_le64(b + FB_WIRE_HDR_LEN, offset);
    return fiber_buf_append(out, b, sizeof b);
}

int fb_wire_put_obj_from(fiber_buf *out, uint64_t id, const char *addr)
{
    char why[128];
    if (addr_problem(addr, strlen(addr), why, sizeof why))
        return fb_err(FIBER_EINVAL, "OBJ_FROM address: %s", why);
    return frame(out, FB_MSG_OBJ_FROM, 0, id, addr, strlen(addr), NULL, 0);
}

int fb_wire_put_obj_none(fiber_buf *out, uint64_t id, int32_t code,
                         const char *text)
{
    size_t n = strlen(text);
    if (code >= 0)
        return fb_err(FIBER_EINVAL, "OBJ_NONE code: %d is not a failure code",
                      (int)code);
    return frame(out, FB_MSG_OBJ_NONE, code, id, text,
                 n > FB_WIRE_TEXT_MAX ? FB_WIRE_TEXT_MAX : n, NULL, 0);
}

static int put_addr_field(uint8_t *buf, size_t *at, const char *s, int empty_ok)
{
    size_t n = strlen(s);
    char why[128];
    if (!(n == 0 && empty_ok) && addr_problem(s, n, why, sizeof why))
        return fb_err(FIBER_EINVAL, "blob holder address: %s", why);
    fb_put_le16(buf + *at, (uint16_t)n);
    memcpy(buf + *at + 2, s, n);
    *at += 2 + n;
    return 0;
}

int fb_wire_put_obj_have(fiber_buf *out, const uint8_t ref[FB_WIRE_REF_LEN],
                         const char *addr, const char *from)
{
    uint8_t buf[FB_WIRE_REF_LEN + 4 + 2 * FB_WIRE_ADDR_MAX];
    size_t at = FB_WIRE_REF_LEN;
    memcpy(buf, ref, FB_WIRE_REF_LEN);
    int rc = put_addr_field(buf, &at, addr, 0);
    if (rc == 0)
        rc = put_addr_field(buf, &at, from, 1);
    return rc ? rc : frame(out, FB_MSG_OBJ_HAVE, 0, 0, buf, at, NULL, 0);
}

int fb_wire_put_obj_bad(fiber_buf *out, const uint8_t ref[FB_WIRE_REF_LEN],
                        const char *addr)
{
    uint8_t buf[FB_WIRE_REF_LEN + 2 + FB_WIRE_ADDR_MAX];
    size_t at = FB_WIRE_REF_LEN;
    memcpy(buf, ref, FB_WIRE_REF_LEN);
    int rc = put_addr_field(buf, &at, addr, 0);
    return rc ? rc : frame(out, FB_MSG_OBJ_BAD, 0, 0, buf, at, NULL, 0);
}
