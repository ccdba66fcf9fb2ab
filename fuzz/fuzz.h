/* fuzz.h - what the fuzz targets share: the libFuzzer entry point's prototype and a
 * file holding the input, for readers that take a path.
 *
 * Each target calls one reader of the public API on the input and frees everything it got
 * back, so that AddressSanitizer's leak check (on in libFuzzer runs) fails on a leak as it
 * fails on a crash. docs/testing.md says how to build and run them. */
#ifndef NABLA_FUZZ_H
#define NABLA_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The input as a file: an anonymous memory file (no disk, nothing left behind), reached by
 * the path /proc/self/fd/N written into path. Returns the descriptor (close it after use)
 * or aborts: a harness that cannot make its file must not report the input as fine. */
static inline int fuzz_file(const uint8_t *data, size_t size, char *path, size_t cap) {
    int fd = memfd_create("nabla-fuzz", 0);
    if (fd < 0) {
        perror("fuzz: memfd_create");
        abort();
    }
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            perror("fuzz: write");
            abort();
        }
        done += (size_t)w;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

/* A failed invariant of the library (not an error it reported): stop so the fuzzer saves
 * the input. */
#define FUZZ_CHECK(cond)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "fuzz: %s:%d: invariant failed: %s\n", __FILE__, __LINE__,  \
                    #cond);                                                              \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#endif
