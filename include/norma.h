/*
 * norma.h - the whole public C API of norma, a library of normalization operators.
 *
 * BatchNorm for deep learning: training forward (batch statistics, running-statistics update,
 * save_mean / save_invstd for the backward), inference forward, and backward (dx, dgamma,
 * dbeta), in f32 / f64 / f16 / bf16 storage with f32-or-wider math, channels-first
 * ([N, C, spatial...]) and channels-last ([N, spatial..., C]) layouts, fused with ReLU or
 * residual-add + ReLU.  A split "statistics / apply" API lets a producer (a GEMM, a
 * convolution) or a distributed runtime own the reduction.  The rest of the family with the
 * same conventions: LayerNorm and RMSNorm (with the fused residual add of pre-norm
 * transformers), GroupNorm (with fused SiLU / ReLU) and InstanceNorm (section at the end).
 *
 * Conventions that hold for every function below:
 *  - Every function returns a norma_status.  On any error nothing has been written: no output
 *    array, no running statistic, no accumulator.  norma_last_error() then returns a message
 *    that names the offending argument and its value.
 *  - Tensor arguments are dense, in the layout and dtype of the descriptor.  A tensor has
 *    n * c * spatial elements, and at most NORMA_MAX_TENSOR_BYTES bytes: a descriptor whose
 *    tensor would be larger (or whose size products overflow int64) is rejected with
 *    NORMA_ERR_INVALID_ARGUMENT before any product is formed.  Counts (n * spatial, the
 *    moments' counts) are int64_t; a merge or accumulation whose count would exceed INT64_MAX
 *    is rejected the same way.
 *  - Per-channel arrays (gamma, beta, mean, var, save_mean, save_invstd, running_mean,
 *    running_var, dgamma, dbeta) have c elements of type double when dtype == NORMA_F64 and
 *    float otherwise.  Arrays of the split API are always double.
 *  - In-place use is supported where an output tensor exactly aliases an input tensor of the
 *    same size (same address, same size): y == x, y == residual; dx == dy, dx == x, dx == y;
 *    dresidual == dy, dresidual == x, dresidual == y (every element's inputs are read before
 *    its outputs are written, so the results are those of separate buffers, bit for bit).
 *    Any other overlap between an output and another argument (two outputs, a partial
 *    overlap, a per-channel output inside a tensor, ...) is rejected with
 *    NORMA_ERR_INVALID_ARGUMENT, by every function, the split API included.
 *  - Results are bitwise identical for every thread count (norma_set_num_threads) on the same
 *    instruction-set path.
 *  - Flags that do not apply to a call are ignored, so one descriptor can serve the forward and
 *    the backward of a layer.  Unknown flag bits are rejected.
 *
 * Thread safety: all functions may be called concurrently from several threads on disjoint
 * outputs.  The global settings (norma_set_num_threads, norma_set_max_isa,
 * norma_set_use_reference) are atomic: they may be changed from any thread at any time, also
 * while other calls run.  norma_set_num_threads is read once per call; a call running while
 * it changes uses the old or the new count, and its results are the same bits either way.  A
 * call running while the ISA cap or the reference switch changes may run either path (their
 * results differ in the last bits): change those while no call runs when bits matter.
 */
#ifndef NORMA_H
#define NORMA_H

#include <stdint.h>

#if defined(_WIN32) && defined(NORMA_BUILDING_LIBRARY)
#define NORMA_API __declspec(dllexport)
#elif defined(__GNUC__) || defined(__clang__)
#define NORMA_API __attribute__((visibility("default")))
#else
#define NORMA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define NORMA_VERSION_MAJOR 0
#define NORMA_VERSION_MINOR 1
#define NORMA_VERSION_PATCH 0

/* The largest tensor a descriptor may describe, in bytes: 2^48 (256 TiB, the user address
   space of x86-64 with 4-level paging).  A bound on sizes keeps every size product inside
   the library (sizes times strides, block counts, byte counts) far from int64 overflow. */
#define NORMA_MAX_TENSOR_BYTES ((int64_t)1 << 48)

/* ------------------------------------------------------------------------------------------ */
/* Status, errors, version, threads                                                           */
/* ------------------------------------------------------------------------------------------ */

typedef enum norma_status {
  NORMA_OK = 0,
  NORMA_ERR_INVALID_ARGUMENT = 1, /* NULL where required, bad enum, size <= 0, eps < 0, overflow */
  NORMA_ERR_UNSUPPORTED = 2,      /* valid but not implemented */
  NORMA_ERR_OUT_OF_MEMORY = 3,
  NORMA_ERR_NONFINITE = 4,    /* only with NORMA_CHECK_FINITE: NaN/Inf seen, outputs untouched */
  NORMA_ERR_COMMUNICATION = 5 /* SyncBN collective failed */
} norma_status;

/* A static, human-readable name for s ("NORMA_OK", ...); "unknown status" for other values. */
NORMA_API const char *norma_status_string(norma_status s);

