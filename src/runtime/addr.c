/*
 * addr.c -- which address the master listens on when jobs dial it over
 * TCP: the listen_host key, "auto" by default.
 *
 * "auto" means, in this order:
 *   1. the IPv4 address of listen_interface, when that key is set;
 *   2. 127.0.0.1, when the backend's jobs share this host's network
 *      (FB_CAP_LOOPBACK: local processes, Docker's host network);
 *   3. the IPv4 address of the interface that carries the default route
 *      (/proc/net/route), which is the one other machines of a cluster
 *      reach, else the first other interface that is up and not loopback.
 * Loopback is never chosen for a backend whose jobs may run on other
 * machines: a job there could not dial it.
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "base/common.h"
#include "runtime/addr.h"

/* Writes to out the IPv4 address of interface name, or, with name NULL,
 * of the first interface that is up and not loopback.  Returns 0, or -1
 * if there is none.  names (names_size > 0) collects the interfaces that
 * have an IPv4 address, for messages. */
static int iface_addr(const char *name, char *out, size_t size, char *names,
                      size_t names_size)
{
    struct ifaddrs *all;
    if (getifaddrs(&all) != 0)
        return -1;
    int found = -1;
    size_t used = 0;
    if (names_size)
        names[0] = '\0';
    for (struct ifaddrs *i = all; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        if (names_size && used < names_size) {
            int n = snprintf(names + used, names_size - used, "%s%s",
                             used ? ", " : "", i->ifa_name);
            used += n > 0 ? (size_t)n : 0;
        }
        int match = name ? strcmp(i->ifa_name, name) == 0
                         : (i->ifa_flags & IFF_UP) &&
                               !(i->ifa_flags & IFF_LOOPBACK);
        if (found == 0 || !match)
            continue;
        const struct sockaddr_in *sin = (const void *)i->ifa_addr;
        if (inet_ntop(AF_INET, &sin->sin_addr, out, (socklen_t)size))
            found = 0;
    }
    freeifaddrs(all);
    return found;
}

/* The interface of the default route, from /proc/net/route. */
static int default_route_iface(char *name, size_t size)
{
    FILE *f = fopen("/proc/net/route", "re");
    if (!f)
        return -1;
    char line[256], ifname[64];
    unsigned long dest;
    int found = -1;
    while (found && fgets(line, sizeof line, f))
        if (sscanf(line, "%63s %lx", ifname, &dest) == 2 && dest == 0) {
            fb_strlcpy(name, ifname, size);
            found = 0;
        }
    fclose(f);
    return found;
}

int fb_listen_host_resolve(struct fb_config *c, int loopback_ok)
{
    if (strcmp(c->listen_host, "auto") != 0)
        return 0;
    char addr[INET_ADDRSTRLEN], names[256];
    if (c->listen_interface[0]) {
        if (iface_addr(c->listen_interface, addr, sizeof addr, names,
                       sizeof names) != 0)
            return fb_err(FIBER_ECONFIG,
                          "listen_interface '%s' has no IPv4 address; "
                          "interfaces with one: %s",
                          c->listen_interface, names[0] ? names : "none");
    } else if (loopback_ok) {
        fb_strlcpy(addr, "127.0.0.1", sizeof addr);
    } else {
        char ifname[64];
        if ((default_route_iface(ifname, sizeof ifname) != 0 ||
             iface_addr(ifname, addr, sizeof addr, NULL, 0) != 0) &&
            iface_addr(NULL, addr, sizeof addr, NULL, 0) != 0)
            return fb_err(FIBER_ECONFIG,
                          "the %s backend's jobs need an address of this "
                          "host that other machines reach, and none was "
                          "found; set listen_host or listen_interface",
                          c->backend);
    }
    fb_strlcpy(c->listen_host, addr, sizeof c->listen_host);
    return 0;
}
