/* layers.c - the linear op (nb_linear: one GEMM forward, two GEMMs and a column sum
 * backward, recorded as ONE autograd node) and the simple modules of the layer library:
 * Linear, Embedding, Flatten and the activation modules.
 *
 * Linear without copies: x (..., in) is read as an (M, in) matrix when its leading dims fold
 * into rows (any contiguous input, row slices of a larger matrix) or as a column-major
 * (M, in) matrix (a transposed view); the weight (out, in) goes to the GEMM as the
 * transposed operand in whatever layout it is stored. Only other layouts are copied. The
 * bias goes to the `gemm` kernel (tensor/kernels/matmul.h), which writes it into every
 * output row first and adds the product onto it (beta = 1), so the bias costs one write
 * pass and no extra read. bf16 operands go to the GEMM as they are where the device's gemm
 * takes them (f32 sums, f32 output rounded to bf16 once); f16, and bf16 elsewhere, are
 * computed in f32. Each GEMM is one nb__run_gemm. */
#include <math.h>
#include <string.h>

#include "tensor/tape.h"
#include "nabla/nn.h"
#include "tensor/backend.h"
#include "tensor/autocast.h"
#include "nn/nn_impl.h"

/* ---- matrices as the GEMM sees them ---------------------------------------------------------- */
/* A (rows x cols) matrix: element (i, j) at p[i * ld + j] (trans false) or p[j * ld + i]
 * (trans true, i.e. stored column-major). */
typedef struct lin_mat {
    const void *p;
    int64_t rows, cols, ld;
    bool trans;
} lin_mat;


/* View t (..., cols) as a (rows x cols) matrix without copying, if its layout allows. */
static bool as_matrix(const nb_tensor *t, lin_mat *m) {
    int nd = t->ndim;
    int64_t cols = t->shape[nd - 1], scol = t->strides[nd - 1], srow = 0;
    int64_t rows = nb__numel_of(t->shape, nd - 1);
    if (!nb__dims_collapse(t->shape, t->strides, nd - 1, &srow)) return false;
    int64_t mr = rows > 1 ? rows : 1, mc = cols > 1 ? cols : 1;
    *m = (lin_mat){nb__ptr(t), rows, cols, 0, false};
    if ((cols <= 1 || scol == 1) && (rows <= 1 || srow >= mc)) {
        m->ld = rows <= 1 ? mc : srow;
        return true;
    }
    if ((rows <= 1 || srow == 1) && (cols <= 1 || scol >= mr)) {
        m->trans = true;
        m->ld = cols <= 1 ? mr : scol;
        return true;
    }
    return false;
}

/* t in dtype cdt as a GEMM operand: t itself when possible, else a contiguous copy (in the
 * current scope). NULL on failure. */
static nb_tensor *operand(nb_tensor *t, nb_dtype cdt, lin_mat *m) {
    if (t->dtype != cdt && !(t = nb_to_dtype(t, cdt))) return NULL;
    if (as_matrix(t, m)) return t;
    if (!(t = nb_contiguous(t))) return NULL;
    bool ok = as_matrix(t, m);
    NB__ASSERT(ok);
    return t;
}

/* C (M, N), row stride ldc, = op(A) @ op(B), plus the bias (N elements) in every row when
 * bias is non-NULL; ta/tb say whether the stored A and B are read transposed. */
static nb_status gemm(nb_device dev, nb_dtype odt, bool ta, bool tb, int64_t M, int64_t N,
                      int64_t K, const lin_mat *A, const lin_mat *B, const void *bias, void *C,
                      int64_t ldc, nb_dtype cdt) {
    nb__gemm_args g = {.dtype = odt, .trans_a = ta, .trans_b = tb, .M = M, .N = N, .K = K,
                       .alpha = 1.0, .beta = bias ? 1.0 : 0.0, .a = A->p, .lda = A->ld,
                       .b = B->p, .ldb = B->ld, .c = C, .ldc = ldc, .bias = bias,
                       .c_bf16 = cdt == NB_BF16};
    return nb__run_gemm(dev, "linear", &g);
}

/* The dtype of the outputs (and bias) of the GEMMs. */
static nb_dtype compute_dtype(nb_dtype dt) { return dt == NB_F64 ? NB_F64 : NB_F32; }
/* The dtype the operands go to the GEMM in: bf16 as it is where the device takes it; then
 * the GEMM also writes bf16 results directly (rounded once from f32 sums). */
static nb_dtype operand_dtype(nb_dtype dt, nb_device dev) {
    return dt == NB_BF16 && nb__gemm_takes_bf16(dev) ? NB_BF16 : compute_dtype(dt);
}

