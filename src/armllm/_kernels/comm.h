/* comm.h: the all-reduce of tensor-parallel ranks, through one shared memory
 * segment that every rank (a process) maps.
 *
 * Layout: a header, two barriers, then one input buffer per rank and one
 * output buffer, each of max_floats floats, then two sets of one small buffer
 * per rank. armllm_comm_allreduce(rank, data,
 * n) sums `data` over the ranks in place, in slices of at most max_floats:
 *   1. each rank copies its slice into its input buffer; barrier;
 *   2. reduce-scatter: rank r sums its 1/N of the slice over the ranks' inputs
 *      in rank order 0, 1, ..., N-1 (so every element has one fixed summation
 *      order) into the output buffer; barrier;
 *   3. all-gather: each rank copies the output buffer back into `data`.
 * Every rank therefore ends with the same bits, and runs are deterministic.
 * An all-reduce of at most 16,384 floats (a decode step's hidden vectors) takes
 * one barrier instead: each rank copies data into its own small buffer; barrier;
 * every rank sums all the small buffers in the same rank order into its data.
 * That is N-1 adds of the whole vector on every rank instead of 1/N of them, and
 * saves a barrier and the output buffer's round trip, which cost more at these
 * sizes. Two sets of small buffers alternate, so a fast rank's next call never
 * overwrites a buffer a slow rank is still reading.
 * A barrier is a count taken with fetch-add (LSE ldaddal on Arm where the CPU
 * has it, else LL/SC; lock xadd on x86) and a generation word the last rank
 * bumps; the others spin briefly, then sleep on the generation with a shared
 * futex. The buffers are reused only after the next call's first barrier,
 * when every rank has finished reading them. */
#ifndef ARMLLM_COMM_H
#define ARMLLM_COMM_H

#include <stddef.h>
#include <stdint.h>

#define ARMLLM_COMM_MAX_RANKS 64

/* Bytes of a segment for `ranks` ranks and slices of `max_floats` floats. */
size_t armllm_comm_segment_bytes(int ranks, int64_t max_floats);

/* Lays out a zeroed segment (done once, by its creator, before the ranks use it). */
void armllm_comm_init(void *segment, int ranks, int64_t max_floats);

/* 0 if `segment` was laid out for `ranks` and `max_floats`, else -1. */
int armllm_comm_check(const void *segment, int ranks, int64_t max_floats);

/* Every call below returns 0, or -1 once the segment is aborted (then what it
 * was writing is undefined). */

/* Sums data[0..n) over the ranks, in place; every rank calls it with the same n. */
int armllm_comm_allreduce(void *segment, int rank, float *data, int64_t n);

/* Where this rank's values for its next all-reduce of n floats go when that
 * takes the one-barrier path, else NULL (n too large, or one rank). A producer
 * that writes its output there (the o and down projections of a tensor-parallel
 * layer) and then calls armllm_comm_allreduce_staged saves the copy in: the
 * stores into lines the other ranks last read happen inside its own work. */
float *armllm_comm_staging(void *segment, int rank, int64_t n);

/* armllm_comm_allreduce of values already written to
 * armllm_comm_staging(segment, rank, n), which must not have returned NULL: the
 * sum lands in data[0..n). */
int armllm_comm_allreduce_staged(void *segment, int rank, float *data, int64_t n);

/* Copies `bytes` bytes of rank 0's `data` into every other rank's `data`, in
 * slices of the output buffer (barrier: the buffer's last readers are done;
 * rank 0 writes a slice; barrier; the others read it): how rank 0 hands each
 * step's batch to the other ranks. */
int armllm_comm_broadcast(void *segment, int rank, void *data, int64_t bytes);

/* Gathers column blocks onto rank 0: rank r holds columns [col_start[r],
 * col_start[r + 1]) of a [rows, col_start[ranks]] matrix (how the lm_head's
 * vocabulary shards leave their logits); `data` points at its first column and
 * `ld` is its row stride. Rank 0's `data` is the whole matrix (its own columns
 * come first), into which every other rank's block is copied, in slices of
 * whole rows that fit one input buffer (each rank packs its block into its
 * buffer; barrier; rank 0 copies them out; barrier: the buffers are free). */
int armllm_comm_gather_cols(void *segment, int rank, float *data, int64_t rows, int64_t ld,
                            const int64_t *col_start);

/* Marks the segment aborted and wakes every rank waiting in it: their calls, and
 * every later call, return -1 (a rank died; any process may call it). */
void armllm_comm_abort(void *segment);

/* The fetch-add the barriers use ("ldaddal", "ldaxr/stlxr", "lock xadd"). */
const char *armllm_comm_atomic_impl(void);

#endif /* ARMLLM_COMM_H */
