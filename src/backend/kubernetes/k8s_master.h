/*
 * k8s_master.h -- a run's master as a pod (fiber_run_start with the
 * kubernetes backend, `fiber run --backend kubernetes`).
 *
 * The pod "<run>-master" (labels fiber.run, fiber.role=master) runs the
 * program from the image with the run's variables; it keeps the pod's
 * service account (in-cluster configuration: the master starts its jobs'
 * pods with it, as their owner), and listens on its pod IP
 * (FIBER_LISTEN_HOST from the downward API's status.podIP), which its
 * jobs dial.  The pod is kept after it ends, for its status and logs.
 */
#ifndef FB_K8S_MASTER_H
#define FB_K8S_MASTER_H

#include <stddef.h>
#include <stdint.h>

#include "fiber/fiber.h"

struct fb_k8s;

/* Opens the API with the caller's configuration (fiber_config_get: the
 * defaults, .fiberconfig and FIBER_* variables), as fb_k8s_open does.
 * With configured non-NULL, first tells whether kubernetes is configured
 * here at all (k8s_server set, or in a cluster): *configured = 0 and 0
 * returned, with nothing opened, when it is not. */
int fb_k8s_open_configured(struct fb_k8s *k, int *configured);

/* Creates the master's pod.  argv[0] must be the program's absolute path
 * in the image; vars are "NAME=value" strings for its environment.  Writes
 * the pod's name to pod.  Returns 0, FIBER_ECONFIG (no image...),
 * FIBER_ESPAWN (the server refused; message says why),
 * FIBER_EUNREACHABLE. */
int fb_k8s_master_start(const char *run, const char *const *argv,
                        const fiber_run_opts *o, const char *const *vars,
                        size_t n_vars, const char *image, char *pod,
                        size_t size);

/* Waits up to timeout_ms (negative: forever) for the pod to end; its
 * container's exit code in *exit_code (137 when the pod was deleted before
 * its container ended).  Returns 0, FIBER_ETIMEDOUT, FIBER_EBACKEND,
 * FIBER_EUNREACHABLE. */
int fb_k8s_master_wait(const char *pod, int timeout_ms, int *exit_code);

/* Copies the pod's log to fd as it is written, until the pod ends.
 * Returns 0, or the code of the refusal (a cluster whose nodes do not
 * serve logs). */
int fb_k8s_master_follow(const char *pod, int fd);

/* For fiber doctor: asks the configured API server for its version and
 * whether the account may list pods in its namespace, and writes one line
 * into detail ("Kubernetes v1.20.2 at https://...: namespace fiber-test,
 * pods allowed").  Returns 0, or the code of what failed with detail
 * saying why. */
int fb_k8s_describe(char *detail, size_t size);

/* For fiber top: where the master of run listens, whether its
 * connections are encrypted, and the run's token, as the cluster knows
 * them: the address and the encryption setting from the environment of
 * one of the run's job pods (FIBER_BOOT_ADDR, FIBER_ENCRYPTION: the
 * master hands its configuration to its jobs), the token (token_len
 * bytes) from the run's Secret "<run>-boot".  Needs the configured
 * account to read pods and secrets of the namespace.  Returns 0,
 * FIBER_ENOKEY (no job pod, or no Secret, of run), FIBER_ECONFIG (no
 * cluster configured), FIBER_EUNREACHABLE, FIBER_EBACKEND (refused),
 * FIBER_EPROTO. */
int fb_k8s_run_contact(const char *run, char *addr, size_t size,
                       int *encrypted, uint8_t *token, size_t token_len);

#endif /* FB_K8S_MASTER_H */
