/*
 * fuzz_blobs.c -- the master's blob server (src/store/objserve.c) driven by
 * hostile clients: OBJ_GET, OBJ_HAVE and OBJ_BAD frames, well formed or
 * not, in any order, from up to 8 connections that come and go, while
 * blobs are put and released.
 *
 * The server is a detached one (no thread, no listener: this program
 * plays its loop with fb_oserve_step) in directory mode, over the real
 * store of fiber_object_put.  Each connection is a socket pair whose far
 * end the script may read (draining what was sent) or close.  A frame is
 * handed to the handler only if fb_wire_check_payload accepts it, as
 * fb_conn_next would; the handler must then never crash, and after every
 * command the directory's books must hold (fb_oserve_check: a blob's
 * master slots equal the connections holding one, no load or pin below
 * zero).
 *
 * Script commands (selector byte % 7):
 *   0 connect            a new connection (at most 8)
 *   1 get    u8 c, u8 r  OBJ_GET of ref slot r on connection c
 *   2 have   u8 c, u8 r, u8 a, u8 f   OBJ_HAVE: addresses from a table
 *   3 bad    u8 c, u8 r, u8 a         OBJ_BAD
 *   4 raw    u8 c, u8 type, u16 n, n bytes   any frame
 *   5 close  u8 c, u8 how  drop it server-side (how odd) or close the
 *                          client end and let the server find out
 *   6 blob   u8 r, u8 put  put content r (sizes 0..300 KiB), or release
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FZ_NAME "fuzz_blobs"
#include "store/object_int.h"
#include "fuzz_util.h"

#define MAX_CONNS 8
#define N_REFS 4

struct fconn {
    struct fb_sconn *c;
    int peer; /* the client's end */
};

static struct fb_oserve *srv;
static struct fconn conns[MAX_CONNS];
static fiber_ref refs[N_REFS + 1]; /* the last: never put */
static int puts_held[N_REFS];

static const char *const addrs[] = {
    "unix:/tmp/fiber-fuzz/relay.1.sock", "unix:/tmp/fiber-fuzz/relay.2.sock",
    "tcp:127.0.0.1:9", "tcp:[::1]:65535"};

static unsigned char *content(int r, size_t *len)
{
    static const size_t sizes[N_REFS] = {0, 1, 4097, 300 << 10};
    *len = sizes[r];
    unsigned char *p = malloc(*len ? *len : 1);
    for (size_t i = 0; i < *len; i++)
        p[i] = (unsigned char)(i * 7 + (size_t)r);
    return p;
}

static void setup_once(void)
{
    if (srv)
        return;
    fz_setup();
    srv = fb_oserve_detached(1);
    FZ_REQUIRE(srv, "no server");
    for (int r = 0; r < N_REFS; r++) {
        size_t n;
        unsigned char *p = content(r, &n);
        FZ_REQUIRE(fiber_object_put(p, n, &refs[r]) == 0, "put: %s",
                   fiber_last_error());
        FZ_REQUIRE(fiber_object_release(&refs[r]) == 0, "release");
        free(p);
    }
    memset(&refs[N_REFS], 0x5a, sizeof refs[N_REFS]);
}

static void drain(int fd)
{
    char buf[65536];
    while (read(fd, buf, sizeof buf) > 0)
        ;
}

static void close_conn(int k, int server_side)
{
    struct fconn *f = &conns[k];
    if (!f->c)
        return;
    if (server_side) {
        fb_oserve_drop(srv, f->c);
    } else {
        close(f->peer);
        f->peer = -1;
        /* The server finds out when it next writes or reads: here, when
         * it is stepped; a step that drops it returns -1. */
        struct fb_wire_hdr h = {.type = FB_MSG_PING, .id = 1};
        if (fb_oserve_frame(srv, f->c, &h, NULL) != 0 ||
            fb_oserve_step(srv, f->c) != 0) {
            f->c = NULL;
            return;
        }
        fb_oserve_drop(srv, f->c);
    }
    if (f->peer >= 0)
        close(f->peer);
    f->c = NULL;
    f->peer = -1;
}

static void deliver(int k, const struct fb_wire_hdr *h, const uint8_t *p)
{
    struct fconn *f = &conns[k];
    if (!f->c)
        return;
    if (fb_wire_check_payload(h, p, NULL, 0) != 0)
        return; /* fb_conn_next would have refused it */
    if (fb_oserve_frame(srv, f->c, h, p) != 0) {
        fb_oserve_drop(srv, f->c);
        f->c = NULL;
    } else if (fb_oserve_step(srv, f->c) != 0) {
        f->c = NULL;
    }
    if (f->c == NULL && f->peer >= 0) {
        close(f->peer);
        f->peer = -1;
    }
    if (f->peer >= 0)
        drain(f->peer);
}

