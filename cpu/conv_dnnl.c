/* conv_dnnl.c - oneDNN's convolution primitives for the CPU convolution kernels (cpu/conv.c,
 * declared in cpu/conv_dnnl.h): the process-wide choice of the f32 implementation
 * (nb__conv2d_impl, cpu/conv.h), and, where oneDNN is built in, the forward and the input
 * gradient in f32 and bf16, cut into batch slices run on nabla's workers. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/backend.h"
#include "cpu/conv.h"
#include "cpu/conv_dnnl.h"
#include "cpu/cpu_impl.h"
#include "nabla/memory.h"
#include "nabla/runtime.h"
#include "nb_config.h"

#if NB_HAVE_DNNL
#include <pthread.h>
#endif

/* ---- oneDNN convolution primitives (f32 forward and input gradient) ------------------------
 * oneDNN's direct convolution kernels (jit:avx512_core and friends) beat im2col + GEMM on the
 * small convolutions of a CNN: they need no column matrix and work on channel-blocked layouts
 * (nChw16c), to and from which the operands are reordered on each call, as PyTorch does.
 * Forward and input gradient compute each output element on one thread, so they do not
 * depend on the thread count; oneDNN's weight gradient splits its sums over threads, which
 * would, so the weight and bias gradients always come from the im2col + GEMM path above.
 * Buffers (reordered operands, the primitive's scratchpad) come from the caching host
 * allocator; oneDNN caches the generated kernels itself (its primitive cache). */
static atomic_int g_impl = -1; /* -1: not read from the environment yet */

void nb__conv2d_set_impl(nb__conv_impl impl) { atomic_store(&g_impl, (int)impl); }

nb__conv_impl nb__conv2d_impl(void) {
    int v = atomic_load_explicit(&g_impl, memory_order_relaxed);
    if (v >= 0) return (nb__conv_impl)v;
    const char *env = getenv("NB_CONV");
    int r = NB__CONV_AUTO, expected = -1;
    if (env && !strcmp(env, "im2col")) r = NB__CONV_IM2COL;
    if (env && !strcmp(env, "dnnl")) r = NB__CONV_DNNL;
    atomic_compare_exchange_strong(&g_impl, &expected, r);
    return (nb__conv_impl)atomic_load(&g_impl);
}

#if NB_HAVE_DNNL
static dnnl_engine_t g_engine;
static bool g_engine_ok;
static pthread_once_t g_engine_once = PTHREAD_ONCE_INIT;
static void engine_init(void) { g_engine_ok = dnnl_engine_create(&g_engine, dnnl_cpu, 0) == dnnl_success; }

bool nb__conv_dnnl_engine_ok(void) {
    pthread_once(&g_engine_once, engine_init);
    return g_engine_ok;
}

/* Everything one call creates, released together. */
typedef struct dn_call {
    dnnl_stream_t stream;
    dnnl_primitive_attr_t attr;
    /* at most 5 descriptors, 4 primitives, 8 memories and 4 buffers per call */
    dnnl_primitive_desc_t pd[8];
    dnnl_primitive_t prim[8];
    dnnl_memory_t mem[16];
    void *buf[8];
    int npd, nprim, nmem, nbuf;
    dnnl_status_t st; /* first failure */
} dn_call;

static void dn_free(dn_call *c) {
    for (int i = 0; i < c->nprim; i++) dnnl_primitive_destroy(c->prim[i]);
    for (int i = 0; i < c->npd; i++) dnnl_primitive_desc_destroy(c->pd[i]);
    for (int i = 0; i < c->nmem; i++) dnnl_memory_destroy(c->mem[i]);
    for (int i = 0; i < c->nbuf; i++) nb_host_free(c->buf[i]);
    if (c->attr) dnnl_primitive_attr_destroy(c->attr);
    if (c->stream) dnnl_stream_destroy(c->stream);
}

static bool dn_ok(dn_call *c, dnnl_status_t st) {
    if (st != dnnl_success && c->st == dnnl_success) c->st = st;
    return c->st == dnnl_success;
}