/* ---- nb_linear ---------------------------------------------------------------------------- */
/* The arguments' checks; their common device in *dev. */
static bool linear_check(nb_tensor *x, nb_tensor *w, nb_tensor *b, nb_device *dev) {
    if (!nb__check_devices("linear", (nb_tensor *[]){x, w, b}, 3, dev)) return false;
    if (!nb_dtype_is_float(x->dtype)) {
        nb__error(NB_EDTYPE, "linear: input dtype %s is not supported (f32, f64, f16 or bf16)",
                  nb_dtype_name(x->dtype));
        return false;
    }
    if (w->dtype != x->dtype || (b && b->dtype != x->dtype)) {
        nb__error(NB_EDTYPE, "linear: input, weight%s must have one dtype, got %s, %s%s%s",
                  b ? " and bias" : "", nb_dtype_name(x->dtype), nb_dtype_name(w->dtype),
                  b ? ", " : "", b ? nb_dtype_name(b->dtype) : "");
        return false;
    }
    if (w->ndim != 2) {
        nb__error(NB_ESHAPE, "linear: weight must be 2-D (out_features, in_features), got "
                  "shape %s", NB__SHAPE(w));
        return false;
    }
    if (x->ndim < 1) {
        nb__error(NB_ESHAPE, "linear: input must have at least 1 dimension (..., in_features), "
                  "got a 0-dim tensor");
        return false;
    }
    if (x->shape[x->ndim - 1] != w->shape[1]) {
        nb__error(NB_ESHAPE, "linear: input has %lld features but the weight expects %lld "
                  "(input %s, weight %s)", (long long)x->shape[x->ndim - 1],
                  (long long)w->shape[1], NB__SHAPE(x), NB__SHAPE(w));
        return false;
    }
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0])) {
        nb__error(NB_ESHAPE, "linear: bias must have shape [%lld] to match the weight %s, got "
                  "%s", (long long)w->shape[0], NB__SHAPE(w), NB__SHAPE(b));
        return false;
    }
    return true;
}

nb_tensor *nb_linear(nb_tensor *x, nb_tensor *w, nb_tensor *b) {
    NB__CHECK_ARG(x, "linear", "x");
    NB__CHECK_ARG(w, "linear", "w");
    x = nb__autocast(x, NB_AUTOCAST_LOW); /* nabla/autocast.h: the casts are on the tape */
    if (w && !(w = nb__autocast(w, NB_AUTOCAST_LOW))) return NULL;
    if (b && !(b = nb__autocast(b, NB_AUTOCAST_LOW))) return NULL;
    if (!x) return NULL;
    nb_device dev;
    if (!linear_check(x, w, b, &dev)) return NULL;
    nb_dtype dt = x->dtype, cdt = compute_dtype(dt), odt = operand_dtype(dt, dev);
    int64_t K = w->shape[1], N = w->shape[0], M = nb__numel_of(x->shape, x->ndim - 1);
    int64_t oshape[NB_MAX_DIMS];
    memcpy(oshape, x->shape, sizeof(int64_t) * (size_t)x->ndim);
    oshape[x->ndim - 1] = N;

    bool prev = nb_set_grad_enabled(false);
    nb_scope_begin();
    nb_dtype rdt = odt == NB_BF16 ? NB_BF16 : cdt; /* the GEMM's output */
    nb_tensor *out = nb__empty(oshape, x->ndim, rdt, dev);
    lin_mat X, W;
    nb_tensor *xc = out ? operand(x, odt, &X) : NULL;
    nb_tensor *wc = xc ? operand(w, odt, &W) : NULL;
    /* The bias goes to the GEMM in f32. With a bf16 result it is a bf16 tensor widened
     * (x, w and b share one dtype), so its values are bf16 numbers: the CUDA GEMM passes
     * cuBLASLt a bf16 copy (the bias type cuBLASLt documents for a bf16 output), exactly. */
    nb_tensor *bc = wc && b ? nb_contiguous(nb_to_dtype(b, cdt)) : NULL;
    nb_status st = wc && (bc || !b) ? NB_OK : nb_last_status();
    if (st == NB_OK && M > 0 && N > 0) {
        /* out (M, N) = X (M, K) @ W^T + b; W^T is W with the transpose flag flipped. */
        st = gemm(dev, odt, X.trans, !W.trans, M, N, K, &X, &W, bc ? nb__ptr(bc) : NULL,
                  nb__ptr(out), N, rdt);
    }
    if (st == NB_OK && rdt != dt) out = nb_to_dtype(out, dt);
    if (st != NB_OK || !out) out = NULL;
    nb_keep(out);
    nb_scope_end();
    nb_set_grad_enabled(prev);
    if (!out) return NULL;

    nb__node *nd = nb__record(out, NB__OP_LINEAR, (nb_tensor *[]){x, w, b}, 3);
    if (nd) {
        nb__save(nd, 0, x);
        nb__save(nd, 1, w);
    }
    return out;
}

