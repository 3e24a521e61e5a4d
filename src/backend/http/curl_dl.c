/*
 * curl_dl.c -- opens libcurl on first use; see curl_dl.h for why.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/http/curl_dl.h"
#include "base/common.h"

struct fb_curl_api fb_curl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_rc;
static char load_error[400];

/* Looks up one symbol into *slot; returns 0 or -1 (load_error says why). */
static int sym(void *lib, const char *name, void *slot)
{
    void *p = dlsym(lib, name);
    if (!p) {
        snprintf(load_error, sizeof load_error,
                 "libcurl lacks %s: %s", name, dlerror());
        return -1;
    }
    memcpy(slot, &p, sizeof p);
    return 0;
}

static void openssl_init(void)
{
    void *lib = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return;
    int (*init)(uint64_t, const void *);
    void *sym = dlsym(lib, "OPENSSL_init_crypto");
    if (!sym)
        return;
    memcpy(&init, &sym, sizeof init);
    init(0x00080000ull /* OPENSSL_INIT_NO_ATEXIT */, NULL);
    /* lib stays loaded: libcurl uses it. */
}

/* libcurl's TLS library, OpenSSL 3, cleans itself up in an atexit handler
 * that it registers when libcurl first initialises: after fiber_init
 * registered fiber_shutdown, so at exit OpenSSL is torn down first, and
 * fiber_shutdown's requests (deleting a run's pods and Secret) and the
 * kubernetes pod watcher would run on a dead OpenSSL and crash.
 * Initialising OpenSSL before libcurl with OPENSSL_INIT_NO_ATEXIT (its
 * documented purpose) leaves the cleanup to the kernel.  Nothing happens
 * if libcurl uses another TLS library. */
static void load(void)
{
    openssl_init();
    void *lib = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(load_error, sizeof load_error,
                 "cannot load libcurl (%s): the docker and kubernetes "
                 "backends and the image builder need it; install "
                 "libcurl4",
                 dlerror());
        load_rc = FIBER_ENOTSUP;
        return;
    }
    struct {
        const char *name;
        void *slot;
    } table[] = {
        {"curl_global_init", &fb_curl.global_init},
        {"curl_easy_init", &fb_curl.easy_init},
        {"curl_easy_setopt", &fb_curl.easy_setopt},
        {"curl_easy_perform", &fb_curl.easy_perform},
        {"curl_easy_getinfo", &fb_curl.easy_getinfo},
        {"curl_easy_reset", &fb_curl.easy_reset},
        {"curl_easy_cleanup", &fb_curl.easy_cleanup},
        {"curl_easy_strerror", &fb_curl.easy_strerror},
        {"curl_slist_append", &fb_curl.slist_append},
        {"curl_slist_free_all", &fb_curl.slist_free_all},
        {"curl_multi_init", &fb_curl.multi_init},
        {"curl_multi_add_handle", &fb_curl.multi_add_handle},
        {"curl_multi_remove_handle", &fb_curl.multi_remove_handle},
        {"curl_multi_perform", &fb_curl.multi_perform},
        {"curl_multi_poll", &fb_curl.multi_poll},
        {"curl_multi_info_read", &fb_curl.multi_info_read},
        {"curl_multi_cleanup", &fb_curl.multi_cleanup},
    };
    for (size_t i = 0; i < FB_ARRAY_LEN(table); i++) {
        if (sym(lib, table[i].name, table[i].slot) != 0) {
            load_rc = FIBER_ENOTSUP;
            return;
        }
    }
    /* Process-wide and, before curl 7.84, not thread-safe: once, here.
     * curl_global_cleanup is never called: the library stays loaded. */
    CURLcode rc = fb_curl.global_init(CURL_GLOBAL_ALL);
    if (rc != CURLE_OK) {
        snprintf(load_error, sizeof load_error,
                 "libcurl failed to initialise: %s",
                 fb_curl.easy_strerror(rc));
        load_rc = FIBER_ENOMEM;
    }
}

int fb_curl_load(void)
{
    pthread_once(&load_once, load);
    if (load_rc)
        return fb_err(load_rc, "%s", load_error);
    return 0;
}
