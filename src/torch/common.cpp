/* common.cpp - tensors to norma pointers and descriptors (norma_torch.h), errors, and the
   library's identity operators. */
#include "norma_torch.h"

#include <cstdint>
#include <string>

namespace norma_torch {

void fail(norma_status st, const char *fn) {
  const char *detail = norma_last_error();
  /* the C message already starts with the function name */
  TORCH_CHECK(false, norma_status_string(st), ": ", (detail && *detail) ? detail : fn);
}

bool supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

static norma_dtype to_norma(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return NORMA_F64;
    case at::kHalf: return NORMA_F16;
    case at::kBFloat16: return NORMA_BF16;
    default: return NORMA_F32;
  }
}

/* Strides of a dense [N, spatial..., C] tensor of logical shape [N, C, spatial...], compared
   on the dimensions of size > 1 only (the others' strides mean nothing). */
static bool channels_last_dense(const at::Tensor &x) {
  const int64_t dim = x.dim();
  auto sizes = x.sizes();
  auto strides = x.strides();
  int64_t expect = 1;
  auto ok = [&](int64_t i) {
    if (sizes[i] != 1 && strides[i] != expect) return false;
    expect *= sizes[i];
    return true;
  };
  if (!ok(1)) return false;
  for (int64_t i = dim - 1; i >= 2; i--)
    if (!ok(i)) return false;
  return ok(0);
}

static at::Tensor to_channels_last(const at::Tensor &x) {
  if (x.dim() == 4) return x.contiguous(at::MemoryFormat::ChannelsLast);
  if (x.dim() == 5) return x.contiguous(at::MemoryFormat::ChannelsLast3d);
  std::vector<int64_t> perm{0};
  for (int64_t i = 2; i < x.dim(); i++) perm.push_back(i);
  perm.push_back(1);
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); i++) inv[perm[i]] = (int64_t)i;
  return x.permute(perm).contiguous().permute(inv);
}

static void fill_shape(Dense &D, const at::Tensor &t) {
  D.t = t;
  D.n = t.size(0);
  D.c = t.size(1);
  D.spatial = 1;
  for (int64_t i = 2; i < t.dim(); i++) D.spatial *= t.size(i);
  D.dtype = to_norma(t.scalar_type());
  D.pdtype = param_type(t.scalar_type());
}

static void check_tensor(const at::Tensor &x, const char *name) {
  TORCH_CHECK_VALUE(x.device().is_cpu(), name, " is on ", x.device(),
                    ": norma runs on CPU tensors");
  TORCH_CHECK_TYPE(supported_dtype(x.scalar_type()), name, " has dtype ", x.scalar_type(),
                   "; norma supports float32, float64, float16 and bfloat16");
  TORCH_CHECK_VALUE(x.dim() >= 2 && x.dim() <= 5, name,
                    " must have 2 to 5 dimensions ([N, C], [N, C, L], [N, C, H, W], "
                    "[N, C, D, H, W]); got shape ",
                    x.sizes());
}

Dense dense(const at::Tensor &x, const char *name) {
  check_tensor(x, name);
  Dense D;
  if (x.is_contiguous()) {
    D.layout = NORMA_CHANNELS_FIRST;
    fill_shape(D, x);
  } else if (x.dim() >= 3 && channels_last_dense(x)) {
    D.layout = NORMA_CHANNELS_LAST;
    fill_shape(D, x);
  } else {
    D.layout = NORMA_CHANNELS_FIRST;
    fill_shape(D, x.contiguous());
  }
  return D;
}

Dense dense_like(const at::Tensor &t, const Dense &ref, const char *name) {
  check_tensor(t, name);
  TORCH_CHECK_VALUE(t.sizes() == ref.t.sizes(), name, " has shape ", t.sizes(), ", expected ",
                    ref.t.sizes(), " (the shape of x)");
  TORCH_CHECK_TYPE(t.scalar_type() == ref.t.scalar_type(), name, " has dtype ", t.scalar_type(),
                   ", expected ", ref.t.scalar_type(), " (the dtype of x)");
  Dense D;
  D.layout = ref.layout;
  if (ref.layout == NORMA_CHANNELS_FIRST)
    fill_shape(D, t.is_contiguous() ? t : t.contiguous());
  else
    fill_shape(D, channels_last_dense(t) ? t : to_channels_last(t));
  return D;
}

at::Tensor empty_like(const Dense &ref) {
  auto opts = ref.t.options();
  if (ref.layout == NORMA_CHANNELS_FIRST) return at::empty(ref.t.sizes(), opts);
  if (ref.t.dim() == 4)
    return at::empty(ref.t.sizes(), opts.memory_format(at::MemoryFormat::ChannelsLast));
  if (ref.t.dim() == 5)
    return at::empty(ref.t.sizes(), opts.memory_format(at::MemoryFormat::ChannelsLast3d));
  /* 3-D channels-last: strides of [N, L, C] */
  const int64_t dim = ref.t.dim();
  std::vector<int64_t> strides(dim);
  int64_t acc = ref.c;
  strides[1] = 1;
  for (int64_t i = dim - 1; i >= 2; i--) {
    strides[i] = acc;
    acc *= ref.t.size(i);
  }
  strides[0] = acc;
  return at::empty_strided(ref.t.sizes(), strides, opts);
}

at::Tensor param_out(const Dense &ref) {
  return at::empty({ref.c}, ref.t.options().dtype(ref.pdtype));
}

at::Tensor param_in(const c10::optional<at::Tensor> &p, const Dense &ref, const char *name) {
  if (!p.has_value() || !p->defined()) return at::Tensor();
  const at::Tensor &t = *p;
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " is on ", t.device(),
                    ": norma runs on CPU tensors");
  TORCH_CHECK_VALUE(t.numel() == ref.c, name, " must have ", ref.c, " elements (got shape ",
                    t.sizes(), ")");
  if (t.scalar_type() == ref.pdtype && t.is_contiguous()) return t;
  return t.detach().to(ref.pdtype).contiguous();
}

void InOut::commit() {
  if (target.defined() && work.defined() && !work.is_same(target))
    target.copy_(work.view(target.sizes()));
}

InOut param_inout(const c10::optional<at::Tensor> &p, int64_t numel, at::ScalarType type,
                  const char *name) {
  InOut io;
  if (!p.has_value() || !p->defined()) return io;
  const at::Tensor &t = *p;
  TORCH_CHECK_VALUE(t.device().is_cpu(), name, " is on ", t.device(),
                    ": norma runs on CPU tensors");
  TORCH_CHECK_VALUE(t.numel() == numel, name, " must have ", numel, " elements (got shape ",
                    t.sizes(), ")");
  io.target = t;
  if (t.scalar_type() == type && t.is_contiguous())
    io.work = t;
  else
    io.work = t.detach().to(type).contiguous().clone();
  return io;
}

}  // namespace norma_torch

using namespace norma_torch;

/* Which libnorma this library is bound to: the version, and the address of norma_version,
   which the package compares with the ctypes binding's to be sure that both use one copy of
   the library (one set of settings: threads, ISA cap, reference mode). */
static std::string library_version() { return norma_version(); }
static int64_t library_address() { return (int64_t)(intptr_t)&norma_version; }

TORCH_LIBRARY_FRAGMENT(norma, m) {
  m.def("library_version() -> str", &library_version);
  m.def("library_address() -> int", &library_address);
}
