/*
 * elf.c -- the program facts of elf.h: locating the program and reading
 * its ELF program headers (both classes) from a read-only mapping.
 */
#include <elf.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "backend/docker/elf.h"
#include "base/common.h"

/* Finds NT_GNU_BUILD_ID among the notes in p[0..len). */
static int find_build_id(const unsigned char *p, size_t len, size_t align,
                         char *out, size_t size)
{
    size_t off = 0;
    while (off + sizeof(Elf32_Nhdr) <= len) {
        Elf32_Nhdr nh; /* the same layout in ELF32 and ELF64 */
        memcpy(&nh, p + off, sizeof nh);
        size_t name_off = off + sizeof nh;
        size_t desc_off = name_off + ((nh.n_namesz + align - 1) & ~(align - 1));
        size_t next = desc_off + ((nh.n_descsz + align - 1) & ~(align - 1));
        if (desc_off > len || next > len || next <= off)
            return 0;
        if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
            memcmp(p + name_off, "GNU", 4) == 0 && nh.n_descsz > 0) {
            fb_hex(p + desc_off, nh.n_descsz > 32 ? 32 : nh.n_descsz, out,
                   size);
            return 1;
        }
        off = next;
    }
    return 0;
}

/* One program header, whichever the class. */
struct phdr {
    uint32_t type;
    uint64_t offset, filesz, align;
};

static int read_phdr(const unsigned char *m, size_t size, int is64, size_t i,
                     uint64_t phoff, struct phdr *ph)
{
    if (is64) {
        Elf64_Phdr p;
        if (phoff + (i + 1) * sizeof p > size)
            return -1;
        memcpy(&p, m + phoff + i * sizeof p, sizeof p);
        *ph = (struct phdr){p.p_type, p.p_offset, p.p_filesz, p.p_align};
    } else {
        Elf32_Phdr p;
        if (phoff + (i + 1) * sizeof p > size)
            return -1;
        memcpy(&p, m + phoff + i * sizeof p, sizeof p);
        *ph = (struct phdr){p.p_type, p.p_offset, p.p_filesz, p.p_align};
    }
    return 0;
}

/* Reads PT_INTERP and the build id from the mapped file. */
static int parse_elf(const unsigned char *m, size_t size,
                     struct fb_program *pi)
{
    if (size < EI_NIDENT || memcmp(m, ELFMAG, SELFMAG) != 0)
        return fb_err(FIBER_EINVAL,
                      "%s is not an ELF executable: fiber image build packs "
                      "compiled programs (a script would need its "
                      "interpreter)",
                      pi->path);
    int is64 = m[EI_CLASS] == ELFCLASS64;
    uint64_t phoff;
    size_t phnum;
    if (is64 && size >= sizeof(Elf64_Ehdr)) {
        Elf64_Ehdr eh;
        memcpy(&eh, m, sizeof eh);
        phoff = eh.e_phoff;
        phnum = eh.e_phnum;
    } else if (!is64 && m[EI_CLASS] == ELFCLASS32 &&
               size >= sizeof(Elf32_Ehdr)) {
        Elf32_Ehdr eh;
        memcpy(&eh, m, sizeof eh);
        phoff = eh.e_phoff;
        phnum = eh.e_phnum;
    } else {
        return fb_err(FIBER_EINVAL, "%s: truncated or unknown ELF class",
                      pi->path);
    }
    for (size_t i = 0; i < phnum; i++) {
        struct phdr ph;
        if (read_phdr(m, size, is64, i, phoff, &ph) != 0 ||
            ph.offset > size || ph.filesz > size - ph.offset)
            return fb_err(FIBER_EINVAL, "%s: corrupt program headers",
                          pi->path);
        if (ph.type == PT_INTERP && ph.filesz > 1) {
            size_t n = ph.filesz < sizeof pi->interp ? ph.filesz
                                                     : sizeof pi->interp;
            memcpy(pi->interp, m + ph.offset, n);
            pi->interp[n - 1] = '\0';
        } else if (ph.type == PT_NOTE && !pi->has_build_id) {
            pi->has_build_id = find_build_id(m + ph.offset, ph.filesz,
                                             ph.align == 8 ? 8 : 4, pi->id,
                                             sizeof pi->id);
        }
    }
    if (!pi->has_build_id) {
        /* As the runtime does (runtime/buildid.c): no note, hash the file. */
        unsigned char digest[32];
        crypto_generichash(digest, sizeof digest, m, size, NULL, 0);
        fb_hex(digest, sizeof digest, pi->id, sizeof pi->id);
    }
    return 0;
}

/* Rewrites an absolute path without "." segments and repeated slashes
 * ("/a/./b//c" -> "/a/b/c"), in place.  ".." stays: with symbolic links
 * only the file system knows what it means. */
static void drop_dot_segments(char *path)
{
    char *w = path;
    for (const char *r = path; *r;) {
        if (r[0] == '/' && (r[1] == '/' || (r[1] == '.' && (r[2] == '/' ||
                                                            r[2] == '\0')))) {
            r += r[1] == '/' ? 1 : 2;
            continue;
        }
        *w++ = *r++;
    }
    if (w == path)
        *w++ = '/';
    *w = '\0';
}

/* Finds program as execvp would (a name without '/' is searched in PATH)
 * and makes the path absolute, without resolving symlinks: the image holds
 * the path as given and whatever it points to. */
static int locate_program(const char *program, char *out, size_t size)
{
    if (!program || !*program)
        return fb_err(FIBER_EINVAL, "no program given");
    if (!strchr(program, '/')) {
        const char *path = getenv("PATH");
        while (path && *path) {
            const char *end = strchr(path, ':');
            size_t n = end ? (size_t)(end - path) : strlen(path);
            char cand[PATH_MAX];
            snprintf(cand, sizeof cand, "%.*s/%s", (int)n, n ? path : ".",
                     program);
            if (access(cand, X_OK) == 0 && strlen(cand) < size) {
                memcpy(out, cand, strlen(cand) + 1);
                program = out;
                break;
            }
            path = end ? end + 1 : NULL;
        }
        if (program != out)
            return fb_err(FIBER_EINVAL,
                          "program '%s' not found in PATH; give its path "
                          "(./%s)",
                          program, program);
    }
    if (program[0] == '/') {
        if (program != out && fb_strlcpy(out, program, size) != strlen(program))
            return fb_err(FIBER_EINVAL, "program path too long");
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd))
            return fb_err_errno(FIBER_ESYS, "getcwd");
        if ((size_t)snprintf(out, size, "%s/%s", cwd, program) >= size)
            return fb_err(FIBER_EINVAL, "program path too long");
    }
    drop_dot_segments(out);
    struct stat st;
    if (stat(out, &st) != 0)
        return fb_err_errno(FIBER_EINVAL, "cannot use program %s", out);
    if (!S_ISREG(st.st_mode) || access(out, X_OK) != 0)
        return fb_err(FIBER_EINVAL, "%s is not an executable file", out);
    return 0;
}

int fb_program_inspect(const char *program, struct fb_program *pi)
{
    memset(pi, 0, sizeof *pi);
    int rc = locate_program(program, pi->path, sizeof pi->path);
    if (rc)
        return rc;
    int fd = open(pi->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fb_err_errno(FIBER_ESYS, "cannot open %s", pi->path);
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size == 0) {
        close(fd);
        return fb_err(FIBER_EINVAL, "%s is empty or unreadable", pi->path);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return fb_err_errno(FIBER_ESYS, "cannot map %s", pi->path);
    rc = parse_elf(m, (size_t)st.st_size, pi);
    munmap(m, (size_t)st.st_size);
    return rc;
}