/* The detail of the last failed call made by this thread (thread-local), e.g.
   "norma_bn_forward_training: d->c must be > 0 (got 0)".  "" when no call has failed yet.
   A successful call does not clear it.  The string stays valid until this thread's next
   failing norma call. */
NORMA_API const char *norma_last_error(void);

/* The library version, "MAJOR.MINOR.PATCH". */
NORMA_API const char *norma_version(void);

/* Number of threads the CPU kernels may use.  n <= 0 restores the library default (the OpenMP
   default, i.e. OMP_NUM_THREADS or the number of processors).  Results do not depend on it. */
NORMA_API void norma_set_num_threads(int n);
/* The number of threads the next call may use (>= 1). */
NORMA_API int norma_get_num_threads(void);

/* ------------------------------------------------------------------------------------------ */
/* Instruction-set dispatch                                                                   */
/* ------------------------------------------------------------------------------------------ */

typedef enum norma_isa {
  NORMA_ISA_SCALAR = 0, /* portable C kernels (compiler-vectorized for the baseline target) */
  NORMA_ISA_AVX2 = 1,   /* x86-64 AVX2 + FMA + F16C kernels */
  NORMA_ISA_AVX512 = 2  /* x86-64 AVX-512 F/BW/VL/DQ kernels (16 lanes, masked tails) */
} norma_isa;

/* Caps the instruction set the kernels may use at `isa` (the best one the CPU supports at or
   below it is chosen).  The environment variable NORMA_MAX_ISA=scalar|avx2|avx512 sets the
   initial cap.  Returns NORMA_ERR_INVALID_ARGUMENT for an unknown value.
   The vector kernels of every ISA share one accumulation structure (value i of a run in lane
   i % 32, each channel-last column summed down its rows), so AVX2 and AVX-512 give bitwise
   identical results; the portable kernels differ from them in the last bits (no FMA). */
NORMA_API norma_status norma_set_max_isa(norma_isa isa);
/* The instruction set the kernels use now. */
NORMA_API norma_isa norma_get_isa(void);
/* "scalar", "avx2" or "avx512". */
NORMA_API const char *norma_isa_name(norma_isa isa);

/* on != 0: every call runs the reference kernels (plain scalar C, double accumulation), the
   oracle the fast kernels are tested against.  Slow; for debugging and testing.  The
   environment variable NORMA_USE_REFERENCE=1 sets it initially. */
NORMA_API void norma_set_use_reference(int on);
NORMA_API int norma_get_use_reference(void);

/*
 * Streaming (non-temporal) stores of outputs.  An output of at least min_bytes and at most
 * max_bytes is written around the caches, which saves reading each line of it before it is
 * written when the output is not cached (a buffer reused from call to call).  With the default
 * minimum, an output is streamed only when the call's tensors (those it reads and writes)
 * together exceed 32 MiB (16 MiB for the BatchNorm backward and for the BatchNorm training
 * forward of channels-last rows of 4 KiB or more, 20 MiB for the inference of such rows; the
 * output must then be at least a quarter of that): below that the caches keep them from call
 * to call.  A freshly allocated output is usually cached already (the OS zero-fills a new page
 * through the cache) and is faster written through it: a binding that hands norma a new
 * allocation for every call may narrow the range.  norma.torch sets max_bytes to 32 MiB, above
 * which glibc's malloc maps fresh pages for every allocation.  min_bytes = 0 restores the
 * default minimum (the above, or the environment variable NORMA_NT_MIN_BYTES); max_bytes =
 * INT64_MAX (the default) means no maximum; max_bytes < min_bytes disables them.  Results do
 * not depend on it (only speed).
 * Errors: NORMA_ERR_INVALID_ARGUMENT for a negative value.
 */
NORMA_API norma_status norma_set_streaming_stores(int64_t min_bytes, int64_t max_bytes);

/* ------------------------------------------------------------------------------------------ */
/* BatchNorm                                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef enum norma_dtype {
  NORMA_F32 = 0,
  NORMA_F64 = 1,
  NORMA_F16 = 2,
  NORMA_BF16 = 3
} norma_dtype;

typedef enum norma_layout {
  NORMA_CHANNELS_FIRST = 0, /* [N, C, spatial...]: NCHW, NCDHW, and [N, C] with spatial = 1 */
  NORMA_CHANNELS_LAST = 1   /* [N, spatial..., C]: NHWC, NDHWC */
} norma_layout;

