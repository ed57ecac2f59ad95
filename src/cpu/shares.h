/* shares.h - dynamic shares: each thread works through its own share of a parallel loop, then
 * helps the others with what is left of theirs.
 *
 * The one idea: the static split (one contiguous share per thread) runs at the speed of the
 * slowest core.  On the 2-vCPU machines one vCPU was often 1.3-1.7x slower than the other for
 * the same loop in L1 or L2 (a neighbour on its physical core; which one, and whether at all,
 * changed within minutes), and hybrid CPUs (performance and efficiency cores) differ by design.
 * So a share is cut into a few chunks, claimed through a per-share counter: the owner claims
 * its chunks in order (its counter's cache line stays in its own cache), and a thread that has
 * finished its own shares claims the last chunk another has not started, while that one has
 * two or more left (share_claim).  Where the cores are equally fast every thread runs its
 * static share, as before, plus one uncontended compare-and-swap per chunk.
 *
 * Which thread runs a chunk never changes a bit: every loop run this way computes each item
 * from the item alone (an apply), or writes each item's partial results to the item's own
 * place, combined later in item order (the reductions' segments; engine.h).
 *
 * Testing knob NORMA_SHARES: "static" (each thread its share, no claims: the schedule before
 * the dynamic shares), "rotate" (each thread starts with the next thread's shares, so that
 * every chunk is claimed by a thread other than its owner unless that one gets there first:
 * the tests' way to run the stealing path on machines whose cores are equally fast).
 */
#ifndef NORMA_SHARES_H
#define NORMA_SHARES_H

#include <stdatomic.h>
#include <stdint.h>

/* chunks a share is cut into (fewer when it has fewer items) */
#define NORM_SHARE_CHUNKS 8

/* one claim counter a cache line: (generation << 32) | (first unclaimed chunk << 16) | end */
typedef struct norm_share_ctr {
  _Atomic uint64_t w;
  char pad[64 - sizeof(uint64_t)];
} norm_share_ctr;

/* A parallel loop over [0, n) in `nshares` equal shares: share s is [n s / nshares,
   n (s + 1) / nshares).  Thread t owns share t, and with `mirror` (nshares = 2 nt) also share
   2 nt - 1 - t, which it takes first when `own_rev`.  `back`: a share's chunks are claimed
   from its end.  fn(jb, i0, i1, arg) runs each chunk, of at least `grain` items where the share
   has them. */
typedef struct norm_shares {
  int64_t n, grain; /* grain: fewest items a chunk (0: 1) */
  int nt, mirror, own_rev, back;
  norm_share_ctr *ctr; /* 2 nt counters (norm_shares_begin) */
  uint64_t gen;        /* this loop's generation: counters of other generations are unclaimed */
} norm_shares;

/* The calling thread's counters for a loop of nt threads, and a generation for each of
   `loops` loops of one parallel region (gen, gen + 1, ...).  Returns 0 where the counters
   cannot be allocated: the loops then take their static shares (norm_shares_run with
   ctr NULL). */
int norm_shares_begin(norm_shares *s, int nt, int loops);

/* Runs thread t's part of the loop (call it on every thread of the region: each returns when no
   chunk is left that it may claim). */
struct norm_job;
typedef void (*norm_share_fn)(struct norm_job *jb, int64_t i0, int64_t i1, void *arg);
void norm_shares_run(const norm_shares *s, int t, norm_share_fn fn, struct norm_job *jb,
                     void *arg);

#endif
