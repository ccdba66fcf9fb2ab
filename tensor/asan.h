/* asan.h - private: whether this build runs under AddressSanitizer, and the macros that mark
 * memory nabla holds but nobody may touch (cached allocator blocks, released tensor headers).
 *
 * gcc defines __SANITIZE_ADDRESS__ under -fsanitize=address; clang (the fuzz targets'
 * compiler) only answers __has_feature(address_sanitizer). Test both, or clang ASan builds
 * would read freed, cached blocks without a report (tools/check-asan-poison checks). */
#ifndef NABLA_TENSOR_ASAN_H
#define NABLA_TENSOR_ASAN_H

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NB__ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(NB__ASAN)
#define NB__ASAN 1
#endif

#if defined(NB__ASAN)
#include <sanitizer/asan_interface.h>
#define NB__POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define NB__UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define NB__POISON(p, n) ((void)(p), (void)(n))
#define NB__UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#endif