enum {
  NORMA_BN_RELU = 1u << 0,               /* y = max(0, bn(x)) */
  NORMA_BN_ADD_RELU = 1u << 1,           /* y = max(0, bn(x) + residual) */
  NORMA_BN_BIASED_RUNNING_VAR = 1u << 2, /* running_var from the biased batch variance (ONNX) */
  NORMA_CHECK_FINITE = 1u << 3,          /* scan inputs first; NaN/Inf -> NORMA_ERR_NONFINITE */
  NORMA_BN_GLOBAL_STATS = 1u << 4,   /* backward: save_mean/save_invstd are constants (frozen BN) */
  NORMA_SILU = 1u << 5,              /* GroupNorm / InstanceNorm: y = z * sigmoid(z) */
  NORMA_BN_COUNT_WEIGHTED = 1u << 6, /* running statistics weighted by batch sizes (see
                                        norma_bn_running_update) */
  NORMA_RELU = NORMA_BN_RELU         /* the norm family's spelling of the ReLU flag */
};

typedef struct norma_bn_desc {
  int64_t n, c, spatial; /* spatial = product of spatial dims, 1 for [N, C] */
  norma_layout layout;
  norma_dtype dtype;     /* storage type of x, y, residual, dy, dx, dresidual */
  double eps;
  unsigned flags;
} norma_bn_desc;

/*
 * Training forward: statistics of the batch, normalization, optional fused activation, and
 * the running-statistics update.
 *
 *   mean_c  = (1/m) sum x           over the m = n * spatial values of channel c
 *   var_c   = (1/m) sum (x - mean)^2   (biased)
 *   invstd  = 1 / sqrt(var + eps)        (eps inside the square root)
 *   y       = (x - mean) * invstd * gamma + beta
 *             then max(0, y) with NORMA_BN_RELU, max(0, y + residual) with NORMA_BN_ADD_RELU
 *   running_mean = (1 - momentum) * running_mean + momentum * mean
 *   running_var  = (1 - momentum) * running_var  + momentum * var * m / (m - 1)
 *                  (var itself with NORMA_BN_BIASED_RUNNING_VAR)
 *
 * d            descriptor; required.  n, c, spatial >= 1; n * spatial >= 2 (one value per
 *              channel has no variance: rejected, as PyTorch does); eps >= 0 and finite.
 * x            [tensor] input; required.
 * residual     [tensor] required with NORMA_BN_ADD_RELU, ignored otherwise.
 * gamma, beta  [c] scale and shift; NULL means 1 and 0.
 * y            [tensor] output; required.  May be x (in place).
 * save_mean    [c] batch mean, for the backward; may be NULL.
 * save_invstd  [c] 1 / sqrt(var + eps), for the backward; may be NULL.
 * running_mean, running_var  [c] updated in place; each may be NULL (then not updated).
 * momentum     in [0, 1]; checked only when a running statistic is given.
 *
 * Flags used: RELU, ADD_RELU (not both), BIASED_RUNNING_VAR, CHECK_FINITE (x, residual, gamma,
 * beta, running statistics).  NaN/Inf in x without CHECK_FINITE propagate into y and the
 * statistics of their channel.  var == 0 with eps == 0 gives invstd = 0 in that channel, so
 * y = beta there (and the backward's dx = 0), as PyTorch does.  The statistics stay exact
 * whatever the scale of the data, and y is right whenever the exact y is finite: a channel
 * whose gamma * invstd exceeds the compute type (f32 data with a spread below ~1e-38 and
 * eps = 0) is normalized in double, and its save_invstd is +Inf.
 *
 * Errors: NORMA_ERR_INVALID_ARGUMENT, NORMA_ERR_OUT_OF_MEMORY, NORMA_ERR_NONFINITE.
 */
NORMA_API norma_status norma_bn_forward_training(const norma_bn_desc *d,
    const void *x, const void *residual, const void *gamma, const void *beta,
    void *y, void *save_mean, void *save_invstd,
    void *running_mean, void *running_var, double momentum);

/*
 * Inference forward with given statistics: y = (x - mean) / sqrt(var + eps) * gamma + beta,
 * then the activation of the flags.
 *
 * x, y         [tensor] required; y may be x.
 * residual     [tensor] required with NORMA_BN_ADD_RELU, ignored otherwise.
 * gamma, beta  [c] NULL means 1 and 0.
 * mean, var    [c] required (e.g. the running statistics).  var + eps == 0 gives y = NaN
 *              where x == mean, +-Inf elsewhere, as PyTorch does.
 *
 * Flags used: RELU, ADD_RELU, CHECK_FINITE (x, residual, gamma, beta, mean, var).
 * n * spatial == 1 is allowed here.
 * Errors: NORMA_ERR_INVALID_ARGUMENT, NORMA_ERR_OUT_OF_MEMORY, NORMA_ERR_NONFINITE.
 */
NORMA_API norma_status norma_bn_forward_inference(const norma_bn_desc *d,
    const void *x, const void *residual, const void *gamma, const void *beta,
    const void *mean, const void *var, void *y);

