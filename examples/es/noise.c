/*
 * noise.c -- the shared noise table (see noise.h).
 */
#include "noise.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static float *table;
static size_t table_n;
static uint64_t table_seed;
static uint64_t table_hash;

uint64_t es_rand64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double es_uniform(uint64_t *state)
{
    /* 53 random bits, offset by half a step so that 0 never comes out
     * (Box-Muller takes its logarithm). */
    return ((double)(es_rand64(state) >> 11) + 0.5) * 0x1p-53;
}

double es_normal(uint64_t *state)
{
    double u1 = es_uniform(state), u2 = es_uniform(state);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void es_noise_fill(float *dst, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    /* Double precision throughout, rounded once to float: the result then
     * depends only on libm's log/sin/cos, which the hash check guards. */
    for (size_t i = 0; i + 1 < n; i += 2) {
        double r = sqrt(-2.0 * log(es_uniform(&s)));
        double a = 2.0 * M_PI * es_uniform(&s);
        dst[i] = (float)(r * cos(a));
        dst[i + 1] = (float)(r * sin(a));
    }
}

uint64_t es_noise_hash(const float *t, size_t n)
{
    /* FNV-1a over 32-bit words: 4x fewer rounds than over bytes, and a
     * one-bit difference anywhere still changes the result. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &t[i], sizeof bits);
        h = (h ^ bits) * 0x100000001b3ull;
    }
    return h;
}

int es_noise_init(uint64_t seed, unsigned log2)
{
    if (log2 < 10 || log2 > 28)
        return -1;
    size_t n = (size_t)1 << log2;
    if (table && table_n == n && table_seed == seed)
        return 0;
    float *t = malloc(n * sizeof *t);
    if (!t)
        return -1;
    es_noise_fill(t, n, seed);
    free(table);
    table = t;
    table_n = n;
    table_seed = seed;
    table_hash = es_noise_hash(t, n);
    return 0;
}

const float *es_noise_table(size_t *n)
{
    if (n)
        *n = table_n;
    return table;
}

uint64_t es_noise_table_hash(void)
{
    return table_hash;
}

void es_noise_free(void)
{
    free(table);
    table = NULL;
    table_n = 0;
    table_hash = 0;
}