static void cmd_frame(struct fz_in *in, int kind)
{
    int k = fz_u8(in) % MAX_CONNS;
    const fiber_ref *ref = &refs[fz_u8(in) % (N_REFS + 1)];
    fiber_buf b = {0};
    int rc = 0;
    if (kind == 1) {
        rc = fb_wire_put_obj_get(&b, fz_u8(in), ref->bytes);
    } else if (kind == 2) {
        const char *a = addrs[fz_u8(in) % 4];
        unsigned f = fz_u8(in) % 5;
        rc = fb_wire_put_obj_have(&b, ref->bytes, a, f == 4 ? "" : addrs[f]);
    } else {
        rc = fb_wire_put_obj_bad(&b, ref->bytes, addrs[fz_u8(in) % 4]);
    }
    struct fb_wire_hdr h;
    if (rc == 0 &&
        fb_wire_hdr_decode(b.data, b.len, 1u << 16, &h, NULL, 0) == 0)
        deliver(k, &h, b.data + FB_WIRE_HDR_LEN);
    fiber_buf_free(&b);
}

static void cmd_raw(struct fz_in *in)
{
    int k = fz_u8(in) % MAX_CONNS;
    struct fb_wire_hdr h = {.type = fz_u8(in), .id = fz_u8(in)};
    h.code = (int8_t)fz_u8(in);
    size_t got;
    const uint8_t *p = fz_bytes(in, fz_u16(in), &got);
    h.len = (uint32_t)got;
    deliver(k, &h, p);
}

static void cmd_blob(struct fz_in *in)
{
    int r = fz_u8(in) % N_REFS;
    if (fz_u8(in) & 1) {
        size_t n;
        unsigned char *p = content(r, &n);
        fiber_ref got;
        if (fiber_object_put(p, n, &got) == 0)
            puts_held[r]++;
        free(p);
    } else if (puts_held[r] > 0) {
        FZ_REQUIRE(fiber_object_release(&refs[r]) == 0, "release");
        puts_held[r]--;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    setup_once();
    struct fz_in in = {data, size};
    for (int steps = 0; fz_more(&in) && steps < 2000; steps++) {
        int cmd = fz_u8(&in) % 7;
        if (cmd == 0) {
            for (int k = 0; k < MAX_CONNS; k++)
                if (!conns[k].c) {
                    int sv[2];
                    fz_socketpair(sv);
                    conns[k].c = fb_oserve_adopt(srv, sv[0]);
                    conns[k].peer = conns[k].c ? sv[1] : -1;
                    if (!conns[k].c)
                        close(sv[1]);
                    break;
                }
        } else if (cmd <= 3) {
            cmd_frame(&in, cmd);
        } else if (cmd == 4) {
            cmd_raw(&in);
        } else if (cmd == 5) {
            int k = fz_u8(&in) % MAX_CONNS;
            close_conn(k, fz_u8(&in) & 1);
        } else {
            cmd_blob(&in);
        }
        char why[200];
        FZ_REQUIRE(fb_oserve_check(srv, why, sizeof why) == 0, "%s", why);
    }
    for (int k = 0; k < MAX_CONNS; k++)
        close_conn(k, 1);
    for (int r = 0; r < N_REFS; r++)
        while (puts_held[r] > 0 && fiber_object_release(&refs[r]) == 0)
            puts_held[r]--;
    char why[200];
    FZ_REQUIRE(fb_oserve_check(srv, why, sizeof why) == 0, "%s", why);
    return 0;
}

/* Seeds: a broadcast (two askers served, two waiting, a holder appears,
 * one fails), and garbage. */
void fuzz_write_seeds(const char *dir)
{
    setup_once();
    fiber_buf b = {0};
    fz_w_u8(&b, 6), fz_w_u8(&b, 3), fz_w_u8(&b, 1); /* put the 300 KiB */
    for (int k = 0; k < 5; k++)
        fz_w_u8(&b, 0);
    for (int k = 0; k < 5; k++)
        fz_w_u8(&b, 1), fz_w_u8(&b, k), fz_w_u8(&b, 3), fz_w_u8(&b, k);
    fz_w_u8(&b, 2), fz_w_u8(&b, 0), fz_w_u8(&b, 3), fz_w_u8(&b, 0),
        fz_w_u8(&b, 4);
    fz_w_u8(&b, 3), fz_w_u8(&b, 2), fz_w_u8(&b, 3), fz_w_u8(&b, 0);
    fz_w_u8(&b, 5), fz_w_u8(&b, 1), fz_w_u8(&b, 0);
    fz_w_u8(&b, 6), fz_w_u8(&b, 3), fz_w_u8(&b, 0); /* release */
    fz_seed(dir, "broadcast", &b);
    fz_w_u8(&b, 0);
    fz_w_u8(&b, 4), fz_w_u8(&b, 0), fz_w_u8(&b, FB_MSG_OBJ_HAVE),
        fz_w_u8(&b, 1), fz_w_u8(&b, 0), fz_w_u16(&b, 3);
    fz_w_bytes(&b, "abc", 3);
    fz_w_u8(&b, 4), fz_w_u8(&b, 0), fz_w_u8(&b, FB_MSG_OBJ_GET),
        fz_w_u8(&b, 1), fz_w_u8(&b, 0), fz_w_u16(&b, 40);
    fz_w_bytes(&b, refs[0].bytes, 40);
    fz_seed(dir, "raw", &b);
    fiber_buf_free(&b);
}
