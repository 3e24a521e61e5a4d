# backend/http/: HTTP over a Unix socket or TCP (libcurl, opened when first
# needed).
fiber_sources(curl_dl.c http.c)
