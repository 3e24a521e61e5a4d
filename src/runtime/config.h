/*
 * config.h -- fiber's configuration: keys, layers and validation.
 *
 * Layers, lowest priority first: built-in defaults, the INI file
 * (.fiberconfig in the working directory), FIBER_<KEY> environment
 * variables, then values set in code with fiber_config_set().  Each value
 * remembers where it came from, so an error can say ".fiberconfig:3" or
 * "environment variable FIBER_LOG_LEVEL".
 *
 * Environment variables that start with FIBER_BOOT_ are fiber's own
 * bootstrap channel from master to child and are not configuration.
 */
#ifndef FB_CONFIG_H
#define FB_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define FB_TRANSPORT_IPC 0
#define FB_TRANSPORT_TCP 1

struct fb_config {
    char backend[32];           /* "local" */
    int log_level;              /* enum fiber_log_level */
    char log_dir[512];          /* "" = default, decided by the runtime */
    char log_file[512];         /* Fiber's prefix: <log_file>.<name>; "" = off */
    int transport;              /* FB_TRANSPORT_* */
    char listen_host[256];      /* tcp only; "auto" (addr.c) by default */
    int connect_timeout_ms;     /* > 0 */
    int terminate_grace_ms;     /* >= 0 */
    uint32_t max_message_bytes; /* 1 KiB .. 1 GiB */
    int heartbeat_ms;           /* pool workers' heartbeat; 0 = off */
    int fork_server;            /* local: fork jobs from the job command's
                                   fork server when there is one; 1 */
    int time_limit_margin_ms;   /* replace a worker this long before its
                                   job's time limit; 0 = automatic */
    int resumed;                /* times the run was restarted (FIBER_RESUMED,
                                   set by `fiber run --requeue`); 0 */
    char image[256];            /* container image; "" = none */
    char docker_socket[108];    /* the Docker engine's unix socket */
    char docker_network[64];    /* docker jobs' network mode; "host" */
    char docker_mounts[512];    /* "src:dst[:ro],..." extra bind mounts */
    int docker_build_image;     /* no image: build one of the program; 0 */
    char listen_interface[32];  /* tcp: listen on this interface's address */
    int encryption;             /* encrypt tcp traffic (libsodium); 1 */
    int max_pending_connections; /* unauthenticated peers at once; 256 */
    char slurm_dir[512];        /* shared folder for job files; "" = default */
    char slurm_partition[64];   /* sbatch --partition; "" = the default */
    char slurm_account[64];     /* sbatch --account; "" = none */
    char slurm_time_limit[32];  /* sbatch --time; "" = the partition's */
    char slurm_sbatch_args[512]; /* extra sbatch arguments, space-separated */
    char k8s_server[256];       /* https://host:port; "" = in-cluster */
    char k8s_token_file[512];   /* bearer token file; "" = in-cluster */
    char k8s_ca_file[512];      /* CA bundle; "" = in-cluster */
    char k8s_namespace[64];     /* "" = in-cluster namespace or "default" */
    char k8s_config_dir[512];   /* the in-cluster service-account folder */
    char k8s_volumes[512];      /* "claim:/path[:ro],..." PVC mounts */
    int k8s_host_network;       /* pods use the node's network; 0 */
    char k8s_pull_policy[16];   /* imagePullPolicy; "" = cluster default */
    int object_cache_mb;        /* a child's cache of shared objects; 4096 */
    int object_shm;             /* same-host children map the master's copy */
    int manager_shm;            /* same-host clients map a manager's objects */
    int pymalloc_keep_mb;       /* freed pymalloc arenas a Python process keeps */
};

/* Fills c with the built-in defaults. */
void fb_config_defaults(struct fb_config *c);

/* Parses value for key and stores it in c.  origin says where the pair
 * came from, for messages ("fiber_config_set", ".fiberconfig:3",
 * "environment variable FIBER_LOG_LEVEL").  Returns 0, or FIBER_ECONFIG
 * with a message naming the key, the origin and, for a bad value, what
 * would be accepted; c is unchanged on failure. */
int fb_config_apply(struct fb_config *c, const char *key, const char *value,
                    const char *origin);

/* Applies every key of the INI file at path.  A missing file is not an
 * error (returns 0).  Keys may stand before any section or under [fiber];
 * under Uber Fiber's [default], Fiber's key names and values are accepted
 * too, mapped onto fiber's (default_backend -> backend, log_level =
 * warning -> warn, log_file -> its folder as log_dir, ...), and Fiber's
 * keys fiber has no counterpart for are an error saying why; any other
 * section is an error.  Returns 0 or FIBER_ECONFIG (a syntax
 * error, an unknown key or a bad value, named with file and line). */
int fb_config_load_file(struct fb_config *c, const char *path);

/* Applies every FIBER_<KEY> variable of envp (NULL-terminated, as environ),
 * except FIBER_BOOT_*.  An unknown FIBER_ variable is an error naming it. */
int fb_config_load_env(struct fb_config *c, char *const *envp);

/* Writes the effective value of key as text into buf.  Returns 0 or
 * FIBER_ECONFIG for an unknown key. */
int fb_config_format(const struct fb_config *c, const char *key, char *buf,
                     size_t size);

/* Returns the name of the i-th configuration key (0-based, in table
 * order), or NULL past the last one. */
const char *fb_config_key_at(size_t i);

/* Returns 1 if key is a known configuration key, else 0. */
int fb_config_known(const char *key);

#endif /* FB_CONFIG_H */
