/*
 * k8s-pause.c -- the pause program of the test cluster's pod sandboxes
 * (scripts/k8s-local.sh builds it statically and imports it as the only
 * file of image fiber-k8s/pause FROM scratch: there is no registry to pull
 * a pause image from).  It holds the pod's namespaces: it waits in
 * pause() until SIGTERM or SIGINT, then exits 0, and reaps any child that
 * ends up with it (it is the pod's init).
 */
#include <signal.h>
#include <stddef.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig)
{
    (void)sig;
    stop = 1;
}

static void on_child(int sig)
{
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

int main(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    while (!stop)
        pause();
    return 0;
}