/* A buffer from the caching allocator (NULL and dnnl_out_of_memory on failure). */
static void *dn_buf(dn_call *c, size_t bytes) {
    void *p = c->st == dnnl_success ? nb_host_alloc(bytes > 64 ? bytes : 64) : NULL;
    if (!p) {
        dn_ok(c, dnnl_out_of_memory);
        return NULL;
    }
    c->buf[c->nbuf++] = p;
    return p;
}

/* A memory object over ptr (NULL: a fresh buffer of md's size). */
static dnnl_memory_t dn_mem(dn_call *c, const dnnl_memory_desc_t *md, void *ptr) {
    if (c->st != dnnl_success) return NULL;
    if (!ptr && !(ptr = dn_buf(c, dnnl_memory_desc_get_size(md)))) return NULL;
    dnnl_memory_t m = NULL;
    if (!dn_ok(c, dnnl_memory_create(&m, md, g_engine, ptr))) return NULL;
    c->mem[c->nmem++] = m;
    return m;
}

/* Queue a reorder from (from_md, from) to (to_md, to). */
static void dn_reorder(dn_call *c, const dnnl_memory_desc_t *from_md, dnnl_memory_t from,
                       const dnnl_memory_desc_t *to_md, dnnl_memory_t to) {
    if (c->st != dnnl_success) return;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t r = NULL;
    if (!dn_ok(c, dnnl_reorder_primitive_desc_create(&pd, from_md, g_engine, to_md, g_engine,
                                                      NULL)))
        return;
    c->pd[c->npd++] = pd;
    if (!dn_ok(c, dnnl_primitive_create(&r, pd))) return;
    c->prim[c->nprim++] = r;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    dn_ok(c, dnnl_primitive_execute(r, c->stream, 2, args));
}

/* An operand in the layout the primitive wants: the user's memory itself, or a reordered
 * copy (queued now). */
static dnnl_memory_t dn_input(dn_call *c, const dnnl_memory_desc_t *user_md, const void *ptr,
                              const dnnl_memory_desc_t *want) {
    dnnl_memory_t um = dn_mem(c, user_md, (void *)(uintptr_t)ptr);
    if (!um || dnnl_memory_desc_equal(user_md, want)) return um;
    dnnl_memory_t m = dn_mem(c, want, NULL);
    dn_reorder(c, user_md, um, want, m);
    return m;
}

/* Descriptors of the convolution: user layouts (plain NCHW / OIHW or GOIHW) and "any". */
typedef struct dn_descs {
    dnnl_memory_desc_t src, wts, bias, dst, src_any, wts_any, dst_any;
    dnnl_dims_t strides, dilates, pad_l, pad_r;
} dn_descs;

/* dt: the element type of src, weights and dst (f32, or bf16 with f32 accumulation); the
 * bias is always f32. */
static bool dn_describe(dn_call *c, const nb__conv2d_geom *g, dn_descs *d,
                        dnnl_data_type_t dt) {
    dnnl_dims_t sd = {g->N, g->C, g->H, g->W}, dd = {g->N, g->O, g->OH, g->OW}, bd = {g->O};
    dnnl_dims_t wd = {g->groups, g->O / g->groups, g->C / g->groups, g->KH, g->KW};
    bool grouped = g->groups > 1;
    if (!grouped) wd[0] = g->O, wd[1] = g->C, wd[2] = g->KH, wd[3] = g->KW;
    int wn = grouped ? 5 : 4;
    dnnl_format_tag_t wtag = grouped ? dnnl_goihw : dnnl_oihw;
    /* oneDNN checks dst = (src + pad_l + pad_r - extent) / stride + 1 with floor division,
     * so symmetric padding describes PyTorch's output size exactly. Dilation 1 is 0 there. */
    d->strides[0] = g->sh, d->strides[1] = g->sw;
    d->dilates[0] = g->dh - 1, d->dilates[1] = g->dw - 1;
    d->pad_l[0] = d->pad_r[0] = g->ph, d->pad_l[1] = d->pad_r[1] = g->pw;
    return dn_ok(c, dnnl_memory_desc_init_by_tag(&d->src, 4, sd, dt, dnnl_nchw)) &&
           dn_ok(c, dnnl_memory_desc_init_by_tag(&d->dst, 4, dd, dt, dnnl_nchw)) &&
           dn_ok(c, dnnl_memory_desc_init_by_tag(&d->bias, 1, bd, dnnl_f32, dnnl_x)) &&
           dn_ok(c, dnnl_memory_desc_init_by_tag(&d->wts, wn, wd, dt, wtag)) &&
           dn_ok(c, dnnl_memory_desc_init_by_tag(&d->src_any, 4, sd, dt,
                                                 dnnl_format_tag_any)) &&
           dn_ok(c, dnnl_memory_desc_init_by_tag(&d->dst_any, 4, dd, dt,
                                                 dnnl_format_tag_any)) &&
           dn_ok(c, dnnl_memory_desc_init_by_tag(&d->wts_any, wn, wd, dt,
                                                 dnnl_format_tag_any));
}

