/*
 * log.h -- fiber's own log: leveled lines to stderr in the master and to a
 * file per process (named after the process) in children.
 */
#ifndef FB_LOG_H
#define FB_LOG_H

#include "fiber/fiber.h"

/* Sets the level and the process identity used in every line.  Safe to call
 * again (the runtime calls it once the configuration is known). */
void fb_log_setup(int level, const char *proc_name);

/* Sends further lines to the file <dir>/<proc_name>.log (creating dir and
 * its parents with mode 0700 if needed) instead of stderr.  Returns 0 or
 * FIBER_ESYS (the log stays on stderr). */
int fb_log_to_dir(const char *dir, const char *proc_name);

/* Sends further lines to the file <prefix>.<proc_name> (Uber Fiber's
 * log_file layout), creating its folder if needed; with now, opens it at
 * once (so that it exists even before a line is written) and fails if it
 * cannot.  Returns 0 or FIBER_ESYS (the log stays where it was). */
int fb_log_to_prefix(const char *prefix, const char *proc_name, int now);

/* Sends further lines to standard error again. */
void fb_log_to_stderr(void);

/* Returns 1 if a line at level would be written. */
int fb_log_enabled(int level);

#define fb_log_error(...) fiber_log(FIBER_LOG_ERROR, __VA_ARGS__)
#define fb_log_warn(...) fiber_log(FIBER_LOG_WARN, __VA_ARGS__)
#define fb_log_info(...) fiber_log(FIBER_LOG_INFO, __VA_ARGS__)
#define fb_log_debug(...)                                                      \
    do {                                                                       \
        if (fb_log_enabled(FIBER_LOG_DEBUG))                                   \
            fiber_log(FIBER_LOG_DEBUG, __VA_ARGS__);                           \
    } while (0)

#endif /* FB_LOG_H */
