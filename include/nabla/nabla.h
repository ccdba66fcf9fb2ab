/* nabla/nabla.h - the umbrella header: include this one.
 *
 * Usage (build with: cc prog.c $(pkg-config --cflags --libs nabla)):
 *     #include <nabla/nabla.h>
 *     int main(void) {
 *         nb_scope_begin();
 *         nb_tensor *a = nb_arange(0, 6, 1, NB_F32);
 *         nb_tensor *m = nb_view(a, (int64_t[]){2, 3}, 2);
 *         nb_print(nb_sum(m, (int[]){1}, 1, false), stdout);   // tensor([3., 12.])
 *         nb_scope_end();
 *         return 0;
 *     }
 *
 * Each module has its own header, included here; every header says who owns what. */
#ifndef NABLA_NABLA_H
#define NABLA_NABLA_H

#include "nabla/status.h"
#include "nabla/tensor.h"
#include "nabla/memory.h"
#include "nabla/random.h"
#include "nabla/runtime.h"
#include "nabla/autograd.h"
#include "nabla/autocast.h"
#include "nabla/nn.h"
#include "nabla/optim.h"
#include "nabla/cuda.h"
#include "nabla/io.h"
#include "nabla/checkpoint.h"
#include "nabla/stop.h"
#include "nabla/data.h"
#include "nabla/parallel.h"
#include "nabla/mesh.h"
#include "nabla/tp.h"
#include "nabla/gpt.h"
#include "nabla/pipeline.h"
#include "nabla/run.h"
#include "nabla/summary.h"
#include "nabla/trace.h"

#endif