/*
 * Backward.  With g = dy masked by the activation (g = dy where y > 0, else 0, with RELU or
 * ADD_RELU; g = dy otherwise), x_hat = (x - save_mean) * save_invstd, m = n * spatial:
 *
 *   dbeta  = sum g
 *   dgamma = sum g * x_hat
 *   dx     = gamma * save_invstd * (g - dbeta / m - x_hat * dgamma / m)
 *   dx     = gamma * save_invstd * g                  with NORMA_BN_GLOBAL_STATS
 *   dresidual = g                                     with NORMA_BN_ADD_RELU
 *
 * Without GLOBAL_STATS, save_mean is taken to be the batch mean of x rounded to its storage
 * type: the backward measures that rounding with one more sum in the same pass,
 * s = sum(x_hat) / m, and removes it (x_hat - s), so dx and dgamma keep full accuracy on data
 * whose mean is large against its spread.  Rounding can only cause |s| <= 1/16 (f32 data up to
 * mean/std ~ 1e6); a larger s means save_mean was not the batch mean (statistics supplied by
 * the caller) and it is then used as given, as PyTorch does.
 *
 * x            [tensor] input of the forward.  Required with RELU or ADD_RELU.  Without them x
 *              may be NULL when y is given: x_hat is then recovered as (y - beta) / gamma, so x
 *              need not be kept (requires gamma != 0 in every channel).
 * y            [tensor] output of the forward; required with RELU / ADD_RELU (the mask is
 *              y > 0) and when x is NULL; ignored otherwise (may be NULL).
 * dy           [tensor] gradient of y; required.
 * gamma, beta  [c] NULL means 1 and 0 (beta is used only to recover x_hat from y).
 * save_mean, save_invstd [c] required: those written by norma_bn_forward_training, or
 *              the constants of a frozen layer with GLOBAL_STATS.
 * dx           [tensor] required; may alias dy, x or y.
 * dresidual    [tensor] with ADD_RELU: receives g; may be NULL; may alias dy, x or y (the
 *              results are those of a separate buffer; not dx).  Ignored without ADD_RELU.
 * dgamma, dbeta [c] may be NULL when not wanted.
 *
 * Flags used: RELU, ADD_RELU, GLOBAL_STATS, CHECK_FINITE (x, y, dy, gamma, beta, save_*).
 * Without GLOBAL_STATS n * spatial must be >= 2.
 * Errors: NORMA_ERR_INVALID_ARGUMENT, NORMA_ERR_OUT_OF_MEMORY, NORMA_ERR_NONFINITE.
 */
NORMA_API norma_status norma_bn_backward(const norma_bn_desc *d,
    const void *x, const void *y, const void *dy,
    const void *gamma, const void *beta, const void *save_mean, const void *save_invstd,
    void *dx, void *dresidual, void *dgamma, void *dbeta);

/*
 * Running statistics weighted by batch sizes.  PyTorch's update gives every batch the same
 * weight; when local batches differ in size (uneven shards, a last short batch, SyncBN with
 * empty ranks) a count-weighted average keeps the estimate unbiased.  With momentum u, batch
 * count B (values per channel: n * spatial, summed over ranks for SyncBN), batch mean mu and
 * batch variance v (unbiased: v * B / (B - 1), or biased with NORMA_BN_BIASED_RUNNING_VAR):
 *
 *   without NORMA_BN_COUNT_WEIGHTED (PyTorch):  r = (1 - u) * r + u * batch
 *   with it:  N' = (1 - u) * N + u * B
 *             r  = ((1 - u) * N * r + u * B * batch) / N'     (r unchanged when N' == 0)
 *             N  = N'
 *
 * N is the running count the caller keeps (one double for the layer, start it at 0: the first
 * batch then sets the statistics).  With a constant B this is PyTorch's rule once N has
 * reached B.
 *
 * norma_bn_running_update applies the rule to given batch statistics (the one implementation
 * of it: the training forward, the split API and libnorma_mpi all call it).  Only d->c,
 * d->dtype and d->flags are read and checked (c >= 1, the flags as any BatchNorm
 * descriptor's); n, spatial, layout and eps are not, and may hold anything.  count >= 2;
 * mean, var [c] double (var biased: m2 / count); running_mean, running_var [c] in the
 * parameter type, each may be NULL (with both NULL nothing is updated).  When a running
 * statistic is given: momentum in [0, 1], and with NORMA_BN_COUNT_WEIGHTED running_count is
 * required and *running_count must be finite and >= 0.  running_count is ignored without the
 * flag.  NORMA_CHECK_FINITE scans mean, var and the running statistics.
 */
NORMA_API norma_status norma_bn_running_update(const norma_bn_desc *d, int64_t count,
    const double *mean, const double *var, void *running_mean, void *running_var,
    double *running_count, double momentum);

/* norma_bn_forward_training with NORMA_BN_COUNT_WEIGHTED available: running_count as in
   norma_bn_running_update (required with the flag when a running statistic is given, then
   finite and >= 0; not read otherwise).
   norma_bn_forward_training itself rejects the flag when running statistics are given, as it
   has no running count. */
NORMA_API norma_status norma_bn_forward_training_counted(const norma_bn_desc *d,
    const void *x, const void *residual, const void *gamma, const void *beta,
    void *y, void *save_mean, void *save_invstd,
    void *running_mean, void *running_var, double *running_count, double momentum);

