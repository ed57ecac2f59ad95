/* shares.c - dynamic shares of a parallel loop (shares.h) */
#include "shares.h"

#include <stdlib.h>
#include <string.h>

#include "engine.h"

/* The calling thread's counters live in its scratch slot NORM_SCRATCH_SHARES, kept between
   calls: a header line with the last generation handed out (its low 32 bits in the counters),
   then one line a counter.  A loop's generation tells its claims from those of the loops
   before, so nothing is reset; new scratch comes zeroed, and generation 0 is never used. */
typedef struct share_head {
  uint64_t gen;
  char pad[64 - sizeof(uint64_t)];
} share_head;

int norm_shares_begin(norm_shares *s, int nt, int loops) {
  const size_t cap = 2 * (size_t)nt, bytes = sizeof(share_head) + cap * sizeof(norm_share_ctr);
  int fresh; /* new scratch comes zeroed (norm_scratch_ex) */
  char *m = norm_scratch_ex(NORM_SCRATCH_SHARES, bytes, &fresh);
  s->nt = nt;
  s->ctr = NULL;
  s->gen = 0;
  if (!m) return 0;
  share_head *h = (share_head *)m;
  norm_share_ctr *ctr = (norm_share_ctr *)(m + sizeof(share_head));
  if ((h->gen + (uint64_t)loops) >> 32 != h->gen >> 32) {
    /* the counters hold 32 bits of the generation: where those wrap, clear every counter, so
       that no stale one can match */
    memset(ctr, 0, cap * sizeof *ctr);
    h->gen = (h->gen + (uint64_t)loops) >> 32 << 32;
  }
  s->ctr = ctr;
  s->gen = h->gen + 1;
  h->gen += (uint64_t)loops;
  return 1;
}

/* NORMA_SHARES (shares.h): 0 dynamic (default), 1 static, 2 rotate */
static int shares_mode(void) {
  static int v = -1;
  if (v < 0) {
    const char *e = getenv("NORMA_SHARES");
    v = e && strcmp(e, "static") == 0 ? 1 : e && strcmp(e, "rotate") == 0 ? 2 : 0;
  }
  return v;
}

/* A share's counter: (generation << 32) | (lo << 16) | hi, its chunks [lo, hi) unclaimed.  The
   owner claims from the front (lo), in its walk's order; a thief from the back (hi), the chunk
   farthest from the owner's, whose lines the owner's prefetchers have not yet pulled in, and
   only while two or more are unclaimed (so the owner keeps one: a chunk run by the other core
   took about twice as long, its lines in the owner's caches, and taking the owner's last
   chunk ended the loop later; measured on Zen 5, inference NHWC 32x128x28x28, a stolen chunk
   75-80K cycles against 38K).  A counter of another generation reads as lo = 1, hi = nch: the
   owner's first chunk is its own without a claim (share_one).  Relaxed: the counter publishes
   nothing but the claim (the region's barriers order the data).  Returns the chunk, or -1;
   *last: it was the last unclaimed one. */
static int64_t share_claim(norm_share_ctr *c, uint64_t g, int64_t nch, int thief, int *last) {
  uint64_t old = atomic_load_explicit(&c->w, memory_order_relaxed);
  for (;;) {
    const int cur = (old >> 32) == (g & 0xffffffffu);
    const uint64_t lo = cur ? (old >> 16) & 0xffffu : 1, hi = cur ? old & 0xffffu : (uint64_t)nch;
    if (hi < lo + (thief ? 2 : 1)) return -1;
    const uint64_t nlo = thief ? lo : lo + 1, nhi = thief ? hi - 1 : hi;
    const uint64_t w = ((g & 0xffffffffu) << 32) | (nlo << 16) | nhi;
    if (atomic_compare_exchange_weak_explicit(&c->w, &old, w, memory_order_relaxed,
                                              memory_order_relaxed)) {
      *last = nhi == nlo;
      return (int64_t)(thief ? hi - 1 : lo);
    }
  }
}

