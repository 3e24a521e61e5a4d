/*
 * runid.c -- a run's identity; see runid.h.
 */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/common.h"
#include "runtime/runid.h"

int fb_run_id_valid(const char *run)
{
    size_t n = run ? strlen(run) : 0;
    if (n == 0 || n > FB_RUN_ID_MAX || run[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = run[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-'))
            return 0;
    }
    return 1;
}

int fb_run_id_new(char *out, size_t size)
{
    unsigned char r[4];
    if (sodium_init() < 0)
        return fb_err(FIBER_ESYS, "libsodium failed to initialise");
    randombytes_buf(r, sizeof r);
    int n = snprintf(out, size, "fiber-%02x%02x%02x%02x", r[0], r[1], r[2],
                     r[3]);
    if (n < 0 || (size_t)n >= size)
        return fb_err(FIBER_EINVAL, "run id buffer too small");
    return 0;
}

void fb_run_secret_new(void *out, size_t len)
{
    randombytes_buf(out, len);
}

int fb_run_base(char *out, size_t size)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp || strlen(tmp) > 60)
        tmp = "/tmp"; /* unix socket paths must stay under 108 bytes */
    int n = snprintf(out, size, "%s/fiber-%u", tmp, (unsigned)geteuid());
    if (n < 0 || (size_t)n >= size)
        return fb_err(FIBER_EINVAL, "run directory path too long");
    return 0;
}

int fb_run_dir(const char *run, char *out, size_t size)
{
    if (!fb_run_id_valid(run))
        return fb_err(FIBER_EINVAL, "'%.80s' is not a run id (1 to %d of "
                                    "A-Z a-z 0-9 _ . -, like fiber-3f9a1c2e)",
                      run ? run : "(null)", FB_RUN_ID_MAX);
    char base[512];
    int rc = fb_run_base(base, sizeof base);
    if (rc)
        return rc;
    int n = snprintf(out, size, "%s/%s", base, run);
    if (n < 0 || (size_t)n >= size)
        return fb_err(FIBER_EINVAL, "run directory path too long");
    return 0;
}

int fb_run_log_dir_of(const char *run, const char *run_dir,
                      const char *log_dir, char *out, size_t size)
{
    int n = log_dir && log_dir[0] ? snprintf(out, size, "%s/%s", log_dir, run)
                                  : snprintf(out, size, "%s/logs", run_dir);
    if (n < 0 || (size_t)n >= size)
        return fb_err(FIBER_ECONFIG, "log directory path too long (log_dir "
                                     "'%.200s')",
                      log_dir ? log_dir : "");
    return 0;
}

int fb_run_log_dir(const char *run, const char *run_dir, char *out,
                   size_t size)
{
    char configured[512];
    int rc = fiber_config_get("log_dir", configured, sizeof configured);
    return rc ? rc
              : fb_run_log_dir_of(run, run_dir, configured, out, size);
}
