/* bench_es_paper.h -- bench-es (c), the Fiber paper's scale
 * (bench_es_paper.c). */
#ifndef BENCH_ES_PAPER_H
#define BENCH_ES_PAPER_H

#define PAPER_POP 2048
#define PAPER_PARAMS 100000
#define PAPER_MAX_ROWS 8

struct paper_row {
    int workers;
    /* [0]: the policy in every record; [1]: put once, shared */
    double ms[2], cpu_s[2], bytes[2];
    double peer_ms, peer_bytes; /* multiprocessing.Pool, per record */
};

/* Runs (c) at 1, 2, 4, 16, 64, 256, 512 workers up to max_workers, iters
 * measured iterations each.  Fills rows; returns 0 or -1. */
int bench_es_paper(int max_workers, int iters, struct paper_row *rows,
                   int *nrows);

#endif
