/*
 * pool_sets.c -- the sets and totals the pool's scheduler keeps as its
 * workers change, so that the cost of a pass of the progress loop depends
 * on what happened, not on how many workers exist.
 *
 *   idle     ready workers holding nothing: dispatch feeds these first
 *   hungry   ready workers holding less than their credit
 *   dirty    workers with output queued whose socket is not known full
 *   heard    connected workers, the one heard from longest ago first:
 *            the heartbeat check looks only at the head
 *   stopq    retiring workers that have not been sent STOP
 *
 * and pool->count, the sums of every worker's struct fb_wcount.  Every
 * change to a worker is followed by fb_pool_note(), which recomputes
 * where that one worker belongs (O(1)).  The lists are intrusive: each
 * worker has one link per kind of list.
 */
#include "pool/pool_int.h"

void fb_wlist_init(struct fb_wlist *l, int link)
{
    l->head = l->tail = NULL;
    l->len = 0;
    l->link = link;
}

void fb_wlist_drop(struct fb_worker *w, int link)
{
    struct fb_wlink *k = &w->link[link];
    struct fb_wlist *l = k->on;
    if (!l)
        return;
    if (k->prev)
        k->prev->link[link].next = k->next;
    else
        l->head = k->next;
    if (k->next)
        k->next->link[link].prev = k->prev;
    else
        l->tail = k->prev;
    k->prev = k->next = NULL;
    k->on = NULL;
    l->len--;
}

void fb_wlist_push(struct fb_wlist *l, struct fb_worker *w)
{
    fb_wlist_drop(w, l->link);
    struct fb_wlink *k = &w->link[l->link];
    k->prev = l->tail;
    k->next = NULL;
    if (l->tail)
        l->tail->link[l->link].next = w;
    else
        l->head = w;
    l->tail = w;
    k->on = l;
    l->len++;
}

/* Puts w on want (NULL: on none) for want's link, unless it is there. */
static void place(struct fb_worker *w, int link, struct fb_wlist *want)
{
    if (w->link[link].on == want)
        return;
    if (want)
        fb_wlist_push(want, w);
    else
        fb_wlist_drop(w, link);
}

static void recount(struct fiber_pool *p, struct fb_worker *w)
{
    struct fb_wcount now = {
        .alive = w->state != W_GONE,
        .live = w->state != W_GONE && !w->retire,
        .starting = w->state == W_STARTING || w->state == W_INIT,
        .ready = w->state == W_READY,
        .stopping = w->state != W_GONE && w->retire && !w->stop_sent,
        .inflight = w->inflight,
    };
    p->count.alive += now.alive - w->counted.alive;
    p->count.live += now.live - w->counted.live;
    p->count.starting += now.starting - w->counted.starting;
    p->count.ready += now.ready - w->counted.ready;
    p->count.stopping += now.stopping - w->counted.stopping;
    p->count.inflight += now.inflight - w->counted.inflight;
    w->counted = now;
}

void fb_pool_note(struct fiber_pool *p, struct fb_worker *w)
{
    recount(p, w);
    struct fb_wlist *feed = NULL;
    if (w->state == W_READY && !w->retire && w->has_conn &&
        !(w->head && w->head->isolated)) {
        /* Hungry below its credit once it holds one chunk or a third of
         * its credit is free, not as soon as one task is: refilled a task
         * at a time as results trickle back, a worker would get chunks
         * of one. */
        if (w->inflight == 0)
            feed = &p->idle;
        else if (w->inflight < p->credit &&
                 (w->head == w->tail ||
                  w->inflight <= p->credit - (p->credit + 2) / 3))
            feed = &p->hungry;
    }
    place(w, WL_FEED, feed);
    int queued = w->has_conn && fb_conn_pending(&w->conn);
    place(w, WL_DIRTY, queued && !w->want_out ? &p->dirty : NULL);
    if (!w->has_conn)
        fb_wlist_drop(w, WL_HEARD);
    else if (!w->link[WL_HEARD].on)
        fb_wlist_push(&p->heard, w);
    place(w, WL_STOP, w->counted.stopping ? &p->stopq : NULL);
}

void fb_pool_retire_all(struct fiber_pool *p)
{
    if (p->all_retired)
        return;
    p->all_retired = 1;
    for (int i = 0; i < p->n_workers; i++) {
        p->workers[i]->retire = 1;
        fb_pool_note(p, p->workers[i]);
    }
}
