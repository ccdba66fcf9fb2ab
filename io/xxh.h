/* xxh.h - private: xxHash's XXH3 (the checkpoint checksums of io/), compiled into libnabla
 * from the library's own header (XXH_INLINE_ALL), so libnabla links no libxxhash and a
 * program maps it only if it links it itself (docs/embedding.md). The functions are the
 * library's, with its results bit for bit. Include this instead of <xxhash.h>. */
#ifndef NABLA_IO_XXH_H
#define NABLA_IO_XXH_H

#ifndef XXH_INLINE_ALL
#define XXH_INLINE_ALL
#endif
#include <xxhash.h>

#endif
