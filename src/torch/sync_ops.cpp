/* sync_ops.cpp - the split API of norma.h as PyTorch operators, for synchronized BatchNorm over
   a communication library that Python drives (torch.distributed) and for exact population
   statistics (norma.torch.recompute_bn_stats).

   A rank's partial results travel as one float64 "record": a header of kHeader values
   [status, count, eps, fingerprint] and the per-channel data:
     forward  [header | mean[c] | m2[c]]                      (norma_bn_moments)
     backward [header | sum_dy[c] | sum_dy_xhat[c] | sum_xhat[c]]   (norma_bn_backward_reduce)
   status is the norma_status of the rank's local call (0: OK; the data are then zeros), count
   the values per channel, and eps and the fingerprint (the statistics flags, +256 for float64
   parameters) what every rank must agree on.  The caller gathers the records of every rank and
   checks the headers (python/norma/torch/_sync.py), then combines them here in rank order:
   Chan's merge (norma_bn_moments_merge) forward, sums backward.  Every rank combines the same
   bytes in the same order, so the statistics are bitwise identical on every rank.

   norma::bn_record_forward(x, eps, flags) -> record
   norma::bn_merge_records(records[P, L]) -> record          (forward records, rank order)
   norma::bn_sync_forward(x, residual, weight, bias, merged, running_mean, running_var,
                          running_count, momentum, eps, flags) -> (y, save_mean, save_invstd)
   norma::bn_record_backward(x, y, dy, weight, bias, save_mean, save_invstd, flags) -> record
   norma::bn_sum_records(records[P, L]) -> record            (backward records, rank order)
   norma::bn_sync_backward(x, y, dy, weight, bias, save_mean, save_invstd, summed, flags,
                           param_grads) -> (dx, dweight, dbias, dresidual) */
#include <cmath>
#include <vector>

#include "norma_torch.h"

using namespace norma_torch;