/* ------------------------------------------------------------------------------------------ */
/* Plan introspection                                                                         */
/* ------------------------------------------------------------------------------------------ */

typedef enum norma_bn_op {
  NORMA_BN_OP_FORWARD_TRAINING = 0,
  NORMA_BN_OP_FORWARD_INFERENCE = 1,
  NORMA_BN_OP_BACKWARD = 2
} norma_bn_op;

/* How a call would run on this machine with the current settings (threads, ISA cap). */
typedef struct norma_bn_plan {
  int dram_passes;      /* times the input tensors are read from memory: 1 (the floor: a
                           block is reduced and applied while it is in cache) or 2 (the
                           reductions, then the apply); the reference kernels' training
                           forward reads 3 times (sums, deviations, normalization) */
  int fused;            /* 1: threads own blocks of channels end to end; 0: split schedule */
  int64_t unit;         /* channels per block in the fused schedule, 0 otherwise */
  int threads;          /* threads the call uses (1 for tensors too small to share) */
  norma_isa isa;        /* instruction set of the kernels */
  int streaming_stores; /* outputs bypass the cache (non-temporal stores) */
  int reference;        /* 1 when norma_set_use_reference(1) routes calls to the reference */
} norma_bn_plan;

/* Fills *plan for op on d.  d is checked as the op checks it (training needs n * spatial >= 2;
   the backward too, unless NORMA_BN_GLOBAL_STATS); flags are taken into account.
   Errors: NORMA_ERR_INVALID_ARGUMENT (plan untouched). */
NORMA_API norma_status norma_bn_query_plan(const norma_bn_desc *d, norma_bn_op op,
                                           norma_bn_plan *plan);

/* ------------------------------------------------------------------------------------------ */
/* Inference folding                                                                          */
/* ------------------------------------------------------------------------------------------ */

/* scale = gamma / sqrt(var + eps), shift = beta - mean * scale (computed in double);
   gamma/beta NULL mean 1 and 0.  mean, var, scale, shift: [c], required.  scale/shift may alias
   an input exactly (not each other, no partial overlap).  c >= 1 (c * 4 bytes at most
   NORMA_MAX_TENSOR_BYTES), eps >= 0.  var + eps must be > 0 in every channel. */
NORMA_API norma_status norma_bn_fold(int64_t c, const float *gamma, const float *beta,
    const float *mean, const float *var, double eps, float *scale, float *shift);

/* Folds BN into the producer that feeds it: weight is [c_out][per_out] (any conv or linear
   layout with the output channel outermost: OIHW, OI), bias is [c_out]; both updated in place:
     weight[o][k] *= scale[o];  bias[o] = (bias[o] - mean[o]) * scale[o] + beta[o].
   bias is required (a producer without bias gets one: pass an array of zeros).
   c_out, per_out >= 1 (weight at most NORMA_MAX_TENSOR_BYTES); var + eps must be > 0 in every
   channel. */
NORMA_API norma_status norma_bn_fold_into_weights(int64_t c_out, int64_t per_out, float *weight,
    float *bias, const float *gamma, const float *beta, const float *mean, const float *var,
    double eps);

/* ------------------------------------------------------------------------------------------ */
/* Split API: statistics / apply                                                              */
/* ------------------------------------------------------------------------------------------ */
/*
 * The training forward and the backward, cut where their reductions end, so that the caller
 * can own the reduction: merge the statistics of tiles as a producer writes them, or of ranks
 * in a distributed job (libnorma_mpi is built on these calls).
 *
 * Moments.  The moments of a set of values of one channel are (count, mean, m2) with
 * m2 = sum (x - mean)^2, all in double, so that two sets merge exactly (Chan et al.):
 *   count = ca + cb;  delta = mean_b - mean_a;
 *   mean  = mean_a + delta * cb / count;  m2 = m2_a + m2_b + delta^2 * ca * cb / count.
 * A channel with count 0 has mean 0 and m2 0 and is the identity of the merge.
 *
 *   forward:  norma_bn_moments (or norma_bn_moments_accumulate, tile by tile)
 *             -> [merge across tiles / ranks] -> norma_bn_stats_from_moments
 *             -> norma_bn_forward_apply
 *   backward: norma_bn_backward_reduce -> [sum across ranks] -> norma_bn_backward_apply
 */

/* Moments of every channel of a whole (local) batch: count[c], mean[c], m2[c] (double),
   overwritten.  Accurate on data with a large mean (per-channel shifted accumulation).
   d->n may be 0 here (then every count is 0).  Uses CHECK_FINITE. */
NORMA_API norma_status norma_bn_moments(const norma_bn_desc *d, const void *x,
    int64_t *count, double *mean, double *m2);

