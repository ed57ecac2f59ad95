/*
 * norma_mpi.h - synchronized BatchNorm over MPI (libnorma_mpi).
 *
 * The training forward and the backward of norma.h, with the batch statistics taken over a
 * batch that is split across the ranks of an MPI communicator (SyncBatchNorm).  Every rank of
 * comm calls with its own local batch; the statistics are those of the global batch (the
 * concatenation of every rank's local batch, in rank order) and save_mean, save_invstd, the
 * running statistics, dgamma and dbeta come out bitwise identical on every rank, whatever order
 * the MPI library reduces in.  y and dx are those of the rank's own local batch.
 *
 * Built on the split API of norma.h (norma_bn_moments, norma_bn_stats_from_moments,
 * norma_bn_forward_apply, norma_bn_backward_reduce, norma_bn_backward_apply,
 * norma_bn_param_grads) plus one MPI collective per call (two when c > 512 forward, 341
 * backward); see docs/distributed.md.
 *
 * Conventions, on top of those of norma.h:
 *  - Collective: every rank of comm must call, in the same order as its other collectives on
 *    comm, with the same d->c, d->dtype, d->layout, d->flags and d->eps, and should pass the
 *    same momentum.  d->n (and d->spatial) and which optional pointers are NULL may differ
 *    between ranks.  The layout of a rank whose tensor has the same bytes in both layouts
 *    (n == 0, spatial == 1 or c == 1) matches either.  Every rank sends a fingerprint of its
 *    descriptor (those fields, and the direction) in the header of the exchange, so a
 *    difference in any of them, d->c included, fails every rank with
 *    NORMA_ERR_INVALID_ARGUMENT, naming the first rank that differs and the fields
 *    ("the descriptor of rank 1 differs from that of rank 0 in d->c").
 *  - The first message of a call has a fixed size (a header and the first 512 channels
 *    forward, 341 backward), whatever the descriptor says, so it completes on every rank even
 *    when the ranks disagree on d->c or a rank's d is NULL.  Only when every rank agreed and c
 *    is larger does a second message follow, for the remaining channels; its size is then the
 *    same everywhere.  One collective per call for c up to 512 (forward) / 341 (backward), two
 *    beyond.
 *  - d->n may be 0 on some ranks (an empty local batch).  Such a rank still takes part; its
 *    tensor pointers (x, residual, y, dy, dx, dresidual) may then be NULL.  The check that a
 *    training batch has at least 2 values per channel applies to the global batch:
 *    sum over ranks of n * spatial >= 2.
 *  - Errors are collective too.  Each rank checks all its arguments before the exchange and
 *    sends its status in the header of the first message, so that an error found on any rank
 *    makes every rank return the same status (nothing written anywhere) instead of leaving the
 *    others blocked: the status of the lowest-numbered failing rank.  That rank's
 *    norma_mpi_last_error() has its own message; the others name it ("rank 2 of 4 failed").
 *    A NULL d or a d->c out of range is such an error too.  Exceptions, which are local:
 *    NORMA_ERR_COMMUNICATION (MPI itself failed on this rank: the other ranks see what their
 *    MPI reports; one collective cannot also agree on its own outcome), MPI not initialized, a
 *    comm that is MPI_COMM_NULL or an intercommunicator (this rank cannot take part),
 *    NORMA_ERR_OUT_OF_MEMORY when this rank cannot allocate its exchange buffers (it cannot
 *    take part: the others may hang) or when norma runs out of memory after the exchange (the
 *    others may have completed), and a NORMA_MPI_EXCHANGE that differs between ranks.
 *  - MPI errors never abort: the calls work on a private duplicate of comm (made by the first
 *    call on comm, a collective; cached on comm as an attribute and freed with it) whose error
 *    handler is MPI_ERRORS_RETURN.  comm itself is not changed.
 *  - The detail of the last failed call of this thread is in norma_last_error(), as for every
 *    norma call, and also in norma_mpi_last_error() (below).
 *  - MPI must be initialized and not finalized (else NORMA_ERR_COMMUNICATION).  Calls on
 *    different communicators may run concurrently from different threads when MPI was
 *    initialized with MPI_THREAD_MULTIPLE.
 *  - The exchange: each rank's per-channel record is either all-gathered and merged by every
 *    rank in rank order, or all-reduced with a non-commutative user-defined operation (rank
 *    order kept).  The choice depends on the communicator size and d->c only; the environment
 *    variable NORMA_MPI_EXCHANGE = auto (default) | allgather | allreduce overrides it and must
 *    then be the same on every rank.
 */