namespace {

constexpr int64_t kHeader = 4;
enum { H_STATUS = 0, H_COUNT = 1, H_EPS = 2, H_FP = 3 };
constexpr int64_t kFpParamF64 = 256;
/* norma.h, norma_bn_backward_apply: norma_bn_backward removes the x_hat offset only when
   |sum_xhat / count| <= 1/16 (what rounding a stored mean can cause); callers of the split API
   that want that rule apply it themselves.  libnorma_mpi does the same. */
constexpr double kMeanCorrectionMax = 0.0625;

at::Tensor opt(const c10::optional<at::Tensor> &t) {
  return t.has_value() ? *t : at::Tensor();
}

double fingerprint(const Dense &X, int64_t flags, unsigned stat_flags) {
  return (double)((flags & stat_flags) + (X.dtype == NORMA_F64 ? kFpParamF64 : 0));
}

at::Tensor new_record(int64_t c, int64_t per_channel) {
  return at::zeros({kHeader + per_channel * c}, at::dtype(at::kDouble));
}

/* Per-channel arrays as double (save_mean / save_invstd of float layers). */
at::Tensor as_double(const at::Tensor &t) {
  return t.scalar_type() == at::kDouble && t.is_contiguous() ? t
                                                             : t.to(at::kDouble).contiguous();
}

at::Tensor bn_record_forward(const at::Tensor &x, double eps, int64_t flags) {
  const Dense X = dense(x, "x");
  at::Tensor rec = new_record(X.c, 2);
  double *h = rec.data_ptr<double>();
  h[H_EPS] = eps;
  h[H_FP] = fingerprint(X, flags, NORMA_BN_BIASED_RUNNING_VAR | NORMA_BN_COUNT_WEIGHTED);
  std::vector<int64_t> count((size_t)X.c);
  norma_bn_desc d = X.desc(eps, flags & (kCFlags & ~(NORMA_BN_RELU | NORMA_BN_ADD_RELU)));
  norma_status st = norma_bn_moments(&d, X.ptr(), count.data(), h + kHeader, h + kHeader + X.c);
  if (st != NORMA_OK) {
    rec.zero_();
    h[H_STATUS] = (double)st; /* the message stays in norma_last_error() for this thread */
    h[H_EPS] = eps;
    return rec;
  }
  h[H_COUNT] = (double)count[0];
  return rec;
}

at::Tensor bn_merge_records(const at::Tensor &records) {
  TORCH_CHECK_VALUE(records.dim() == 2 && records.scalar_type() == at::kDouble &&
                        records.size(1) > kHeader && (records.size(1) - kHeader) % 2 == 0,
                    "records must be a [ranks, 4 + 2 * C] float64 tensor");
  const at::Tensor r = records.contiguous();
  const int64_t P = r.size(0), L = r.size(1), c = (L - kHeader) / 2;
  at::Tensor out = r[0].clone();
  double *o = out.data_ptr<double>();
  std::vector<int64_t> na((size_t)c), nb((size_t)c);
  for (int64_t k = 1; k < P; k++) {
    const double *b = r.data_ptr<double>() + k * L;
    const int64_t ca = (int64_t)o[H_COUNT], cb = (int64_t)b[H_COUNT];
    if (cb == 0) continue; /* an empty rank is the identity: no bit changes */
    if (ca == 0) {
      std::copy(b + kHeader, b + L, o + kHeader);
    } else {
      std::fill(na.begin(), na.end(), ca);
      std::fill(nb.begin(), nb.end(), cb);
      check(norma_bn_moments_merge(c, na.data(), o + kHeader, o + kHeader + c, nb.data(),
                                   b + kHeader, b + kHeader + c),
            "norma_bn_moments_merge");
    }
    o[H_COUNT] = (double)(ca + cb);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bn_sync_forward(
    const at::Tensor &x, const c10::optional<at::Tensor> &residual,
    const c10::optional<at::Tensor> &weight, const c10::optional<at::Tensor> &bias,
    const at::Tensor &merged, const c10::optional<at::Tensor> &running_mean,
    const c10::optional<at::Tensor> &running_var, const c10::optional<at::Tensor> &running_count,
    double momentum, double eps, int64_t flags) {
  const Dense X = dense(x, "x");
  const int64_t c = X.c;
  TORCH_CHECK_VALUE(merged.dim() == 1 && merged.scalar_type() == at::kDouble &&
                        merged.numel() == kHeader + 2 * c,
                    "merged must be a forward record of ", kHeader + 2 * c, " float64 values");
  const at::Tensor rec = merged.contiguous();
  const double *h = rec.data_ptr<double>();
  const int64_t total = (int64_t)h[H_COUNT];
  const bool add_relu = (flags & NORMA_BN_ADD_RELU) != 0;
  Dense R;
  if (add_relu) {
    TORCH_CHECK_VALUE(opt(residual).defined(), "NORMA_BN_ADD_RELU needs the residual");
    R = dense_like(*residual, X, "residual");
  }
  const at::Tensor w = param_in(weight, X, "weight"), b = param_in(bias, X, "bias");
  InOut rm = param_inout(running_mean, c, X.pdtype, "running_mean");
  InOut rv = param_inout(running_var, c, X.pdtype, "running_var");
  const bool counted = (flags & NORMA_BN_COUNT_WEIGHTED) != 0 && (rm.ptr() || rv.ptr());
  InOut rc;
  if (counted) {
    TORCH_CHECK_VALUE(opt(running_count).defined(),
                      "count-weighted running statistics need running_count");
    rc = param_inout(running_count, 1, at::kDouble, "running_count");
    if (*static_cast<double *>(rc.ptr()) < 0) { /* not known yet: adopt this batch's */
      if (rc.work.is_same(rc.target)) rc.work = rc.work.clone();
      *static_cast<double *>(rc.ptr()) = (double)total;
    }
  }
  std::vector<int64_t> count((size_t)c, total);
  at::Tensor stats = at::empty({2 * c}, at::dtype(at::kDouble));
  double *mean = stats.data_ptr<double>(), *invstd = mean + c;
  at::Tensor sm = param_out(X), si = param_out(X);
  const norma_bn_desc d = X.desc(eps, flags & ~int64_t(NORMA_CHECK_FINITE));
  const double *gm = h + kHeader, *gm2 = gm + c;
  check(norma_bn_stats_from_moments(&d, count.data(), gm, gm2, mean, invstd, sm.data_ptr(),
                                    si.data_ptr(), counted ? nullptr : rm.ptr(),
                                    counted ? nullptr : rv.ptr(), momentum),
        "norma_bn_stats_from_moments");
  if (counted) {
    std::vector<double> var((size_t)c);
    for (int64_t j = 0; j < c; j++) {
      const double v = gm2[j] / (double)total;
      var[(size_t)j] = v < 0.0 ? 0.0 : v;
    }
    check(norma_bn_running_update(&d, total, gm, var.data(), rm.ptr(), rv.ptr(),
                                  static_cast<double *>(rc.ptr()), momentum),
          "norma_bn_running_update");
  }
  at::Tensor y = empty_like(X);
  if (X.n > 0)
    check(norma_bn_forward_apply(&d, X.ptr(), add_relu ? R.ptr() : nullptr, ptr(w), ptr(b), mean,
                                 invstd, y.data_ptr()),
          "norma_bn_forward_apply");
  rm.commit();
  rv.commit();
  rc.commit();
  return {y, sm, si};
}

at::Tensor bn_record_backward(const c10::optional<at::Tensor> &x_,
                              const c10::optional<at::Tensor> &y_, const at::Tensor &dy,
                              const c10::optional<at::Tensor> &weight,
                              const c10::optional<at::Tensor> &bias,
                              const at::Tensor &save_mean, const at::Tensor &save_invstd,
                              int64_t flags) {
  const at::Tensor x = opt(x_), y = opt(y_);
  TORCH_CHECK_VALUE(x.defined() || y.defined(), "bn_record_backward needs x or y");
  const Dense ref = dense(x.defined() ? x : y, x.defined() ? "x" : "y");
  const bool act = (flags & (NORMA_BN_RELU | NORMA_BN_ADD_RELU)) != 0;
  Dense Y;
  const bool use_y = y.defined() && (!x.defined() || act);
  if (use_y) Y = dense_like(y, ref, "y");
  const Dense DY = dense_like(dy, ref, "grad_output");
  const at::Tensor w = param_in(weight, ref, "weight"), b = param_in(bias, ref, "bias");
  const at::Tensor sm = as_double(param_in(save_mean, ref, "save_mean"));
  const at::Tensor si = as_double(param_in(save_invstd, ref, "save_invstd"));
  const int64_t c = ref.c;
  at::Tensor rec = new_record(c, 3);
  double *h = rec.data_ptr<double>();
  h[H_FP] = fingerprint(ref, flags, NORMA_BN_GLOBAL_STATS);
  const norma_bn_desc d = ref.desc(0.0, flags);
  norma_status st = norma_bn_backward_reduce(
      &d, x.defined() ? ref.ptr() : nullptr, use_y ? Y.ptr() : nullptr, DY.ptr(), ptr(w), ptr(b),
      sm.data_ptr<double>(), si.data_ptr<double>(), h + kHeader, h + kHeader + c,
      x.defined() ? h + kHeader + 2 * c : nullptr);
  if (st != NORMA_OK) {
    rec.zero_();
    h[H_STATUS] = (double)st;
    return rec;
  }
  h[H_COUNT] = (double)(ref.n * ref.spatial);
  /* x_hat recovered from y carries no rounding offset: flagged in the eps slot (unused
     backward), so that the correction is skipped on every rank alike */
  h[H_EPS] = x.defined() ? 0.0 : 1.0;
  return rec;
}

at::Tensor bn_sum_records(const at::Tensor &records) {
  TORCH_CHECK_VALUE(records.dim() == 2 && records.scalar_type() == at::kDouble &&
                        records.size(1) > kHeader && (records.size(1) - kHeader) % 3 == 0,
                    "records must be a [ranks, 4 + 3 * C] float64 tensor");
  const at::Tensor r = records.contiguous();
  const int64_t P = r.size(0), L = r.size(1);
  at::Tensor out = r[0].clone();
  double *o = out.data_ptr<double>();
  for (int64_t k = 1; k < P; k++) {
    const double *b = r.data_ptr<double>() + k * L;
    o[H_COUNT] += b[H_COUNT];
    o[H_EPS] = (o[H_EPS] != 0.0 || b[H_EPS] != 0.0) ? 1.0 : 0.0;
    for (int64_t i = kHeader; i < L; i++) o[i] += b[i];
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> bn_sync_backward(
    const c10::optional<at::Tensor> &x_, const c10::optional<at::Tensor> &y_,
    const at::Tensor &dy, const c10::optional<at::Tensor> &weight,
    const c10::optional<at::Tensor> &bias, const at::Tensor &save_mean,
    const at::Tensor &save_invstd, const at::Tensor &summed, int64_t flags, bool param_grads) {
  const at::Tensor x = opt(x_), y = opt(y_);
  TORCH_CHECK_VALUE(x.defined() || y.defined(), "bn_sync_backward needs x or y");
  const Dense ref = dense(x.defined() ? x : y, x.defined() ? "x" : "y");
  const int64_t c = ref.c;
  TORCH_CHECK_VALUE(summed.dim() == 1 && summed.scalar_type() == at::kDouble &&
                        summed.numel() == kHeader + 3 * c,
                    "summed must be a backward record of ", kHeader + 3 * c, " float64 values");
  const at::Tensor rec = summed.contiguous();
  const double *h = rec.data_ptr<double>();
  const bool global_stats = (flags & NORMA_BN_GLOBAL_STATS) != 0;
  const int64_t total = (int64_t)h[H_COUNT];
  const int64_t count = total >= 1 ? total : 1; /* 0 only with GLOBAL_STATS: sums are 0 */
  const double *sdy = h + kHeader, *sdyx = sdy + c, *sxh = sdy + 2 * c;
  std::vector<double> sx;
  if (!global_stats && h[H_EPS] == 0.0) {
    sx.resize((size_t)c);
    for (int64_t j = 0; j < c; j++) {
      const double s = sxh[j] / (double)count;
      sx[(size_t)j] = (s <= kMeanCorrectionMax && s >= -kMeanCorrectionMax) ? sxh[j] : 0.0;
    }
  }
  const bool act = (flags & (NORMA_BN_RELU | NORMA_BN_ADD_RELU)) != 0;
  Dense Y;
  const bool use_y = y.defined() && (!x.defined() || act);
  if (use_y) Y = dense_like(y, ref, "y");
  const Dense DY = dense_like(dy, ref, "grad_output");
  const at::Tensor w = param_in(weight, ref, "weight"), b = param_in(bias, ref, "bias");
  const at::Tensor sm = as_double(param_in(save_mean, ref, "save_mean"));
  const at::Tensor si = as_double(param_in(save_invstd, ref, "save_invstd"));
  const norma_bn_desc d = ref.desc(0.0, flags & ~int64_t(NORMA_CHECK_FINITE));
  at::Tensor dx = empty_like(ref), dres, dw, db;
  if (flags & NORMA_BN_ADD_RELU) dres = empty_like(ref);
  if (ref.n > 0)
    check(norma_bn_backward_apply(&d, x.defined() ? ref.ptr() : nullptr,
                                  use_y ? Y.ptr() : nullptr, DY.ptr(), ptr(w), ptr(b),
                                  sm.data_ptr<double>(), si.data_ptr<double>(), sdy, sdyx,
                                  sx.empty() ? nullptr : sx.data(), count, dx.data_ptr(),
                                  ptr(dres)),
          "norma_bn_backward_apply");
  if (param_grads) {
    dw = param_out(ref);
    db = param_out(ref);
    check(norma_bn_param_grads(&d, sdy, sdyx, sx.empty() ? nullptr : sx.data(), count,
                               dw.data_ptr(), db.data_ptr()),
          "norma_bn_param_grads");
  }
  return {dx, dw, db, dres};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(norma, m) {
  m.def("bn_record_forward(Tensor x, float eps, int flags) -> Tensor", &bn_record_forward);
  m.def("bn_merge_records(Tensor records) -> Tensor", &bn_merge_records);
  m.def("bn_sync_forward(Tensor x, Tensor? residual, Tensor? weight, Tensor? bias, "
        "Tensor merged, Tensor(a!)? running_mean, Tensor(b!)? running_var, "
        "Tensor(c!)? running_count, float momentum, float eps, int flags) "
        "-> (Tensor, Tensor, Tensor)",
        &bn_sync_forward);
  m.def("bn_record_backward(Tensor? x, Tensor? y, Tensor dy, Tensor? weight, Tensor? bias, "
        "Tensor save_mean, Tensor save_invstd, int flags) -> Tensor",
        &bn_record_backward);
  m.def("bn_sum_records(Tensor records) -> Tensor", &bn_sum_records);
  m.def("bn_sync_backward(Tensor? x, Tensor? y, Tensor dy, Tensor? weight, Tensor? bias, "
        "Tensor save_mean, Tensor save_invstd, Tensor summed, int flags, bool param_grads) "
        "-> (Tensor, Tensor, Tensor, Tensor)",
        &bn_sync_backward);
}