/* Accumulates the moments of a tile into running moments, for producers that want the
   statistics of their output while it is still in cache.  The tile has `rows` values of each
   of `channels` channels; value (r, j) is at x[r * row_stride + j * channel_stride] (elements
   of dtype, strides may be any non-negative values).  A channels-last [rows, C] block with
   leading dimension ld: row_stride = ld, channel_stride = 1; a channels-first block of one
   image: row_stride = 1, channel_stride = spatial.  count/mean/m2 have `channels` entries
   (offset the pointers for a tile of channels c0..): the tile's moments are merged into them.
   rows == 0 is a no-op.  Deterministic: the result depends only on the order of the calls. */
NORMA_API norma_status norma_bn_moments_accumulate(norma_dtype dtype, int64_t rows,
    int64_t channels, const void *x, int64_t row_stride, int64_t channel_stride,
    int64_t *count, double *mean, double *m2);

/* Merges moments b into a, channel by channel: a = a (+) b.  c >= 1. */
NORMA_API norma_status norma_bn_moments_merge(int64_t c, int64_t *count_a, double *mean_a,
    double *m2_a, const int64_t *count_b, const double *mean_b, const double *m2_b);

/* From merged moments: mean[c] and invstd[c] = 1/sqrt(m2/count + eps) (double, required; 0
   when m2 == 0 and eps == 0, as in the training forward), and
   the running statistics update of norma_bn_forward_training (running_mean / running_var of
   d->dtype's parameter type, each may be NULL; the unbiased form uses count/(count-1), the
   biased one with NORMA_BN_BIASED_RUNNING_VAR in d->flags).  Only d->c, d->dtype, d->eps and
   d->flags are read.  Every count must be >= 2 (else NORMA_ERR_INVALID_ARGUMENT naming the
   channel).  save_mean / save_invstd (parameter type, may be NULL) receive mean and invstd
   rounded to it, as the training forward writes them.  With NORMA_BN_COUNT_WEIGHTED the
   running statistics must be NULL here (rejected otherwise): update them with
   norma_bn_running_update, which takes the running count. */
NORMA_API norma_status norma_bn_stats_from_moments(const norma_bn_desc *d, const int64_t *count,
    const double *mean, const double *m2, double *mean_out, double *invstd_out,
    void *save_mean, void *save_invstd, void *running_mean, void *running_var, double momentum);

/* y = (x - mean) * invstd * gamma + beta (+ the activation of d->flags), with mean and invstd
   given in double (so large-mean data keep full accuracy).  Arguments as in
   norma_bn_forward_inference.  d->n may be 0 (nothing to do). */
NORMA_API norma_status norma_bn_forward_apply(const norma_bn_desc *d, const void *x,
    const void *residual, const void *gamma, const void *beta, const double *mean,
    const double *invstd, void *y);

/* The local reductions of the backward, with x_hat = (x - mean) * invstd (or (y - beta)/gamma
   when x is NULL) and g the masked dy, as in norma_bn_backward:
     sum_dy[c] = sum g,  sum_dy_xhat[c] = sum g * x_hat,  sum_xhat[c] = sum x_hat (may be NULL).
   All double, overwritten; they add across tiles and ranks.  sum_xhat lets
   norma_bn_backward_apply remove the rounding of a mean stored in low precision.
   Arguments x, y, dy, gamma, beta as in norma_bn_backward.  d->n may be 0 (sums are 0). */
NORMA_API norma_status norma_bn_backward_reduce(const norma_bn_desc *d, const void *x,
    const void *y, const void *dy, const void *gamma, const void *beta, const double *mean,
    const double *invstd, double *sum_dy, double *sum_dy_xhat, double *sum_xhat);

/* dx (and dresidual with ADD_RELU) from the global sums over `count` values per channel:
     with s = sum_xhat / count (0 when sum_xhat is NULL), x_hat' = x_hat - s,
     S = sum_dy_xhat - s * sum_dy,
     dx = gamma * invstd * (g - sum_dy / count - x_hat' * S / count).
   With NORMA_BN_GLOBAL_STATS: dx = gamma * invstd * g (sums and count unused).
   The matching parameter gradients are dbeta = sum_dy, dgamma = S (see
   norma_bn_param_grads).  count >= 1 (>= 2 is what a training forward allows).  The
   correction is applied as given: norma_bn_backward applies it only when |s| <= 1/16 (what
   rounding a stored mean can cause); a caller wanting that rule passes NULL otherwise. */
NORMA_API norma_status norma_bn_backward_apply(const norma_bn_desc *d, const void *x,
    const void *y, const void *dy, const void *gamma, const void *beta, const double *mean,
    const double *invstd, const double *sum_dy, const double *sum_dy_xhat,
    const double *sum_xhat, int64_t count, void *dx, void *dresidual);

/* dgamma = sum_dy_xhat - s * sum_dy (s as in norma_bn_backward_apply) and dbeta = sum_dy,
   written in d->dtype's parameter type (each may be NULL).  sum_xhat may be NULL (no
   correction); with NORMA_BN_GLOBAL_STATS it is ignored.  Only d->c, d->dtype, d->flags are
   read. */
