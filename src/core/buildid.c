/*
 * buildid.c -- identifies the program, so that a master never runs work on
 * a child built from another binary.
 *
 * The id is the GNU build-id note the linker writes into the executable
 * (gcc and clang on Debian always do).  If the executable has none, the id
 * is a BLAKE2b hash of the executable file itself.
 */
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "core/common.h"
#include "core/runtime.h"

struct note_search {
    char *out;
    size_t size;
    int found;
};

/* Scans one PT_NOTE segment for NT_GNU_BUILD_ID. */
static int scan_notes(const unsigned char *p, size_t len,
                      struct note_search *s)
{
    size_t off = 0;
    while (off + sizeof(ElfW(Nhdr)) <= len) {
        const ElfW(Nhdr) *nh = (const void *)(p + off);
        size_t name_off = off + sizeof *nh;
        size_t desc_off = name_off + ((nh->n_namesz + 3u) & ~3u);
        size_t next = desc_off + ((nh->n_descsz + 3u) & ~3u);
        if (next > len || next <= off)
            break;
        if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 &&
            memcmp(p + name_off, "GNU", 4) == 0 && nh->n_descsz > 0) {
            size_t n = nh->n_descsz > 32 ? 32 : nh->n_descsz;
            fb_hex(p + desc_off, n, s->out, s->size);
            return 1;
        }
        off = next;
    }
    return 0;
}

static int phdr_callback(struct dl_phdr_info *info, size_t size, void *data)
{
    FB_UNUSED(size);
    struct note_search *s = data;
    /* The first object is the main program; only its id matters. */
    for (int i = 0; i < info->dlpi_phnum && !s->found; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE)
            continue;
        s->found = scan_notes((const unsigned char *)(info->dlpi_addr +
                                                      ph->p_vaddr),
                              ph->p_memsz, s);
    }
    return 1; /* stop after the main program */
}

static int hash_executable(char *out, size_t size)
{
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fb_err_errno(FIBER_ESYS, "open /proc/self/exe");
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    unsigned char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0)
        crypto_generichash_update(&st, buf, (unsigned long long)n);
    close(fd);
    if (n < 0)
        return fb_err_errno(FIBER_ESYS, "read /proc/self/exe");
    unsigned char digest[32];
    crypto_generichash_final(&st, digest, sizeof digest);
    fb_hex(digest, sizeof digest, out, size);
    return 0;
}

int fb_build_id(char *out, size_t size)
{
    struct note_search s = {out, size, 0};
    dl_iterate_phdr(phdr_callback, &s);
    if (s.found)
        return 0;
    return hash_executable(out, size);
}
