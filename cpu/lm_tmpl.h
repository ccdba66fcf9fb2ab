/* cpu/lm_tmpl.h - private: the bodies of the language-model kernels (RMSNorm, rotary,
 * SwiGLU), written once for a compute type. cpu/lm.c includes this file twice, with T = float,
 * S = f32 and T = double, S = f64, after defining for each the row sums F(sumsq) and
 * F(sumgwx) (vectorized for f32) and the exponential EXP. Not included anywhere else. */
#define NB__CAT_(a, b) a##_##b
#define NB__CAT(a, b) NB__CAT_(a, b)
#define F(name) NB__CAT(name, S)

/* ---- RMSNorm ------------------------------------------------------------------------------- */
typedef struct F(rms_job) {
    const T *x, *w, *g;
    T *y, *dx;
    double *rstd_out, *part;
    const double *rstd;
    int64_t N, D, nch;
    double eps;
} F(rms_job);

static void F(rms_fwd_rows)(int64_t lo, int64_t hi, void *p) {
    const F(rms_job) *jb = p;
    const int64_t D = jb->D;
    const T *w = jb->w;
    for (int64_t i = lo; i < hi; i++) {
        const T *xr = jb->x + i * D;
        T *yr = jb->y + i * D;
        const double ms = D ? F(sumsq)(xr, D) / (double)D : 0.0;
        const double r = 1.0 / sqrt(ms + jb->eps);
        jb->rstd_out[i] = r;
        const T rt = (T)r;
        if (w) {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] * rt) * w[j];
        } else {
#pragma omp simd
            for (int64_t j = 0; j < D; j++) yr[j] = xr[j] * rt;
        }
    }
}

void F(nb__cpu_rms_norm_fwd)(const T *x, const T *w, T *y, double *rstd, int64_t N, int64_t D,
                             double eps) {
    F(rms_job) jb = {.x = x, .w = w, .y = y, .rstd_out = rstd, .N = N, .D = D, .eps = eps};
    nb__parallel_range(N, nb__threads_for(N * D, NB__GRAIN), F(rms_fwd_rows), &jb);
}

/* Chunk ch of the rows: dx of its rows, and (part) its partial sums of g * (x * r). */
static void F(rms_bwd_chunks)(int64_t lo, int64_t hi, void *p) {
    const F(rms_job) *jb = p;
    const T *g = jb->g, *x = jb->x, *w = jb->w;
    const int64_t N = jb->N, D = jb->D, nch = jb->nch;
    for (int64_t ch = lo; ch < hi; ch++) {
        const int64_t r0 = N * ch / nch, r1 = N * (ch + 1) / nch;
        double *pw = jb->part ? jb->part + D * ch : NULL;
        if (pw) memset(pw, 0, sizeof(double) * (size_t)D);
        for (int64_t i = r0; i < r1; i++) {
            const T *gr = g + i * D, *xr = x + i * D;
            const double r = jb->rstd[i];
            const T rt = (T)r;
            if (jb->dx) {
                T *dr = jb->dx + i * D;
                const double s = D ? F(sumgwx)(gr, w, xr, D) : 0.0;
                const T c = (T)(r * r * (s / (double)D));
                if (w) {
#pragma omp simd
                    for (int64_t j = 0; j < D; j++) dr[j] = rt * (gr[j] * w[j] - xr[j] * c);
                } else {
#pragma omp simd
                    for (int64_t j = 0; j < D; j++) dr[j] = rt * (gr[j] - xr[j] * c);
                }
            }
            if (pw) {
#pragma omp simd
                for (int64_t j = 0; j < D; j++) pw[j] += (double)(gr[j] * (xr[j] * rt));
            }
        }
    }
}

nb_status F(nb__cpu_rms_norm_bwd)(const T *g, const T *x, const T *w, const double *rstd, T *dx,
                                  T *dw, int64_t N, int64_t D) {
    const int64_t nch = lm_chunks(N, D);
    double *part = NULL;
    if (dw && D > 0) {
        part = nb_host_alloc(sizeof(double) * (size_t)D * (size_t)nch);
        if (!part) return nb__error(NB_ENOMEM, "rms_norm: out of memory for the backward");
    }
    F(rms_job) jb = {.g = g, .x = x, .w = w, .dx = dx, .rstd = rstd, .part = part, .N = N,
                     .D = D, .nch = nch};
    if (dx || part) nb__parallel_range(nch, lm_chunk_threads(N * D, nch), F(rms_bwd_chunks), &jb);
    if (dw) {
        for (int64_t j = 0; j < D; j++) {
            double sw = 0;
            for (int64_t ch = 0; ch < nch && part; ch++) sw += part[D * ch + j];
            dw[j] = (T)sw;
        }
    }
    nb_host_free(part);
    return NB_OK;
}

/* ---- rotary ---------------------------------------------------------------------------------- */
typedef struct F(rot_job) {
    const T *x;
    T *y;
    T *cs; /* (T, D/2) cos, then (T, D/2) sin, then the D/2 inverse frequencies */
    int64_t T_, H, D, offset;
    double base;
    bool inverse;
} F(rot_job);