static bool wants(const nb__node *n, int i) { return n->edges[i].node || n->edges[i].leaf; }

nb_status nb__bw_LINEAR(nb__node *n, nb_tensor *g, nb_tensor **gin) {
    nb_tensor *x = n->saved[0], *w = n->saved[1];
    nb_dtype cdt = compute_dtype(x->dtype);
    int64_t K = w->shape[1], N = w->shape[0], M = nb__numel_of(x->shape, x->ndim - 1);
    nb_device dev;
    if (!nb__check_devices("linear", (nb_tensor *[]){g, x, w}, 3, &dev)) return nb_last_status();
    nb_dtype odt = operand_dtype(x->dtype, dev), rdt = odt == NB_BF16 ? NB_BF16 : cdt;
    lin_mat G, X, W;
    nb_tensor *gc = operand(g, odt, &G);
    if (!gc) return nb_last_status();
    nb_status st = NB_OK;
    /* An empty inner dim (N for dx, M for dw) makes the GEMM write zeros. */
    if (wants(n, 0)) {
        /* dx (M, K) = G (M, N) @ W (N, K) */
        nb_tensor *dx = operand(w, odt, &W) ? nb__empty(x->shape, x->ndim, rdt, dev) : NULL;
        if (!dx) return nb_last_status();
        if (M > 0 && K > 0 &&
            (st = gemm(dev, odt, G.trans, W.trans, M, K, N, &G, &W, NULL, nb__ptr(dx), K, rdt)))
            return st;
        gin[0] = dx;
    }
    if (wants(n, 1)) {
        /* dw (N, K) = G^T (N, M) @ X (M, K) */
        nb_tensor *dw = operand(x, odt, &X) ? nb__empty(w->shape, 2, rdt, dev) : NULL;
        if (!dw) return nb_last_status();
        if (N > 0 && K > 0 &&
            (st = gemm(dev, odt, !G.trans, X.trans, N, K, M, &G, &X, NULL, nb__ptr(dw), K, rdt)))
            return st;
        gin[1] = dw;
    }
    if (n->ninputs > 2 && wants(n, 2)) {
        /* db = sum of g over the leading dims (the reduction's deterministic column path). */
        int dims[NB_MAX_DIMS];
        for (int d = 0; d < gc->ndim - 1; d++) dims[d] = d;
        gin[2] = gc->ndim > 1 ? nb_sum(gc, dims, gc->ndim - 1, false)
                              : nb__scope_add(nb_tensor_retain(gc));
        if (!gin[2]) return nb_last_status();
    }
    return NB_OK;
}

/* ---- modules --------------------------------------------------------------------------------- */
static nb_module *fail_module(nb_module *m, nb_tensor *pending) {
    if (pending) nb_tensor_free(nb__scope_take(pending));
    nb_module_free(m);
    return NULL;
}

static nb_tensor *linear_forward(nb_module *m, nb_tensor *x) {
    return nb_linear(x, nb_module_param(m, "weight"), nb_module_param_opt(m, "bias"));
}
static const nb_module_vtable linear_vt = {.type_name = "Linear", .forward = linear_forward};

nb_linear_opts nb_linear_defaults(void) {
    return (nb_linear_opts){._init = NB__OPTS_MARK(nb_linear_opts), .dtype = NB_F32};
}

nb_module *nb_linear_new(int64_t in_features, int64_t out_features, const nb_linear_opts *o) {
    if (o && NB__OPTS_CHECK(o, nb_linear_opts, "linear", "nb_linear_defaults()",
                            "o.no_bias = true") != NB_OK)
        return NULL;
    nb_linear_opts opt = o ? *o : nb_linear_defaults();
    if (in_features < 0 || out_features < 0) {
        nb__error(NB_EINVAL, "linear: in_features and out_features must be >= 0, got %lld and "
                  "%lld", (long long)in_features, (long long)out_features);
        return NULL;
    }
    if (!nb_dtype_is_float(opt.dtype)) {
        nb__error(NB_EDTYPE, "linear: parameters must have a float dtype, not %s",
                  nb_dtype_name(opt.dtype));
        return NULL;
    }
    nb_module *m = nb_module_new(&linear_vt, NULL);
    if (!m) return NULL;
    /* PyTorch's reset_parameters: kaiming_uniform(a = sqrt(5)), which is
     * U(-1/sqrt(in), 1/sqrt(in)), and the bias from the same bound. */
    nb_tensor *w = nb_empty((int64_t[]){out_features, in_features}, 2, opt.dtype);
    if (!w) return fail_module(m, NULL);
    if (in_features > 0 &&
        nb_init_kaiming_uniform_(w, sqrt(5.0), false, NB_NONLIN_LEAKY_RELU, opt.gen) != NB_OK)
        return fail_module(m, w);
    if (!nb_module_add_parameter(m, "weight", w)) return fail_module(m, NULL);
    if (!opt.no_bias) {
        double bound = in_features > 0 ? 1.0 / sqrt((double)in_features) : 0.0;
        nb_tensor *b = nb_empty(&out_features, 1, opt.dtype);
        if (!b) return fail_module(m, NULL);
        if (nb_init_uniform_(b, -bound, bound, opt.gen) != NB_OK) return fail_module(m, b);
        if (!nb_module_add_parameter(m, "bias", b)) return fail_module(m, NULL);
    }
    return m;
}

