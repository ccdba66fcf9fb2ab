/* launch.c - checked C entry points for the kernels of kernels_basic.cu: argument checks,
 * the stream (the thread's current one by default) and its device made current, then the
 * raw extern "C" launcher, whose cudaError_t becomes an nb_status. */
#include "cuda/cuda_impl.h"
#include "tensor/error.h"

/* Common prologue: resolve the stream and enter its device. */
static nb_status begin(nb_cuda_stream **s, int *prev, const char *what) {
    *prev = -1;
    if (!(*s = nb__cuda_stream_or_current(*s, what))) return nb_last_status();
    return nb__cuda_enter((*s)->device, prev, what);
}

nb_status nb__cuda_fill_f32(float *dst, float value, int64_t n, nb_cuda_stream *s) {
    const char *what = "cuda fill_f32";
    int prev = -1;
    nb_status st = begin(&s, &prev, what);
    if (st != NB_OK) return st;
    if (n < 0) st = nb__error(NB_EINVAL, "%s: negative element count %lld", what, (long long)n);
    else if (n > 0 && !dst) st = nb__error(NB_ENULL, "%s: argument 'dst' is NULL", what);
    else st = nb__cuda_status(nb__cuda_launch_fill_f32(dst, value, n, s->handle), what);
    nb__cuda_leave(prev);
    return st;
}

nb_status nb__cuda_add_f32(float *out, const float *a, const float *b, int64_t n,
                           nb_cuda_stream *s) {
    const char *what = "cuda add_f32";
    int prev = -1;
    nb_status st = begin(&s, &prev, what);
    if (st != NB_OK) return st;
    if (n < 0) st = nb__error(NB_EINVAL, "%s: negative element count %lld", what, (long long)n);
    else if (n > 0 && (!out || !a || !b))
        st = nb__error(NB_ENULL, "%s: argument '%s' is NULL", what, !out ? "out" : !a ? "a" : "b");
    else st = nb__cuda_status(nb__cuda_launch_add_f32(out, a, b, n, s->handle), what);
    nb__cuda_leave(prev);
    return st;
}