static void share_chunk(const norm_shares *s, int64_t lo, int64_t len, int64_t nch, int64_t k,
                        norm_share_fn fn, struct norm_job *jb, void *arg) {
  const int64_t q = s->back ? nch - 1 - k : k;
  fn(jb, lo + len * q / nch, lo + len * (q + 1) / nch, arg);
}

/* Share sh: by its owner (own: the first chunk without a claim, then claims) or by a thief
   (claims only; share_claim).  A line that the other core holds costs a transfer (0.2-0.8 us
   between the 2-vCPU machines' cores), so none waits on the critical path: the owner fetches
   its counter for writing while it runs its first chunk (a thief's read of it in the last loop
   left it shared), and its last chunk fetches `next`, the counter it looks at next, so that
   finding nothing left to steal costs nothing. */
static void share_one(const norm_shares *s, int sh, int own, const norm_share_ctr *next,
                      norm_share_fn fn, struct norm_job *jb, void *arg) {
  const int64_t ns = s->mirror ? 2 * (int64_t)s->nt : s->nt;
  const int64_t lo = s->n * sh / ns, hi = s->n * (sh + 1) / ns, len = hi - lo;
  if (len <= 0) return;
  if (!s->ctr) { /* static shares */
    fn(jb, lo, hi, arg);
    return;
  }
  const int64_t most = len / (s->grain > 1 ? s->grain : 1);
  const int64_t nch = most < 1 ? 1 : most < NORM_SHARE_CHUNKS ? most : NORM_SHARE_CHUNKS;
  norm_share_ctr *c = &s->ctr[sh];
  if (own) {
    __builtin_prefetch(&c->w, 1);
    if (nch == 1 && next) __builtin_prefetch(&next->w, 0);
    share_chunk(s, lo, len, nch, 0, fn, jb, arg);
  }
  int64_t k;
  int last = 0;
  while ((k = share_claim(c, s->gen, nch, !own, &last)) >= 0) {
    if (own && last && next) __builtin_prefetch(&next->w, 0);
    share_chunk(s, lo, len, nch, k, fn, jb, arg);
  }
}

/* the shares of owner u in the order it takes them (-1: none) */
static void owner_shares(const norm_shares *s, int u, int *sh) {
  sh[0] = u, sh[1] = s->mirror ? 2 * s->nt - 1 - u : -1;
  if (s->mirror && s->own_rev) sh[0] = sh[1], sh[1] = u;
}

void norm_shares_run(const norm_shares *s, int t, norm_share_fn fn, struct norm_job *jb,
                     void *arg) {
  const int mode = shares_mode();
  int mine[2], theirs[2];
  if (!s->ctr || mode == 1 || s->nt <= 1) { /* static: its own shares, each in one call */
    norm_shares one = *s;
    one.ctr = NULL;
    owner_shares(s, t, mine);
    for (int i = 0; i < 2; i++)
      if (mine[i] >= 0) share_one(&one, mine[i], 1, NULL, fn, jb, arg);
    return;
  }
  /* its own shares (rotate: the next thread's, as if its own), then the others' in turn */
  const int first = mode == 2 ? (t + 1) % s->nt : t;
  owner_shares(s, first, mine);
  owner_shares(s, (first + 1) % s->nt, theirs);
  const norm_share_ctr *victim = &s->ctr[theirs[0]];
  share_one(s, mine[0], 1, mine[1] >= 0 ? NULL : victim, fn, jb, arg);
  if (mine[1] >= 0) share_one(s, mine[1], 1, victim, fn, jb, arg);
  for (int i = 1; i < s->nt; i++) {
    owner_shares(s, (first + i) % s->nt, theirs);
    for (int j = 0; j < 2; j++)
      if (theirs[j] >= 0) share_one(s, theirs[j], 0, NULL, fn, jb, arg);
  }
}