NORMA_API norma_status norma_bn_param_grads(const norma_bn_desc *d, const double *sum_dy,
    const double *sum_dy_xhat, const double *sum_xhat, int64_t count, void *dgamma,
    void *dbeta);

/* ------------------------------------------------------------------------------------------ */
/* The norm family: LayerNorm, RMSNorm, GroupNorm, InstanceNorm                                */
/* ------------------------------------------------------------------------------------------ */
/*
 * BatchNorm's conventions hold: a descriptor, a status, nothing written on error, statistics
 * saved for the backward, f32 / f64 / f16 / bf16 storage with f32-or-wider math (parameters
 * and statistics are double for F64, float otherwise), bitwise identical results for any
 * thread count, exact in-place aliasing allowed (y == x or residual, sum == x or residual,
 * dx == dy, x or dsum), any other overlap rejected, NORMA_CHECK_FINITE scans the inputs (those
 * the call reads: not an ignored argument).  A descriptor takes only the flags its comment
 * lists; any other bit, a BatchNorm flag included, is rejected (NORMA_RELU and NORMA_SILU
 * together too).  The size bound is BatchNorm's: the tensor at most NORMA_MAX_TENSOR_BYTES.
 *
 * Statistics are computed as BatchNorm's are (anchored block sums: no cancellation on data
 * whose mean is large against its spread), invstd = 1 / sqrt(var + eps) with eps inside the
 * square root, and 0 when var == eps == 0.  The backward removes the offset that rounding
 * save_mean to the parameter type leaves in x_hat, as BatchNorm's does.
 */

/* LayerNorm and RMSNorm over the trailing d values of each of `rows` rows (a [rows, d] tensor,
   rows = the product of the leading dimensions, d = the product of normalized_shape). */
typedef struct norma_ln_desc {
  int64_t rows;       /* >= 1 */
  int64_t d;          /* >= 1 */
  norma_dtype dtype;  /* storage type of x, residual, y, sum, dy, dsum, dx */
  double eps;         /* >= 0, finite */
  unsigned flags;     /* NORMA_CHECK_FINITE */
} norma_ln_desc;

/*
 * LayerNorm forward, optionally fused with the residual add of a pre-norm transformer block:
 *
 *   h      = x + residual (rounded to the storage type) when residual != NULL, else x
 *   mean_r = (1/d) sum_j h[r, j],  var_r = (1/d) sum_j (h[r, j] - mean_r)^2
 *   y[r,j] = (h[r, j] - mean_r) * invstd_r * gamma[j] + beta[j]
 *
 * x, y         [rows, d] required; y may be x.
 * residual     [rows, d] or NULL.
 * sum          [rows, d] receives h when residual is given (may be NULL, x or residual: the
 *              residual stream updated in place); ignored without residual.
 * gamma, beta  [d] NULL means 1 and 0.
 * save_mean, save_invstd [rows] may be NULL.
 * Errors: NORMA_ERR_INVALID_ARGUMENT, NORMA_ERR_OUT_OF_MEMORY, NORMA_ERR_NONFINITE.
 */
NORMA_API norma_status norma_ln_forward(const norma_ln_desc *d, const void *x,
    const void *residual, const void *gamma, const void *beta, void *y, void *sum,
    void *save_mean, void *save_invstd);

/*
 * LayerNorm backward.  x_hat = (x - save_mean) * save_invstd per row, g = gamma * dy:
 *
 *   dx[r,j]   = invstd_r * (g - mean_j(g) - x_hat * mean_j(g * x_hat)) + dsum[r, j]
 *   dgamma[j] = sum_r dy * x_hat,   dbeta[j] = sum_r dy
 *
 * x            [rows, d] the normalized input (h when the forward fused a residual); required.
 * dy           [rows, d] required.
 * dsum         [rows, d] or NULL: the gradient reaching h from its other uses (the residual
 *              stream), added to dx.  dx is then the gradient of both x and residual.
 * gamma        [d] NULL means 1.
 * save_mean, save_invstd [rows] required (from norma_ln_forward).
 * dx           [rows, d] required; may alias dy, x or dsum.
 * dgamma, dbeta [d] may be NULL.
 */
NORMA_API norma_status norma_ln_backward(const norma_ln_desc *d, const void *x, const void *dy,
    const void *dsum, const void *gamma, const void *save_mean, const void *save_invstd,
    void *dx, void *dgamma, void *dbeta);

/*
 * RMSNorm (torch.nn.RMSNorm of PyTorch 2.4+): no mean, no beta.
 *   h = x (+ residual),  invrms_r = 1 / sqrt((1/d) sum_j h[r, j]^2 + eps),
 *   y[r, j] = h[r, j] * invrms_r * gamma[j]
 * Arguments as norma_ln_forward's; save_invrms [rows] may be NULL.  invrms is 0 for an
 * all-zero row with eps == 0 (y = 0).
 */