static bool dn_begin(dn_call *c, const nb__conv2d_geom *g, dn_descs *d, dnnl_data_type_t dt) {
    pthread_once(&g_engine_once, engine_init);
    if (!g_engine_ok) return dn_ok(c, dnnl_runtime_error);
    return dn_ok(c, dnnl_stream_create(&c->stream, g_engine, dnnl_stream_default_flags)) &&
           dn_ok(c, dnnl_primitive_attr_create(&c->attr)) &&
           dn_ok(c, dnnl_primitive_attr_set_scratchpad_mode(c->attr, dnnl_scratchpad_mode_user)) &&
           dn_describe(c, g, d, dt);
}

/* The forward primitive descriptor (also the hint for the backward one). */
static dnnl_primitive_desc_t dn_fwd_pd(dn_call *c, dn_descs *d, bool bias) {
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    if (!dn_ok(c, dnnl_dilated_convolution_forward_desc_init(
                      &cd, dnnl_forward_training, dnnl_convolution_direct, &d->src_any,
                      &d->wts_any, bias ? &d->bias : NULL, &d->dst_any, d->strides,
                      d->dilates, d->pad_l, d->pad_r)) ||
        !dn_ok(c, dnnl_primitive_desc_create(&pd, &cd, c->attr, g_engine, NULL)))
        return NULL;
    c->pd[c->npd++] = pd;
    return pd;
}

static const dnnl_memory_desc_t *dn_md(dnnl_primitive_desc_t pd, dnnl_query_t q) {
    return dnnl_primitive_desc_query_md(pd, q, 0);
}

/* Run the primitive of pd with args plus its scratchpad, then wait for the stream. */
static void dn_run(dn_call *c, dnnl_primitive_desc_t pd, dnnl_exec_arg_t *args, int n) {
    dnnl_primitive_t p = NULL;
    if (c->st != dnnl_success || !dn_ok(c, dnnl_primitive_create(&p, pd))) return;
    c->prim[c->nprim++] = p;
    dnnl_memory_t sp = dn_mem(c, dn_md(pd, dnnl_query_scratchpad_md), NULL);
    if (!sp) return;
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, sp};
    dn_ok(c, dnnl_primitive_execute(p, c->stream, n, args));
}

/* NB_OK; NB_EUNSUPPORTED (no error set) when oneDNN has no kernel for this case, so the
 * caller falls back to im2col; another status (error set) when oneDNN failed. */
static nb_status dn_finish(dn_call *c, const char *what) {
    if (c->st == dnnl_success) dn_ok(c, dnnl_stream_wait(c->stream));
    dnnl_status_t st = c->st;
    dn_free(c);
    if (st == dnnl_success) return NB_OK;
    if (st == dnnl_unimplemented) return NB_EUNSUPPORTED;
    if (st == dnnl_out_of_memory)
        return nb__error(NB_ENOMEM, "conv2d: out of memory in oneDNN's %s", what);
    return nb__error(NB_EINTERNAL, "conv2d: oneDNN's %s failed with status %d", what, (int)st);
}

