/*
 * spin.h -- adaptive spinning before blocking.
 *
 * A wait that spins first saves the ~40-90 us a sleeping thread needs to
 * wake on these machines, but only pays off when the other side answers
 * within the spin; otherwise it burns a core someone else needs.  The
 * budget returns to its maximum each time a spin catches the event and
 * halves each time it does not; at zero, a full-length spin is tried
 * again every FB_SPIN_PROBE waits, so the budget recovers when the
 * machine frees up.
 */
#ifndef FB_SPIN_H
#define FB_SPIN_H

#define FB_SPIN_PROBE 64u

struct fb_spin {
    unsigned budget_us; /* the next spin's length */
    unsigned max_us;
    unsigned skipped;   /* waits without a spin since the budget hit 0 */
};

static inline void fb_spin_init(struct fb_spin *s, unsigned max_us)
{
    s->budget_us = max_us;
    s->max_us = max_us;
    s->skipped = 0;
}

/* Returns how long to spin before the next blocking wait (0: do not). */
static inline unsigned fb_spin_budget(struct fb_spin *s)
{
    if (s->budget_us == 0 && s->max_us > 0 && ++s->skipped >= FB_SPIN_PROBE) {
        /* A probe as long as a full spin: a short one could never catch a
         * round trip, and the budget would stay at zero for good (as it
         * did after the long waits of a pool's start-up). */
        s->skipped = 0;
        return s->max_us;
    }
    return s->budget_us;
}

/* Records whether the spin caught what it waited for. */
static inline void fb_spin_result(struct fb_spin *s, int caught)
{
    if (caught) {
        s->budget_us = s->max_us; /* spinning pays: spin fully again */
    } else {
        s->budget_us /= 2;
    }
}

#endif /* FB_SPIN_H */