NORMA_API norma_status norma_rms_forward(const norma_ln_desc *d, const void *x,
    const void *residual, const void *gamma, void *y, void *sum, void *save_invrms);

/*
 * RMSNorm backward.  x_hat = x * invrms_r, g = gamma * dy:
 *   dx = invrms_r * (g - x_hat * mean_j(g * x_hat)) + dsum,   dgamma[j] = sum_r dy * x_hat
 * Arguments as norma_ln_backward's; save_invrms [rows] required; dgamma may be NULL.
 */
NORMA_API norma_status norma_rms_backward(const norma_ln_desc *d, const void *x, const void *dy,
    const void *dsum, const void *gamma, const void *save_invrms, void *dx, void *dgamma);

/* GroupNorm: the c channels of each sample form `groups` groups of c / groups adjacent
   channels; each (sample, group) is normalized over its channels and spatial positions.  The
   affine is per channel. */
typedef struct norma_gn_desc {
  int64_t n, c, spatial; /* >= 1 each; spatial = product of spatial dims, 1 for [N, C] */
  int64_t groups;        /* >= 1, divides c */
  norma_layout layout;
  norma_dtype dtype;
  double eps;
  unsigned flags;        /* NORMA_RELU or NORMA_SILU (fused activation), NORMA_CHECK_FINITE */
} norma_gn_desc;

/*
 * GroupNorm forward:  z = (x - mean_ng) * invstd_ng * gamma[c] + beta[c];  y = act(z)
 * with act the identity, max(0, z) (NORMA_RELU) or z * sigmoid(z) (NORMA_SILU).
 * x, y [tensor] required (y may be x); gamma, beta [c] NULL mean 1 and 0;
 * save_mean, save_invstd [n * groups] (index sample * groups + group), may be NULL.
 */
NORMA_API norma_status norma_gn_forward(const norma_gn_desc *d, const void *x,
    const void *gamma, const void *beta, void *y, void *save_mean, void *save_invstd);

/*
 * GroupNorm backward.  g = dy times the activation's derivative: masked by y > 0 with
 * NORMA_RELU (y required), times silu'(z) with NORMA_SILU (z recomputed from x, the saved
 * statistics, gamma and beta; y not needed).  With x_hat = (x - mean) * invstd, G = the group,
 * k = gamma[c] * g:
 *   dx = invstd * (k - mean_G(k) - x_hat * mean_G(k * x_hat))
 *   dgamma[c] = sum over samples and positions of g * x_hat,  dbeta[c] = sum g
 * x, dy, save_mean, save_invstd, dx required; dx may alias dy or x; dgamma, dbeta may be NULL.
 */
NORMA_API norma_status norma_gn_backward(const norma_gn_desc *d, const void *x, const void *y,
    const void *dy, const void *gamma, const void *beta, const void *save_mean,
    const void *save_invstd, void *dx, void *dgamma, void *dbeta);

/* InstanceNorm: every (sample, channel) normalized over its spatial positions (GroupNorm with
   groups == c), with PyTorch's optional running statistics. */
typedef struct norma_in_desc {
  int64_t n, c, spatial; /* >= 1 each; spatial >= 2 for the training forward */
  norma_layout layout;
  norma_dtype dtype;
  double eps;
  unsigned flags; /* NORMA_RELU, NORMA_SILU, NORMA_BN_BIASED_RUNNING_VAR, NORMA_CHECK_FINITE */
} norma_in_desc;

/*
 * InstanceNorm with the statistics of each instance (training, and the evaluation of a layer
 * without running statistics).  save_mean, save_invstd [n * c] (index sample * c + channel),
 * may be NULL.  running_mean / running_var [c] (each may be NULL) are updated as PyTorch does:
 * with the average over the batch of the instances' means and unbiased variances
 * (r = (1 - momentum) * r + momentum * mean_n(batch statistic)).
 */
NORMA_API norma_status norma_in_forward_training(const norma_in_desc *d, const void *x,
    const void *gamma, const void *beta, void *y, void *save_mean, void *save_invstd,
    void *running_mean, void *running_var, double momentum);

/* InstanceNorm with given per-channel statistics (a layer with track_running_stats in eval
   mode): y = act((x - mean[c]) / sqrt(var[c] + eps) * gamma[c] + beta[c]). */
NORMA_API norma_status norma_in_forward_inference(const norma_in_desc *d, const void *x,
    const void *gamma, const void *beta, const void *mean, const void *var, void *y);

/* InstanceNorm backward: norma_gn_backward with groups == c; save_* [n * c]. */
NORMA_API norma_status norma_in_backward(const norma_in_desc *d, const void *x, const void *y,
    const void *dy, const void *gamma, const void *beta, const void *save_mean,
    const void *save_invstd, void *dx, void *dgamma, void *dbeta);

#ifdef __cplusplus
}
#endif
#endif /* NORMA_H */
