/*
 * buildid.c -- identifies the program, so that a master never runs work on
 * a child built from another binary.
 *
 * The id is the GNU build-id note the linker writes into the executable
 * (gcc and clang on Debian always do).  If the executable has none, the id
 * is a BLAKE2b hash of the executable file itself.  When libfiber is
 * loaded as a shared object of its own (libfiber.so, or the Python
 * extension that links it in), the id is a hash of the program's id and
 * that object's, so that a Python master and a child running the same
 * interpreter with another build of the extension refuse each other.
 */
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "base/common.h"
#include "runtime/runtime.h"

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

/* Scans the PT_NOTE segments of one loaded object for its build id. */
static void scan_object(const struct dl_phdr_info *info, struct note_search *s)
{
    for (int i = 0; i < info->dlpi_phnum && !s->found; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_NOTE)
            continue;
        s->found = scan_notes((const unsigned char *)(info->dlpi_addr +
                                                      ph->p_vaddr),
                              ph->p_memsz, s);
    }
}

static int phdr_callback(struct dl_phdr_info *info, size_t size, void *data)
{
    FB_UNUSED(size);
    /* The first object is the main program. */
    scan_object(info, data);
    return 1; /* stop after the main program */
}

/* Finds the build id of the loaded object whose base address is base. */
struct lib_search {
    uintptr_t base;
    struct note_search notes;
};

static int lib_callback(struct dl_phdr_info *info, size_t size, void *data)
{
    FB_UNUSED(size);
    struct lib_search *ls = data;
    if ((uintptr_t)info->dlpi_addr != ls->base)
        return 0;
    scan_object(info, &ls->notes);
    return 1;
}

/* When libfiber lives in a shared object of its own (libfiber.so, or a
 * language binding such as the Python extension, which links it in),
 * that object's build id counts too: a master and a child with the same
 * interpreter but different bindings must not work together.  Writes the
 * object's id to out and returns 1, or returns 0 when libfiber is part of
 * the main program (or the object has no build id). */
static int library_build_id(char *out, size_t size)
{
    Dl_info di;
    if (!dladdr((void *)fb_build_id, &di) || !di.dli_fbase)
        return 0;
    struct lib_search ls = {(uintptr_t)di.dli_fbase, {out, size, 0}};
    dl_iterate_phdr(lib_callback, &ls);
    if (!ls.notes.found)
        return 0;
    /* The main program is found at base 0 (non-PIE) or its own load
     * address; either way it is the first object dl_iterate_phdr lists,
     * which phdr_callback read: if that is us, there is no library. */
    return 1;
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

/* The main program's id, or a hash of the program file. */
static int program_build_id(char *out, size_t size)
{
    struct note_search s = {out, size, 0};
    dl_iterate_phdr(phdr_callback, &s);
    if (s.found)
        return 0;
    return hash_executable(out, size);
}

int fb_build_id(char *out, size_t size)
{
    char prog[FB_WIRE_BUILD_ID_MAX + 1], lib[FB_WIRE_BUILD_ID_MAX + 1];
    int rc = program_build_id(prog, sizeof prog);
    if (rc)
        return rc;
    if (!library_build_id(lib, sizeof lib) || strcmp(lib, prog) == 0) {
        fb_strlcpy(out, prog, size);
        return 0;
    }
    /* Both ids, hashed into one of the usual length. */
    unsigned char digest[20];
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, sizeof digest);
    crypto_generichash_update(&st, (const unsigned char *)prog, strlen(prog));
    crypto_generichash_update(&st, (const unsigned char *)"+", 1);
    crypto_generichash_update(&st, (const unsigned char *)lib, strlen(lib));
    crypto_generichash_final(&st, digest, sizeof digest);
    fb_hex(digest, sizeof digest, out, size);
    return 0;
}
