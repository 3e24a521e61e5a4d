/*
 * noise.h -- the shared noise table and the random numbers of the ES
 * example.
 *
 * Every process (the master and each pool worker) builds the same table of
 * standard normal floats from one seed, so a perturbation travels as an
 * offset into the table instead of as a vector of floats.
 */
#ifndef ES_NOISE_H
#define ES_NOISE_H

#include <stddef.h>
#include <stdint.h>

/* splitmix64: a tiny, fast generator whose whole state is one uint64_t,
 * which makes it trivial to seed, to derive streams from and to save in a
 * checkpoint. */
uint64_t es_rand64(uint64_t *state);

/* A double uniform in the open interval (0, 1). */
double es_uniform(uint64_t *state);

/* A standard normal double (Box-Muller; the second value is discarded). */
double es_normal(uint64_t *state);

/* Fills dst[0..n) with standard normal floats from seed (n even). */
void es_noise_fill(float *dst, size_t n, uint64_t seed);

/* A 64-bit hash of the table's bit patterns: master and workers compare
 * theirs so that a host whose libm rounds differently is refused instead
 * of silently following other gradients. */
uint64_t es_noise_hash(const float *table, size_t n);

/* The process's table: 2^log2 floats from seed.  Building it again with
 * the same parameters is a no-op.  Returns 0, or -1 (out of memory or a
 * log2 outside 10..28). */
int es_noise_init(uint64_t seed, unsigned log2);

/* The process's table and its length in floats (NULL/0 before init). */
const float *es_noise_table(size_t *n);

/* The process's table hash (0 before init). */
uint64_t es_noise_table_hash(void);

/* Releases the process's table. */
void es_noise_free(void);

#endif