#ifndef NORMA_MPI_H
#define NORMA_MPI_H

#include <mpi.h>

#include "norma.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Synchronized training forward.  As norma_bn_forward_training, with mean and var those of the
 * global batch (count m = sum over ranks of n * spatial per channel):
 *
 *   y            = (x - mean) / sqrt(var + eps) * gamma + beta   (+ the activation of d->flags)
 *   running_mean = (1 - momentum) * running_mean + momentum * mean
 *   running_var  = (1 - momentum) * running_var  + momentum * var * m / (m - 1)
 *                  (var itself with NORMA_BN_BIASED_RUNNING_VAR)
 *
 * Per-rank moments (count, mean, m2) are computed in double, merged in rank order with Chan's
 * formula (norma_bn_moments_merge), so data with a large mean keep their variance.
 *
 * comm         an intracommunicator; every rank of it calls.  MPI_COMM_NULL or an
 *              intercommunicator: NORMA_ERR_INVALID_ARGUMENT.
 * d            descriptor; required (see the conventions above).  n >= 0 (local), c >= 1,
 *              spatial >= 1; global n * spatial >= 2; eps >= 0 and finite.
 * x            [local tensor] input; required when d->n > 0.
 * residual     [local tensor] required with NORMA_BN_ADD_RELU when d->n > 0, ignored otherwise.
 * gamma, beta  [c] scale and shift; NULL means 1 and 0.
 * y            [local tensor] output; required when d->n > 0.  May be x (in place).
 * save_mean    [c] global batch mean, for norma_bn_backward_mpi; may be NULL.
 * save_invstd  [c] 1 / sqrt(var + eps) of the global batch; may be NULL.
 * running_mean, running_var  [c] updated in place; each may be NULL (then not updated).
 * momentum     in [0, 1]; checked only when a running statistic is given.
 *
 * Flags used: RELU, ADD_RELU (not both), BIASED_RUNNING_VAR, CHECK_FINITE (x, residual, gamma,
 * beta, running statistics of this rank).
 *
 * Errors: NORMA_ERR_INVALID_ARGUMENT (also: global n * spatial < 2; the descriptors differ
 * between ranks; another rank's arguments were rejected),
 * NORMA_ERR_NONFINITE, NORMA_ERR_OUT_OF_MEMORY, NORMA_ERR_COMMUNICATION (MPI not initialized
 * or already finalized, or an MPI call failed).
 */
NORMA_API norma_status norma_bn_forward_training_mpi(MPI_Comm comm, const norma_bn_desc *d,
    const void *x, const void *residual, const void *gamma, const void *beta,
    void *y, void *save_mean, void *save_invstd,
    void *running_mean, void *running_var, double momentum);

/*
 * norma_bn_forward_training_mpi with count-weighted running statistics available
 * (NORMA_BN_COUNT_WEIGHTED, see norma_bn_running_update in norma.h): running_count is the
 * layer's running count N, the same on every rank, and B is the global count (sum over ranks
 * of n * spatial):
 *
 *   N' = (1 - momentum) * N + momentum * B
 *   running_stat = ((1 - momentum) * N * running_stat + momentum * B * batch_stat) / N'
 *
 * running_count is required with the flag when a running statistic is given, and updated in
 * place (only on success, as the other outputs).  NORMA_BN_COUNT_WEIGHTED must be set on every
 * rank or on none (checked like BIASED_RUNNING_VAR).  norma_bn_forward_training_mpi itself
 * rejects the flag when running statistics are given, as it has no running count.
 */
NORMA_API norma_status norma_bn_forward_training_counted_mpi(MPI_Comm comm,
    const norma_bn_desc *d, const void *x, const void *residual, const void *gamma,
    const void *beta, void *y, void *save_mean, void *save_invstd,
    void *running_mean, void *running_var, double *running_count, double momentum);

/*
 * Synchronized backward.  As norma_bn_backward, with the sums over the global batch:
 *
 *   dbeta  = sum g,   dgamma = sum g * x_hat                 (over every rank's values)
 *   dx     = gamma * save_invstd * (g - dbeta / m - x_hat * dgamma / m)   (local values)
 *   dx     = gamma * save_invstd * g                         with NORMA_BN_GLOBAL_STATS
 *   dresidual = g                                            with NORMA_BN_ADD_RELU
 *
 * with g the masked dy, x_hat = (x - save_mean) * save_invstd and m the global count.  The
 * per-rank sums (sum g, sum g * x_hat, sum x_hat) are added in double in rank order; the sum of
 * x_hat removes the rounding of a save_mean stored in float, as in norma_bn_backward.
 * dgamma and dbeta are the gradients of the global batch, identical on every rank (unlike
 * PyTorch's SyncBatchNorm, whose per-rank parameter gradients are then averaged by
 * DistributedDataParallel: do not reduce these again).  With NORMA_BN_GLOBAL_STATS the
 * exchange still takes place, for dgamma and dbeta.
 *
 * comm         as in norma_bn_forward_training_mpi.
 * d            descriptor; required.  n >= 0 (local); without NORMA_BN_GLOBAL_STATS the global
 *              n * spatial must be >= 2.
 * x            [local tensor] input of the forward.  Required with RELU or ADD_RELU when
 *              d->n > 0.  Without them x may be NULL when y is given: x_hat is then recovered
 *              as (y - beta) / gamma (requires gamma != 0 in every channel).
 * y            [local tensor] output of the forward; required with RELU / ADD_RELU and when x
 *              is NULL (d->n > 0); ignored otherwise.
 * dy           [local tensor] gradient of y; required when d->n > 0.
 * gamma, beta  [c] NULL means 1 and 0 (beta is used only to recover x_hat from y).
 * save_mean, save_invstd [c] required: those written by norma_bn_forward_training_mpi (the
 *              same on every rank), or the constants of a frozen layer with GLOBAL_STATS.
 * dx           [local tensor] required when d->n > 0; may alias dy, x or y.
 * dresidual    [local tensor] with ADD_RELU: receives g; may be NULL; may alias dy, x or y.
 * dgamma, dbeta [c] may be NULL when not wanted.
 *
 * Flags used: RELU, ADD_RELU, GLOBAL_STATS, CHECK_FINITE (x, y, dy, gamma, beta, save_* of this
 * rank).
 *
 * Errors: NORMA_ERR_INVALID_ARGUMENT (also: global n * spatial < 2 without GLOBAL_STATS; the
 * descriptors differ between ranks; another rank's arguments were rejected),
 * NORMA_ERR_NONFINITE, NORMA_ERR_OUT_OF_MEMORY, NORMA_ERR_COMMUNICATION.
 */
NORMA_API norma_status norma_bn_backward_mpi(MPI_Comm comm, const norma_bn_desc *d,
    const void *x, const void *y, const void *dy,
    const void *gamma, const void *beta, const void *save_mean, const void *save_invstd,
    void *dx, void *dresidual, void *dgamma, void *dbeta);

/* The detail of the last failed norma_*_mpi call made by this thread (thread-local), e.g.
   "norma_bn_forward_training_mpi: rank 2 of 4 rejected its arguments
   (NORMA_ERR_INVALID_ARGUMENT); nothing written".  "" when none has failed yet.  A successful
   call does not clear it.  Valid until this thread's next failing norma_*_mpi call. */
NORMA_API const char *norma_mpi_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* NORMA_MPI_H */
