/* convert.c - CPU copy/convert and fill kernels (arithmetic only; see tensor/copy.c). */
#include <math.h>
#include <string.h>

#include "cpu/backend.h"
#include "cpu/cpu_impl.h"

typedef struct {
    nb_dtype out, in;
} conv_ctx;

/* Same dtype: plain moves; memcpy for contiguous runs. */
static void copy_same(char **p, const int64_t *s, int64_t n, void *vctx) {
    conv_ctx *c = vctx;
    size_t es = nb_dtype_size(c->out);
    if (s[0] == (int64_t)es && s[1] == (int64_t)es) {
        memcpy(p[0], p[1], (size_t)n * es);
        return;
    }
    char *o = p[0];
    const char *i = p[1];
    switch (es) {
    case 1: for (int64_t k = 0; k < n; k++, o += s[0], i += s[1]) *(uint8_t *)o = *(const uint8_t *)i; break;
    case 2: for (int64_t k = 0; k < n; k++, o += s[0], i += s[1]) *(uint16_t *)o = *(const uint16_t *)i; break;
    case 4: for (int64_t k = 0; k < n; k++, o += s[0], i += s[1]) *(uint32_t *)o = *(const uint32_t *)i; break;
    default: for (int64_t k = 0; k < n; k++, o += s[0], i += s[1]) *(uint64_t *)o = *(const uint64_t *)i; break;
    }
}

/* The hot conversions of mixed precision: f32 <-> f16/bf16 on contiguous runs. */
static void copy_half(char **p, const int64_t *s, int64_t n, void *vctx) {
    conv_ctx *c = vctx;
    bool flat = s[0] == (int64_t)nb_dtype_size(c->out) && s[1] == (int64_t)nb_dtype_size(c->in);
    if (flat) {
        if (c->out == NB_F32 && c->in == NB_BF16) nb__bf16_to_f32_n((const uint16_t *)p[1], (float *)p[0], n);
        else if (c->out == NB_F32) nb__f16_to_f32_n((const uint16_t *)p[1], (float *)p[0], n);
        else if (c->out == NB_BF16) nb__f32_to_bf16_n((const float *)p[1], (uint16_t *)p[0], n);
        else nb__f32_to_f16_n((const float *)p[1], (uint16_t *)p[0], n);
        return;
    }
    for (int64_t k = 0; k < n; k++) {
        float v = c->in == NB_F32    ? *(const float *)(p[1] + k * s[1])
                  : c->in == NB_BF16 ? nb_bf16_to_f32(*(const uint16_t *)(p[1] + k * s[1]))
                                     : nb_f16_to_f32(*(const uint16_t *)(p[1] + k * s[1]));
        char *o = p[0] + k * s[0];
        if (c->out == NB_F32) *(float *)o = v;
        else if (c->out == NB_BF16) *(uint16_t *)o = nb_f32_to_bf16(v);
        else *(uint16_t *)o = nb_f32_to_f16(v);
    }
}

static bool is_int(nb_dtype dt) { return dt == NB_I32 || dt == NB_I64 || dt == NB_U8; }

static int64_t load_int(const char *p, nb_dtype dt) {
    return dt == NB_I64 ? *(const int64_t *)p : dt == NB_I32 ? *(const int32_t *)p : *(const uint8_t *)p;
}

/* Everything else: integers move exactly through int64, the rest through double. */
static void copy_general(char **p, const int64_t *s, int64_t n, void *vctx) {
    conv_ctx *c = vctx;
    bool ints = is_int(c->in) && (is_int(c->out) || c->out == NB_BOOL);
    for (int64_t k = 0; k < n; k++) {
        char *o = p[0] + k * s[0];
        const char *i = p[1] + k * s[1];
        if (ints) {
            int64_t v = load_int(i, c->in);
            switch (c->out) {
            case NB_I64: *(int64_t *)o = v; break;
            case NB_I32: *(int32_t *)o = (int32_t)(uint32_t)(uint64_t)v; break;
            case NB_U8: *(uint8_t *)o = (uint8_t)(uint64_t)v; break;
            default: *(uint8_t *)o = v != 0; break;
            }
        } else {
            nb__store_f64(o, c->out, nb__load_f64(i, c->in));
        }
    }
}

static nb_status cpu_copy(const nb__copy_args *a) {
    const nb__iter *it = &a->it;
    conv_ctx c = {it->dtype[0], it->dtype[1]};
    nb__iter_fn fn = copy_general;
    bool half_out = c.out == NB_F16 || c.out == NB_BF16, half_in = c.in == NB_F16 || c.in == NB_BF16;
    if (c.out == c.in) fn = copy_same;
    else if ((half_out && c.in == NB_F32) || (half_in && c.out == NB_F32)) fn = copy_half;
    nb__iter_for_each(it, fn, &c, NB__GRAIN);
    return NB_OK;
}

typedef struct {
    size_t es;
    unsigned char bytes[8];
} fill_ctx;

static void fill_run(char **p, const int64_t *s, int64_t n, void *vctx) {
    fill_ctx *c = vctx;
    char *o = p[0];
    if (c->es == 4 && s[0] == 4) {
        uint32_t v;
        memcpy(&v, c->bytes, 4);
        uint32_t *restrict q = (uint32_t *)o;
        for (int64_t k = 0; k < n; k++) q[k] = v;
        return;
    }
    for (int64_t k = 0; k < n; k++, o += s[0]) memcpy(o, c->bytes, c->es);
}

static nb_status cpu_fill(const nb__fill_args *a) {
    const nb__iter *it = &a->it;
    size_t es = nb_dtype_size(it->dtype[0]);
    if (a->value == 0.0 && !signbit(a->value) && nb__iter_is_flat(it)) {
        memset(it->data[0], 0, (size_t)it->numel * es); /* all dtypes: zero is all bits 0 */
        return NB_OK;
    }
    fill_ctx c = {es, {0}};
    nb__store_f64(c.bytes, it->dtype[0], a->value);
    nb__iter_for_each(it, fill_run, &c, NB__GRAIN);
    return NB_OK;
}

/* Registers the core family's copy and fill (cpu/elementwise.c adds ew and ew_backward). */
void nb__cpu_register_convert(nb__kernels *k) {
    k->copy = cpu_copy;
    k->fill = cpu_fill;
}
