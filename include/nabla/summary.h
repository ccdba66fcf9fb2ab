/* nabla/summary.h - TensorBoard event files: scalars (loss, learning rate, throughput,
 * memory, ...) written as a tfevents file that `tensorboard --logdir DIR` shows while the
 * run goes on, like PyTorch's SummaryWriter.add_scalar.
 *
 * Usage:
 *     nb_summary *tb = nb_summary_open("runs/exp1");   // creates the folder
 *     if (!tb) fprintf(stderr, "%s\n", nb_last_error());
 *     for (int64_t s = 1; s <= 100; s++) {
 *         double loss = 1.0 / (double)s;
 *         nb_summary_scalar(tb, "train/loss", s, loss);
 *     }
 *     nb_summary_flush(tb);                   // make what was written visible now
 *     if (nb_summary_close(tb) != NB_OK) fprintf(stderr, "%s\n", nb_last_error());
 *
 * The file is DIR/events.out.tfevents.<unix time>.<host>.<pid> (a number is added when
 * that name exists). Its format is TensorFlow's: records of a little-endian uint64 length,
 * the masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the data; each
 * record is an Event protocol buffer (wall_time, step, and either file_version
 * "brain.Event:2", the first record, or a Summary with one Value: tag and simple_value, a
 * 32-bit float as TensorBoard stores scalars). docs/metrics.md.
 *
 * Errors are values: a failed write returns NB_EIO with nb_last_error() naming the file and
 * the reason, and every later call on the writer returns that status again without
 * writing (a run that lost part of its file knows it at the end, from nb_summary_close).
 * Records are buffered; nb_summary_flush and nb_summary_close write them out.
 *
 * Ownership: nb_summary_open returns a writer the caller closes with nb_summary_close
 * (which frees it, also when it fails). Strings passed in are copied or used during the
 * call only. Not thread-safe: one thread writes to a writer at a time. */
#ifndef NABLA_SUMMARY_H
#define NABLA_SUMMARY_H

#include <stddef.h>
#include <stdint.h>

#include "nabla/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nb_summary nb_summary;

/* Create dir (and its parents) when missing and open a new event file in it, writing the
 * file_version record. NULL with nb_last_error() set (naming dir and the reason) when the
 * folder or the file cannot be made. */
nb_summary *nb_summary_open(const char *dir);
/* Append one scalar: tag (non-empty, e.g. "train/loss"), the step it belongs to, and its
 * value (stored as a float, as TensorBoard does; NaN and infinities are kept). The wall
 * time is the current time. NB_OK, NB_EINVAL for a bad tag, NB_EIO on a failed write (and
 * from then on). */
nb_status nb_summary_scalar(nb_summary *w, const char *tag, int64_t step, double value);
/* The same with a given wall time (seconds since 1970), for replaying a log. */
nb_status nb_summary_scalar_at(nb_summary *w, const char *tag, int64_t step, double value,
                               double wall_time);
/* Write the buffered records to the file. NB_OK or NB_EIO. */
nb_status nb_summary_flush(nb_summary *w);
/* The file's path (owned by the writer, valid until nb_summary_close). */
const char *nb_summary_path(const nb_summary *w);
/* Flush, close and free the writer (NULL: nothing, NB_OK). NB_EIO when any write of the
 * file failed, with the first failure's message. */
nb_status nb_summary_close(nb_summary *w);

/* CRC-32C (Castagnoli) of n bytes, continuing from crc (0 to start), and the masked form
 * TFRecord stores ((crc >> 15 | crc << 17) + 0xa282ead8): for readers of these files. */
uint32_t nb_crc32c(uint32_t crc, const void *data, size_t n);
uint32_t nb_crc32c_masked(const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