/* cos and sin of positions offset + t, t in [lo, hi). */
static void F(rot_table)(int64_t lo, int64_t hi, void *p) {
    const F(rot_job) *jb = p;
    const int64_t h2 = jb->D / 2;
    T *cs = jb->cs, *sn = jb->cs + jb->T_ * h2;
    const T *inv = jb->cs + 2 * jb->T_ * h2;
    for (int64_t t = lo; t < hi; t++)
        for (int64_t i = 0; i < h2; i++) {
            const T ang = (T)(jb->offset + t) * inv[i];
            cs[t * h2 + i] = (T)cos((double)ang);
            sn[t * h2 + i] = (T)sin((double)ang);
        }
}

/* rows (n, t) in [lo, hi) of the (N T, H, D) input */
static void F(rot_rows)(int64_t lo, int64_t hi, void *p) {
    const F(rot_job) *jb = p;
    const int64_t H = jb->H, D = jb->D, h2 = D / 2, TT = jb->T_;
    for (int64_t row = lo; row < hi; row++) {
        const int64_t t = row % TT;
        const T *c = jb->cs + t * h2, *s = jb->cs + TT * h2 + t * h2;
        for (int64_t h = 0; h < H; h++) {
            const T *x1 = jb->x + (row * H + h) * D, *x2 = x1 + h2;
            T *y1 = jb->y + (row * H + h) * D, *y2 = y1 + h2;
            if (jb->inverse) {
#pragma omp simd
                for (int64_t i = 0; i < h2; i++) {
                    const T a = x1[i], b = x2[i];
                    y1[i] = a * c[i] + b * s[i];
                    y2[i] = b * c[i] - a * s[i];
                }
            } else {
#pragma omp simd
                for (int64_t i = 0; i < h2; i++) {
                    const T a = x1[i], b = x2[i];
                    y1[i] = a * c[i] - b * s[i];
                    y2[i] = b * c[i] + a * s[i];
                }
            }
        }
    }
}

nb_status F(nb__cpu_rotary)(const T *x, T *y, int64_t N, int64_t TT, int64_t H, int64_t D,
                            int64_t offset, double base, bool inverse) {
    const int64_t h2 = D / 2, rows = N * TT;
    if (rows == 0 || H == 0 || h2 == 0) return NB_OK;
    T *cs = nb_host_alloc(sizeof(T) * (size_t)((2 * TT + 1) * h2));
    if (!cs) return nb__error(NB_ENOMEM, "rotary: out of memory for the cos/sin table");
    for (int64_t i = 0; i < h2; i++) cs[2 * TT * h2 + i] = F(rot_inv_freq)(i, D, base);
    F(rot_job) jb = {.x = x, .y = y, .cs = cs, .T_ = TT, .H = H, .D = D, .offset = offset,
                     .base = base, .inverse = inverse};
    /* a sine and a cosine cost about 40 multiply-adds */
    nb__parallel_range(TT, nb__threads_for(TT * h2 * 40, NB__GRAIN), F(rot_table), &jb);
    nb__parallel_range(rows, nb__threads_for(rows * H * D, NB__GRAIN), F(rot_rows), &jb);
    nb_host_free(cs);
    return NB_OK;
}

/* ---- SwiGLU ---------------------------------------------------------------------------------- */
typedef struct F(glu_job) {
    const T *a, *b, *g;
    T *y, *da, *db;
} F(glu_job);

static void F(glu_fwd)(int64_t lo, int64_t hi, void *p) {
    const F(glu_job) *jb = p;
    const T *a = jb->a, *b = jb->b;
    T *y = jb->y;
#pragma omp simd
    for (int64_t i = lo; i < hi; i++) y[i] = a[i] / ((T)1 + EXP(-a[i])) * b[i];
}

static void F(glu_bwd)(int64_t lo, int64_t hi, void *p) {
    const F(glu_job) *jb = p;
    const T *a = jb->a, *b = jb->b, *g = jb->g;
    T *da = jb->da, *db = jb->db;
    if (da && db) {
#pragma omp simd
        for (int64_t i = lo; i < hi; i++) {
            const T x = a[i], e = (T)1 + EXP(-x), s = (T)1 / e;
            da[i] = g[i] * b[i] * (s * ((T)1 + x * ((T)1 - s)));
            db[i] = g[i] * (x / e);
        }
    } else if (da) {
#pragma omp simd
        for (int64_t i = lo; i < hi; i++) {
            const T x = a[i], s = (T)1 / ((T)1 + EXP(-x));
            da[i] = g[i] * b[i] * (s * ((T)1 + x * ((T)1 - s)));
        }
    } else if (db) {
#pragma omp simd
        for (int64_t i = lo; i < hi; i++) db[i] = g[i] * (a[i] / ((T)1 + EXP(-a[i])));
    }
}

void F(nb__cpu_swiglu)(const T *a, const T *b, T *y, int64_t n) {
    F(glu_job) jb = {.a = a, .b = b, .y = y};
    nb__parallel_range(n, nb__threads_for(n, NB__GRAIN), F(glu_fwd), &jb);
}

void F(nb__cpu_swiglu_bwd)(const T *g, const T *a, const T *b, T *da, T *db, int64_t n) {
    F(glu_job) jb = {.a = a, .b = b, .g = g, .da = da, .db = db};
    nb__parallel_range(n, nb__threads_for(n, NB__GRAIN), F(glu_bwd), &jb);
}

#undef F
#undef NB__CAT
#undef NB__CAT_