static nb_tensor *embedding_forward(nb_module *m, nb_tensor *x) {
    return nb_embedding(nb_module_param(m, "weight"), x);
}
static const nb_module_vtable embedding_vt = {.type_name = "Embedding",
                                              .forward = embedding_forward};

nb_module *nb_embedding_new(int64_t num_embeddings, int64_t dim, nb_generator *gen) {
    if (num_embeddings < 0 || dim < 0) {
        nb__error(NB_EINVAL, "embedding: num_embeddings and dim must be >= 0, got %lld and "
                  "%lld", (long long)num_embeddings, (long long)dim);
        return NULL;
    }
    nb_module *m = nb_module_new(&embedding_vt, NULL);
    if (!m) return NULL;
    nb_tensor *w = nb_randn((int64_t[]){num_embeddings, dim}, 2, NB_F32, gen); /* N(0, 1) */
    if (!w) return fail_module(m, NULL);
    if (!nb_module_add_parameter(m, "weight", w)) return fail_module(m, NULL);
    return m;
}

/* Flatten: dims start..end into one (torch.nn.Flatten). */
typedef struct flatten_self {
    int start, end;
} flatten_self;

static nb_tensor *flatten_forward(nb_module *m, nb_tensor *x) {
    const flatten_self *s = nb_module_self(m);
    return nb_flatten(x, s->start, s->end);
}
static const nb_module_vtable flatten_vt = {.type_name = "Flatten", .forward = flatten_forward,
                                            .free_self = free};

nb_module *nb_flatten_new(int start_dim, int end_dim) {
    flatten_self *s = malloc(sizeof *s);
    if (!s) {
        nb__error(NB_ENOMEM, "flatten: out of memory");
        return NULL;
    }
    /* (0, 0) is "options left at zero": PyTorch's defaults (1, -1), which keep the batch dim.
     * (Flattening dim 0 alone would be a no-op anyway.) */
    if (start_dim == 0 && end_dim == 0) start_dim = 1, end_dim = -1;
    *s = (flatten_self){start_dim, end_dim};
    nb_module *m = nb_module_new(&flatten_vt, s);
    if (!m) free(s);
    return m;
}

/* Activations: forward is the tensor op. */
#define NB__ACTIVATION(fn, tname, op)                                                      \
    static nb_tensor *fn##_forward(nb_module *m, nb_tensor *x) {                           \
        (void)m;                                                                           \
        return op(x);                                                                      \
    }                                                                                      \
    static const nb_module_vtable fn##_vt = {.type_name = tname, .forward = fn##_forward};
NB__ACTIVATION(relu, "ReLU", nb_relu)
NB__ACTIVATION(gelu, "GELU", nb_gelu)
NB__ACTIVATION(gelu_tanh, "GELU", nb_gelu_tanh)
NB__ACTIVATION(silu, "SiLU", nb_silu)
NB__ACTIVATION(tanh, "Tanh", nb_tanh)
NB__ACTIVATION(sigmoid, "Sigmoid", nb_sigmoid)
#undef NB__ACTIVATION

nb_module *nb_relu_new(void) { return nb_module_new(&relu_vt, NULL); }
bool nb__relu_module(const nb_module *m) { return nb__module_vtable(m) == &relu_vt; }
nb_module *nb_gelu_new(bool tanh_approx) {
    return nb_module_new(tanh_approx ? &gelu_tanh_vt : &gelu_vt, NULL);
}
nb_module *nb_silu_new(void) { return nb_module_new(&silu_vt, NULL); }
nb_module *nb_tanh_new(void) { return nb_module_new(&tanh_vt, NULL); }
nb_module *nb_sigmoid_new(void) { return nb_module_new(&sigmoid_vt, NULL); }