/* Whether oneDNN should run this convolution. Setting up a primitive costs ~30 us, so small
 * convolutions stay on im2col; and with few input channels per group the column matrix is
 * small and im2col's per-image GEMMs measured faster (1 -> 32 channels, 3x3 on 28x28: 2.3 vs
 * 3.6 ms of CPU per batch of 128), while grouped (e.g. depthwise) convolutions, which im2col
 * splits into tiny per-group GEMMs, always go to oneDNN. */
bool nb__conv_dnnl_wanted(const nb__conv2d_geom *g) {
    nb__conv_impl impl = nb__conv2d_impl();
    if (impl == NB__CONV_IM2COL || g->N == 0) return false;
    if (impl == NB__CONV_DNNL) return true;
    int64_t kg = g->C / g->groups * g->KH * g->KW;
    double macs = (double)g->N * (double)g->O * (double)(g->OH * g->OW) * (double)kg;
    return macs >= (double)(1 << 20) && (kg >= 32 || g->groups > 1);
}

/* x, w, y of type dt (f32 or bf16), b f32 (or NULL). */
static nb_status dn_forward_one(const nb__conv2d_geom *g, dnnl_data_type_t dt, const void *x,
                                const void *w, const float *b, void *y) {
    dn_call c = {0};
    dn_descs d;
    dnnl_primitive_desc_t pd = dn_begin(&c, g, &d, dt) ? dn_fwd_pd(&c, &d, b != NULL) : NULL;
    if (pd) {
        const dnnl_memory_desc_t *dmd = dn_md(pd, dnnl_query_dst_md);
        dnnl_memory_t ms = dn_input(&c, &d.src, x, dn_md(pd, dnnl_query_src_md));
        dnnl_memory_t mw = dn_input(&c, &d.wts, w, dn_md(pd, dnnl_query_weights_md));
        dnnl_memory_t mb = b ? dn_mem(&c, &d.bias, (void *)(uintptr_t)b) : NULL;
        dnnl_memory_t my = dn_mem(&c, &d.dst, y);
        bool direct = dnnl_memory_desc_equal(dmd, &d.dst);
        dnnl_memory_t md = direct ? my : dn_mem(&c, dmd, NULL);
        if (c.st == dnnl_success) {
            dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw},
                                       {DNNL_ARG_DST, md}};
            int n = 3;
            if (b) args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mb};
            dn_run(&c, pd, args, n);
            if (!direct) dn_reorder(&c, dmd, md, &d.dst, my);
        }
    }
    return dn_finish(&c, "convolution forward");
}

/* w, gy, gx of type dt (f32 or bf16). */
static nb_status dn_backward_data_one(const nb__conv2d_geom *g, dnnl_data_type_t dt,
                                      const void *w, const void *gy, void *gx) {
    dn_call c = {0};
    dn_descs d;
    dnnl_primitive_desc_t fpd = dn_begin(&c, g, &d, dt) ? dn_fwd_pd(&c, &d, false) : NULL;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    if (fpd && dn_ok(&c, dnnl_dilated_convolution_backward_data_desc_init(
                             &cd, dnnl_convolution_direct, &d.src_any, &d.wts_any, &d.dst_any,
                             d.strides, d.dilates, d.pad_l, d.pad_r)) &&
        dn_ok(&c, dnnl_primitive_desc_create(&pd, &cd, c.attr, g_engine, fpd))) {
        c.pd[c.npd++] = pd;
        const dnnl_memory_desc_t *smd = dn_md(pd, dnnl_query_diff_src_md);
        dnnl_memory_t mw = dn_input(&c, &d.wts, w, dn_md(pd, dnnl_query_weights_md));
        dnnl_memory_t mg = dn_input(&c, &d.dst, gy, dn_md(pd, dnnl_query_diff_dst_md));
        dnnl_memory_t mx = dn_mem(&c, &d.src, gx);
        bool direct = dnnl_memory_desc_equal(smd, &d.src);
        dnnl_memory_t ms = direct ? mx : dn_mem(&c, smd, NULL);
        if (c.st == dnnl_success) {
            dnnl_exec_arg_t args[4] = {{DNNL_ARG_DIFF_DST, mg}, {DNNL_ARG_WEIGHTS, mw},
                                       {DNNL_ARG_DIFF_SRC, ms}};
            dn_run(&c, pd, args, 3);
            if (!direct) dn_reorder(&c, smd, ms, &d.src, mx);
        }
    }
    return dn_finish(&c, "convolution backward (data)");
}

