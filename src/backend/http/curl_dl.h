/*
 * curl_dl.h -- libcurl, loaded when the HTTP layer (http.h: the docker and
 * kubernetes backends, the image builder, the run tools) first needs it,
 * not when a program starts.
 *
 * Linking libcurl into libfiber made every fiber process -- each pool
 * worker included -- load libcurl and its dependency tree (OpenSSL,
 * GnuTLS, Kerberos, LDAP: 30-odd libraries), which tripled the time to
 * start a local job (1.2 ms to 3.5 ms per process) and the resident memory
 * of a worker.  Only a master talks to its engine, so libcurl is opened
 * with dlopen() on first use.  Only the HTTP layer includes this header.  Include this header
 * instead of <curl/curl.h>: it keeps curl's types and constants and maps
 * the curl_* functions used here to pointers filled by fb_curl_load().
 */
#ifndef FB_CURL_DL_H
#define FB_CURL_DL_H

#define CURL_DISABLE_TYPECHECK /* curl_easy_setopt must stay a function */
#include <curl/curl.h>

struct fb_curl_api {
    CURLcode (*global_init)(long flags);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *curl, CURLoption option, ...);
    CURLcode (*easy_perform)(CURL *curl);
    CURLcode (*easy_getinfo)(CURL *curl, CURLINFO info, ...);
    void (*easy_reset)(CURL *curl);
    void (*easy_cleanup)(CURL *curl);
    const char *(*easy_strerror)(CURLcode code);
    struct curl_slist *(*slist_append)(struct curl_slist *list,
                                        const char *string);
    void (*slist_free_all)(struct curl_slist *list);
    CURLM *(*multi_init)(void);
    CURLMcode (*multi_add_handle)(CURLM *multi, CURL *curl);
    CURLMcode (*multi_remove_handle)(CURLM *multi, CURL *curl);
    CURLMcode (*multi_perform)(CURLM *multi, int *running);
    CURLMcode (*multi_poll)(CURLM *multi, struct curl_waitfd extra[],
                            unsigned int n, int timeout_ms, int *numfds);
    CURLMsg *(*multi_info_read)(CURLM *multi, int *left);
    CURLMcode (*multi_cleanup)(CURLM *multi);
};

extern struct fb_curl_api fb_curl;

/* Loads libcurl (once; thread-safe) and runs curl_global_init, after
 * telling OpenSSL 3 (when it is libcurl's TLS library) not to clean up in
 * an atexit handler (see curl_dl.c).  Returns 0, or FIBER_ENOTSUP with a
 * message saying which package to install. */
int fb_curl_load(void);

/* curl.h wraps these two in argument-count-checking macros. */
#undef curl_easy_setopt
#undef curl_easy_getinfo
#define curl_global_init fb_curl.global_init
#define curl_easy_init fb_curl.easy_init
#define curl_easy_setopt fb_curl.easy_setopt
#define curl_easy_perform fb_curl.easy_perform
#define curl_easy_getinfo fb_curl.easy_getinfo
#define curl_easy_reset fb_curl.easy_reset
#define curl_easy_cleanup fb_curl.easy_cleanup
#define curl_easy_strerror fb_curl.easy_strerror
#define curl_slist_append fb_curl.slist_append
#define curl_slist_free_all fb_curl.slist_free_all
#define curl_multi_init fb_curl.multi_init
#define curl_multi_add_handle fb_curl.multi_add_handle
#define curl_multi_remove_handle fb_curl.multi_remove_handle
#define curl_multi_perform fb_curl.multi_perform
#define curl_multi_poll fb_curl.multi_poll
#define curl_multi_info_read fb_curl.multi_info_read
#define curl_multi_cleanup fb_curl.multi_cleanup

#endif /* FB_CURL_DL_H */
