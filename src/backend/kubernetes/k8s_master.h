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
 *
 * A requeueable master (fiber_run_opts.requeue: `fiber run --requeue`) is
 * the Job "<run>-master" instead (batch/v1, backoffLimit 0), whose pods
 * ("<run>-master-xxxxx", same labels) carry FIBER_BOOT_REQUEUE=1: the Job
 * controller replaces a deleted or pre-empted pod, and each master counts
 * its start on the Job (fb_k8s_master_boot), which fiber_resumed()
 * reports.
 */
#ifndef FB_K8S_MASTER_H
#define FB_K8S_MASTER_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "fiber/fiber.h"

struct fb_k8s;
struct fb_config;

/* Opens the API with the caller's configuration (fiber_config_get: the
 * defaults, .fiberconfig and FIBER_* variables), as fb_k8s_open does.
 * With configured non-NULL, first tells whether kubernetes is configured
 * here at all (k8s_server set, or in a cluster): *configured = 0 and 0
 * returned, with nothing opened, when it is not. */
int fb_k8s_open_configured(struct fb_k8s *k, int *configured);

/* Creates the master's pod, or with o->requeue its Job; o->signal_s, when
 * set, is the pod's terminationGracePeriodSeconds.  argv[0] must be the
 * program's absolute path in the image; vars are "NAME=value" strings for
 * its environment.  Writes the pod's (the Job's) name to pod.  Returns 0, FIBER_ECONFIG (no image...),
 * FIBER_ESPAWN (the server refused; message says why),
 * FIBER_EUNREACHABLE. */
int fb_k8s_master_start(const char *run, const char *const *argv,
                        const fiber_run_opts *o, const char *const *vars,
                        size_t n_vars, const char *image, char *pod,
                        size_t size);

/* Adds the volumes of k8s_volumes ("claim:/path[:ro],...") to a pod's
 * volumes and its container's mounts (kubernetes.c: every job's pod, and
 * the master's).  Returns 0, FIBER_ECONFIG naming a bad entry. */
int fb_k8s_add_claims(const char *list, json_t *volumes, json_t *mounts);

/* Waits up to timeout_ms (negative: forever) for the pod to end (is_job:
 * the Job to finish or go); its container's exit code in *exit_code (a
 * Job's: its newest pod's; 137 when the pod, or the Job, was deleted
 * before its container ended).  Returns 0, FIBER_ETIMEDOUT,
 * FIBER_EBACKEND, FIBER_EUNREACHABLE. */
int fb_k8s_master_wait(const char *pod, int is_job, int timeout_ms,
                       int *exit_code);

/* Copies the pod's log to fd as it is written, until the pod ends; for a
 * Job (is_job), each of its pods' in turn until the Job has finished,
 * with a line on err_fd where one pod follows another.  Returns 0, or the
 * code of the refusal (a cluster whose nodes do not serve logs). */
int fb_k8s_master_follow(const char *pod, int is_job, int fd, int err_fd);

/* In a requeueable master (FIBER_BOOT_REQUEUE=1, in the pod of its Job),
 * at fiber_init: counts this start on the Job's annotation fiber.starts
 * and writes the starts before it to *resumed; when that is not 0, waits
 * for the master's previous pod to end (a deleted pod's replacement
 * starts during its grace period), up to its grace and a minute, so that
 * this master reads what that one's stop callbacks saved.  When an
 * earlier master pod ended by itself (a status that is neither
 * FIBER_EXIT_REQUEUE nor a signal's), the run is over: the process exits
 * at once with that status instead of running the program again (the Job
 * controller may start one more pod after such an end, counting it
 * late).  Needs get and patch on jobs.  Returns 0, FIBER_ECONFIG (not in a cluster),
 * FIBER_EBACKEND (refused, no such Job), FIBER_EUNREACHABLE. */
int fb_k8s_master_boot(const struct fb_config *cfg, int *resumed);

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