/* ---- batch slices on nabla's workers -----------------------------------------------------------
 * A oneDNN primitive runs on OpenMP threads, which sleep between calls (the passive wait
 * policy, docs/threads.md) and take tens of microseconds to wake, four times per call (the
 * reorders and the convolution). So the batch is cut into slices of DN_SLICES-th of it (a
 * size that depends on N alone), and each slice is one call above, made from a task of
 * nabla's workers, where oneDNN creates and runs its primitives on that one thread. Every
 * output element is computed within one slice's call, by a primitive whose shape does not
 * depend on the thread count, so neither do the bits; at one thread the slices run in turn
 * on the calling thread, so its bits are those of every other thread count. */
#define DN_SLICES 16

typedef struct dn_slice_job {
    const nb__conv2d_geom *g;
    dnnl_data_type_t dt;
    bool backward;
    const void *x, *w, *gy;
    const float *b;
    void *y, *gx;
    int64_t per;             /* images per slice */
    size_t in_img, out_img;  /* bytes of one image of x (gx) and y (gy) */
    nb__task_status ts;
} dn_slice_job;

static void dn_slice_task(int64_t t, void *p) {
    dn_slice_job *j = p;
    if (nb__task_failed(&j->ts)) return;
    nb__conv2d_geom gs = *j->g;
    int64_t n0 = t * j->per;
    gs.N = gs.N - n0 < j->per ? gs.N - n0 : j->per;
    size_t oi = (size_t)n0 * j->in_img, oo = (size_t)n0 * j->out_img;
    nb_status st =
        j->backward
            ? dn_backward_data_one(&gs, j->dt, j->w, (const char *)j->gy + oo, (char *)j->gx + oi)
            : dn_forward_one(&gs, j->dt, (const char *)j->x + oi, j->w, j->b, (char *)j->y + oo);
    if (st != NB_OK) nb__task_fail(&j->ts, st);
}

static nb_status dn_sliced(dn_slice_job *j) {
    const nb__conv2d_geom *g = j->g;
    if (g->N <= 0) return NB_OK;
    size_t es = j->dt == dnnl_bf16 ? 2 : 4;
    j->per = (g->N + DN_SLICES - 1) / DN_SLICES;
    j->in_img = es * (size_t)(g->C * g->H * g->W);
    j->out_img = es * (size_t)(g->O * g->OH * g->OW);
    int64_t slices = (g->N + j->per - 1) / j->per;
    /* Always as tasks, also on one thread: a task's oneDNN calls run on its thread only. */
    nb__run_tasks(slices, nb_get_num_threads(), dn_slice_task, j);
    if (!nb__task_failed(&j->ts)) return NB_OK;
    /* no oneDNN kernel for this shape: no error set, the caller falls back to im2col */
    if (j->ts.status == NB_EUNSUPPORTED) return NB_EUNSUPPORTED;
    return nb__task_result(&j->ts);
}

nb_status nb__conv_dnnl_forward(const nb__conv2d_geom *g, dnnl_data_type_t dt, const void *x,
                            const void *w, const float *b, void *y) {
    dn_slice_job j = {.g = g, .dt = dt, .x = x, .w = w, .b = b, .y = y};
    return dn_sliced(&j);
}

nb_status nb__conv_dnnl_backward_data(const nb__conv2d_geom *g, dnnl_data_type_t dt, const void *w,
                                  const void *gy, void *gx) {
    dn_slice_job j = {.g = g, .dt = dt, .backward = true, .w = w, .gy = gy, .gx = gx};
    return dn_sliced(&j);
}
#endif /* NB_HAVE_DNNL */
