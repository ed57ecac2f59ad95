/* fuzz_bn_query_plan.c - norma_bn_query_plan against norma.h: any descriptor the op accepts,
   however large (no tensor is touched), gives a plan; anything else is rejected with the plan
   untouched (fuzz_common.h). */
#include "fuzz_common.h"

typedef struct ctx {
  fz_bn b;
  int op;
} ctx;

static norma_status call(fz_case *k) {
  const ctx *c = k->ctx;
  return norma_bn_query_plan(fz_bn_ptr(&c->b), (norma_bn_op)c->op, k->a[0].p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz r = {data, size};
  fz_settings(&r);
  ctx c;
  const unsigned ov = fz_u8(&r);
  c.op = ov < 240 ? (int)(ov % 3) : (ov & 1 ? -1 : 3 + (int)(ov % 7));
  const int training = c.op == NORMA_BN_OP_FORWARD_TRAINING  ? FZ_TRAIN_YES
                       : c.op == NORMA_BN_OP_BACKWARD        ? FZ_TRAIN_UNLESS_GLOBAL
                                                             : FZ_TRAIN_NO;
  fz_bn_make(&r, &c.b, 1, training, 8);
  const int op_ok = c.op >= 0 && c.op <= 2;
  fz_arg a[1] = {{"plan", FZ_OUT, FZ_I64, FZ_REQ, 0, (sizeof(norma_bn_plan) + 7) / 8, 0, 0, 0}};
  fz_case k = {.ctx = &c};
  if (!fz_setup(&r, &k, a, 1, NORMA_F64, 1)) return 0;
  norma_status st = call(&k);
  fz_check(&k, st, fz_expect(&k, !op_ok || !c.b.valid, 0), call);
  if (st == NORMA_OK) {
    const norma_bn_plan *p = a[0].p;
    if (p->dram_passes < 1 || p->dram_passes > 3 || p->threads < 1 || p->fused < 0 ||
        p->fused > 1 || (p->fused && p->unit < 1) || (unsigned)p->isa > NORMA_ISA_AVX512 ||
        (p->streaming_stores != 0 && p->streaming_stores != 1) ||
        p->reference != norma_get_use_reference())
      fz_fail(&k, "implausible plan: passes %d fused %d unit %lld threads %d isa %d",
              p->dram_passes, p->fused, (long long)p->unit, p->threads, (int)p->isa);
  }
  fz_free(&k);
  return 0;
}
