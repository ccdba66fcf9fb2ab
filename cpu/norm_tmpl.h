/* cpu/norm_tmpl.h - private: the bodies of the norm kernels, written once for a compute type.
 * cpu/norm.c includes this file twice, with T = float, S = f32 and T = double, S = f64
 * (C has no templates; this keeps the two versions from drifting apart). Not a public
 * header and not included anywhere else. */
#define NB__CAT_(a, b) a##_##b
#define NB__CAT(a, b) NB__CAT_(a, b)
#define F(name) NB__CAT(name, S)

/* Sums in double with 8 independent lanes: a fixed order (so deterministic) that the
 * compiler can still vectorize, since no lane's additions are reordered. GCC leaves the f32
 * versions scalar, so they are written out: with AVX-512 lane k of one 8-double register is
 * a[k]; with AVX2 lanes 0-3 are one 4-double register and lanes 4-7 another. Each element's
 * f32 arithmetic is the same operations in the same order (no FMA), so the results are the
 * same bits on every path. */
#define LANES 8
#define LANE_SUM(a) (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])))
#if defined(NB__NORM_F32) && defined(__AVX512F__)
#define NB__NORM_VEC 1
#elif defined(NB__NORM_F32) && defined(__AVX2__)
#define NB__NORM_VEC2 1
/* the 8 floats of v widened to double, into two 4-lane sums */
#define NB__ACC8(lo, hi, v)                                                                  \
    do {                                                                                     \
        __m256 v_ = (v);                                                                     \
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(v_)));                 \
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(v_, 1)));               \
    } while (0)
#endif

static inline double F(rsum)(const T *x, int64_t n) {
    double a[LANES] = {0}, t = 0;
    int64_t j = 0;
#ifdef NB__NORM_VEC
    __m512d va = _mm512_setzero_pd();
    for (; j + LANES <= n; j += LANES) va = _mm512_add_pd(va, _mm512_cvtps_pd(_mm256_loadu_ps(x + j)));
    _mm512_storeu_pd(a, va);
#elif defined(NB__NORM_VEC2)
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    for (; j + LANES <= n; j += LANES) NB__ACC8(lo, hi, _mm256_loadu_ps(x + j));
    _mm256_storeu_pd(a, lo);
    _mm256_storeu_pd(a + 4, hi);
#endif
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) a[k] += (double)x[j + k];
    for (; j < n; j++) t += (double)x[j];
    return LANE_SUM(a) + t;
}

/* sum (x - m)^2 */
static inline double F(rdev2)(const T *x, int64_t n, double m) {
    double a[LANES] = {0}, t = 0;
    int64_t j = 0;
#ifdef NB__NORM_VEC
    __m512d va = _mm512_setzero_pd(), vm = _mm512_set1_pd(m);
    for (; j + LANES <= n; j += LANES) {
        __m512d d = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + j)), vm);
        va = _mm512_add_pd(va, _mm512_mul_pd(d, d));
    }
    _mm512_storeu_pd(a, va);
#elif defined(NB__NORM_VEC2)
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd(), vm = _mm256_set1_pd(m);
    for (; j + LANES <= n; j += LANES) {
        __m256 v = _mm256_loadu_ps(x + j);
        __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), vm);
        __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), vm);
        lo = _mm256_add_pd(lo, _mm256_mul_pd(d0, d0));
        hi = _mm256_add_pd(hi, _mm256_mul_pd(d1, d1));
    }
    _mm256_storeu_pd(a, lo);
    _mm256_storeu_pd(a + 4, hi);
#endif
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) {
            double d = (double)x[j + k] - m;
            a[k] += d * d;
        }
    for (; j < n; j++) {
        double d = (double)x[j] - m;
        t += d * d;
    }
    return LANE_SUM(a) + t;
}

/* sum g * (x - m) */
static inline double F(rgdev)(const T *g, const T *x, int64_t n, double m) {
    double a[LANES] = {0}, t = 0;
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) a[k] += (double)g[j + k] * ((double)x[j + k] - m);
    for (; j < n; j++) t += (double)g[j] * ((double)x[j] - m);
    return LANE_SUM(a) + t;
}

/* Layer-norm row sums: *s1 = sum gw, *s2 = sum gw * xhat, gw = g * w (g if w is NULL). */
static inline void F(ln_row_sums)(const T *g, const T *x, const T *w, T m, T r, int64_t n,
                                  double *s1, double *s2) {
    double a[LANES] = {0}, c[LANES] = {0}, ta = 0, tc = 0;
    int64_t j = 0;
#ifdef NB__NORM_VEC
    __m512d va = _mm512_setzero_pd(), vc = _mm512_setzero_pd();
    const __m256 vm = _mm256_set1_ps(m), vr = _mm256_set1_ps(r);
    for (; j + LANES <= n; j += LANES) {
        __m256 gw = _mm256_loadu_ps(g + j);
        if (w) gw = _mm256_mul_ps(gw, _mm256_loadu_ps(w + j));
        __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm), vr);
        va = _mm512_add_pd(va, _mm512_cvtps_pd(gw));
        vc = _mm512_add_pd(vc, _mm512_cvtps_pd(_mm256_mul_ps(gw, xh)));
    }
    _mm512_storeu_pd(a, va);
    _mm512_storeu_pd(c, vc);
#elif defined(NB__NORM_VEC2)
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    __m256d c0 = _mm256_setzero_pd(), c1 = _mm256_setzero_pd();
    const __m256 vm = _mm256_set1_ps(m), vr = _mm256_set1_ps(r);
    for (; j + LANES <= n; j += LANES) {
        __m256 gw = _mm256_loadu_ps(g + j);
        if (w) gw = _mm256_mul_ps(gw, _mm256_loadu_ps(w + j));
        __m256 xh = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + j), vm), vr);
        NB__ACC8(a0, a1, gw);
        NB__ACC8(c0, c1, _mm256_mul_ps(gw, xh));
    }
    _mm256_storeu_pd(a, a0);
    _mm256_storeu_pd(a + 4, a1);
    _mm256_storeu_pd(c, c0);
    _mm256_storeu_pd(c + 4, c1);
#endif
    for (; j + LANES <= n; j += LANES)
        for (int k = 0; k < LANES; k++) {
            T gw = w ? g[j + k] * w[j + k] : g[j + k];
            T xh = (x[j + k] - m) * r;
            a[k] += (double)gw;
            c[k] += (double)(gw * xh);
        }
    for (; j < n; j++) {
        T gw = w ? g[j] * w[j] : g[j];
        T xh = (x[j] - m) * r;
        ta += (double)gw;
        tc += (double)(gw * xh);
    }
    *s1 = LANE_SUM(a) + ta;
    *s2 = LANE_SUM(c) + tc;
}

/* ---- layer norm ------------------------------------------------------------------------------ */
/* The loops run on nabla's workers (nb__parallel_range): each takes its arguments in a job. */
typedef struct F(ln_job) {
    const T *x, *w, *b, *g;
    T *y, *dx;
    const double *mean, *rstd;
    double *mean_out, *rstd_out, *part;
    int64_t N, D, nch;
    double eps;
} F(ln_job);

static void F(ln_fwd_rows)(int64_t lo, int64_t hi, void *p) {
    const F(ln_job) *jb = p;
    const T *x = jb->x, *w = jb->w, *b = jb->b;
    T *y = jb->y;
    double *mean = jb->mean_out, *rstd = jb->rstd_out, eps = jb->eps;
    const int64_t D = jb->D;
    for (int64_t i = lo; i < hi; i++) {
        const T *xr = x + i * D;
        T *yr = y + i * D;
        double m = D ? F(rsum)(xr, D) / (double)D : 0.0;
        double v = D ? F(rdev2)(xr, D, m) / (double)D : 0.0;
        double rs = 1.0 / sqrt(v + eps);
        mean[i] = m;
        rstd[i] = rs;
        T mt = (T)m, rt = (T)rs;
        if (w && b) {
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mt) * rt * w[j] + b[j];
        } else if (w) {
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mt) * rt * w[j];
        } else if (b) {
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mt) * rt + b[j];
        } else {
            for (int64_t j = 0; j < D; j++) yr[j] = (xr[j] - mt) * rt;
        }
    }
}

void F(nb__cpu_layer_norm_fwd)(const T *x, const T *w, const T *b, T *y, double *mean,
                               double *rstd, int64_t N, int64_t D, double eps) {
    F(ln_job) jb = {.x = x, .w = w, .b = b, .y = y, .mean_out = mean, .rstd_out = rstd,
                    .N = N, .D = D, .eps = eps};
    nb__parallel_range(N, nb__threads_for(N * D, NB__GRAIN), F(ln_fwd_rows), &jb);
}

static void F(ln_bwd_chunks)(int64_t lo, int64_t hi, void *p) {
    const F(ln_job) *jb = p;
    const T *g = jb->g, *x = jb->x, *w = jb->w;
    const double *mean = jb->mean, *rstd = jb->rstd;
    double *part = jb->part;
    T *dx = jb->dx;
    const int64_t N = jb->N, D = jb->D, nch = jb->nch;
    for (int64_t ch = lo; ch < hi; ch++) {
        int64_t r0 = N * ch / nch, r1 = N * (ch + 1) / nch;
        double *pw = part ? part + 2 * D * ch : NULL, *pb = pw ? pw + D : NULL;
        if (pw) memset(pw, 0, sizeof(double) * 2 * (size_t)D);
        for (int64_t i = r0; i < r1; i++) {
            const T *gr = g + i * D, *xr = x + i * D;
            T m = (T)mean[i], r = (T)rstd[i];
            if (dx) {
                double s1, s2;
                F(ln_row_sums)(gr, xr, w, m, r, D, &s1, &s2);
                T c1 = (T)(s1 / (double)D), c2 = (T)(s2 / (double)D);
                T *dr = dx + i * D;
                if (w) {
                    for (int64_t j = 0; j < D; j++)
                        dr[j] = r * (gr[j] * w[j] - c1 - (xr[j] - m) * r * c2);
                } else {
                    for (int64_t j = 0; j < D; j++)
                        dr[j] = r * (gr[j] - c1 - (xr[j] - m) * r * c2);
                }
            }
            if (pw) {
                for (int64_t j = 0; j < D; j++) {
                    pw[j] += (double)(gr[j] * ((xr[j] - m) * r));
                    pb[j] += (double)gr[j];
                }
            }
        }
    }
}

nb_status F(nb__cpu_layer_norm_bwd)(const T *g, const T *x, const T *w, const double *mean,
                                    const double *rstd, T *dx, T *dw, T *db, int64_t N,
                                    int64_t D) {
    bool params = dw || db;
    int64_t nch = norm_chunks(N, D);
    double *part = NULL;
    if (params && D > 0) {
        part = nb_host_alloc(sizeof(double) * 2 * (size_t)D * (size_t)nch);
        if (!part) return nb__error(NB_ENOMEM, "layer_norm: out of memory for the backward");
    }
    F(ln_job) jb = {.g = g, .x = x, .w = w, .dx = dx, .mean = mean, .rstd = rstd,
                    .part = part, .N = N, .D = D, .nch = nch};
    nb__parallel_range(nch, chunk_threads(N * D, nch), F(ln_bwd_chunks), &jb);
    if (params) {
        for (int64_t j = 0; j < D; j++) {
            double sw = 0, sb = 0;
            for (int64_t ch = 0; ch < nch; ch++) {
                sw += part[2 * D * ch + j];
                sb += part[2 * D * ch + D + j];
            }
            if (dw) dw[j] = (T)sw;
            if (db) db[j] = (T)sb;
        }
    }
    nb_host_free(part);
    return NB_OK;
}

/* ---- batch norm ------------------------------------------------------------------------------
 * Per-channel sums over (N, S) as chunk partials: part[ch * C + c] for the rows (samples) of
 * chunk ch. kind 0: sum x; 1: sum (x - mean)^2; 2: sum g and sum g * (x - mean) (two
 * arrays: part and part2). */
typedef struct F(bn_job) {
    const T *x, *g, *w, *b;
    T *y;
    const double *mean, *rstd, *sg, *sgd;
    double *part, *part2;
    int64_t N, C, S, nch;
    int kind;
    bool batch_stats;
} F(bn_job);

static void F(bn_partial_chunks)(int64_t lo, int64_t hi, void *job) {
    const F(bn_job) *jb = job;
    const T *x = jb->x, *g = jb->g;
    const double *mean = jb->mean;
    double *part = jb->part, *part2 = jb->part2;
    const int64_t N = jb->N, C = jb->C, S = jb->S, nch = jb->nch;
    const int kind = jb->kind;
    for (int64_t ch = lo; ch < hi; ch++) {
        int64_t n0 = N * ch / nch, n1 = N * (ch + 1) / nch;
        double *p = part + C * ch, *p2 = part2 ? part2 + C * ch : NULL;
        memset(p, 0, sizeof(double) * (size_t)C);
        if (p2) memset(p2, 0, sizeof(double) * (size_t)C);
        for (int64_t n = n0; n < n1; n++) {
            const T *xs = x + n * C * S, *gs = g ? g + n * C * S : NULL;
            if (S == 1) { /* (N, C): a vector over channels */
                if (kind == 0) {
                    for (int64_t c = 0; c < C; c++) p[c] += (double)xs[c];
                } else if (kind == 1) {
                    for (int64_t c = 0; c < C; c++) {
                        double d = (double)xs[c] - mean[c];
                        p[c] += d * d;
                    }
                } else {
                    for (int64_t c = 0; c < C; c++) {
                        p[c] += (double)gs[c];
                        p2[c] += (double)gs[c] * ((double)xs[c] - mean[c]);
                    }
                }
                continue;
            }
            for (int64_t c = 0; c < C; c++) {
                const T *xr = xs + c * S;
                if (kind == 0) {
                    p[c] += F(rsum)(xr, S);
                } else if (kind == 1) {
                    p[c] += F(rdev2)(xr, S, mean[c]);
                } else {
                    p[c] += F(rsum)(gs + c * S, S);
                    p2[c] += F(rgdev)(gs + c * S, xr, S, mean[c]);
                }
            }
        }
    }
}

static void F(bn_partials)(const T *x, const T *g, int64_t N, int64_t C, int64_t S,
                           const double *mean, int kind, int64_t nch, double *part,
                           double *part2) {
    F(bn_job) jb = {.x = x, .g = g, .mean = mean, .part = part, .part2 = part2, .N = N,
                    .C = C, .S = S, .nch = nch, .kind = kind};
    nb__parallel_range(nch, chunk_threads(N * C * S, nch), F(bn_partial_chunks), &jb);
}

/* out[c] = sum over chunks of part[ch * C + c], in chunk order. */
static void F(bn_combine)(const double *part, int64_t nch, int64_t C, double *out) {
    for (int64_t c = 0; c < C; c++) {
        double s = 0;
        for (int64_t ch = 0; ch < nch; ch++) s += part[ch * C + c];
        out[c] = s;
    }
}

nb_status F(nb__cpu_batch_norm_stats)(const T *x, int64_t N, int64_t C, int64_t S,
                                      double *mean, double *var) {
    int64_t nch = norm_chunks(N, C * S), M = N * S;
    double *part = nb_host_alloc(sizeof(double) * (size_t)(C * nch > 0 ? C * nch : 1));
    if (!part) return nb__error(NB_ENOMEM, "batch_norm: out of memory for the statistics");
    F(bn_partials)(x, NULL, N, C, S, NULL, 0, nch, part, NULL);
    F(bn_combine)(part, nch, C, mean);
    for (int64_t c = 0; c < C; c++) mean[c] = M ? mean[c] / (double)M : 0.0;
    F(bn_partials)(x, NULL, N, C, S, mean, 1, nch, part, NULL);
    F(bn_combine)(part, nch, C, var);
    for (int64_t c = 0; c < C; c++) var[c] = M ? var[c] / (double)M : 0.0;
    nb_host_free(part);
    return NB_OK;
}

/* (N, C) input: rows n in [lo, hi); else (n, c) planes r in [lo, hi). */
static void F(bn_apply_rows)(int64_t lo, int64_t hi, void *p) {
    const F(bn_job) *jb = p;
    const T *x = jb->x, *w = jb->w, *b = jb->b;
    T *y = jb->y;
    const double *mean = jb->mean, *rstd = jb->rstd;
    const int64_t C = jb->C, S = jb->S;
    if (S == 1) {
        for (int64_t n = lo; n < hi; n++) {
            const T *xr = x + n * C;
            T *yr = y + n * C;
            for (int64_t c = 0; c < C; c++) {
                T a = (T)rstd[c] * (w ? w[c] : (T)1);
                yr[c] = (xr[c] - (T)mean[c]) * a + (b ? b[c] : (T)0);
            }
        }
        return;
    }
    for (int64_t r = lo; r < hi; r++) {
        int64_t c = r % C;
        const T *xr = x + r * S;
        T *yr = y + r * S;
        T m = (T)mean[c], a = (T)rstd[c] * (w ? w[c] : (T)1), sh = b ? b[c] : (T)0;
        for (int64_t j = 0; j < S; j++) yr[j] = (xr[j] - m) * a + sh;
    }
}

void F(nb__cpu_batch_norm_apply)(const T *x, T *y, int64_t N, int64_t C, int64_t S,
                                 const double *mean, const double *rstd, const T *w,
                                 const T *b) {
    F(bn_job) jb = {.x = x, .w = w, .b = b, .y = y, .mean = mean, .rstd = rstd, .N = N,
                    .C = C, .S = S};
    nb__parallel_range(S == 1 ? N : N * C, nb__threads_for(N * C * S, NB__GRAIN),
                       F(bn_apply_rows), &jb);
}

/* dx of the (n, c) planes r in [lo, hi) (dx is the job's y). */
static void F(bn_bwd_planes)(int64_t lo, int64_t hi, void *p) {
    const F(bn_job) *jb = p;
    const T *g = jb->g, *x = jb->x, *w = jb->w;
    T *dx = jb->y;
    const double *mean = jb->mean, *rstd = jb->rstd, *sg = jb->sg, *sgd = jb->sgd;
    const int64_t C = jb->C, S = jb->S, M = jb->N * jb->S;
    const bool batch_stats = jb->batch_stats;
    for (int64_t r = lo; r < hi; r++) {
        int64_t c = r % C;
        double ad = rstd[c] * (w ? (double)w[c] : 1.0);
        T a = (T)ad, k = 0, q = 0, m = (T)mean[c];
        if (batch_stats && M > 0) {
            k = (T)(ad * sg[c] / (double)M);
            q = (T)(ad * rstd[c] * rstd[c] * sgd[c] / (double)M);
        }
        const T *gr = g + r * S, *xr = x + r * S;
        T *dr = dx + r * S;
        if (batch_stats) {
            for (int64_t j = 0; j < S; j++) dr[j] = a * gr[j] - k - (xr[j] - m) * q;
        } else {
            for (int64_t j = 0; j < S; j++) dr[j] = a * gr[j];
        }
    }
}

nb_status F(nb__cpu_batch_norm_bwd)(const T *g, const T *x, int64_t N, int64_t C, int64_t S,
                                    const double *mean, const double *rstd, const T *w,
                                    bool batch_stats, T *dx, T *dw, T *db) {
    bool need_sums = dw || db || (dx && batch_stats);
    double *sg = NULL, *sgd = NULL;
    if (need_sums) {
        int64_t nch = norm_chunks(N, C * S);
        size_t nel = (size_t)(C * nch > 0 ? C * nch : 1);
        double *part = nb_host_alloc(sizeof(double) * 2 * nel);
        double *sums = part ? nb_host_alloc(sizeof(double) * 2 * (size_t)(C > 0 ? C : 1)) : NULL;
        if (!sums) {
            nb_host_free(part);
            return nb__error(NB_ENOMEM, "batch_norm: out of memory for the backward");
        }
        F(bn_partials)(x, g, N, C, S, mean, 2, nch, part, part + nel);
        sg = sums, sgd = sums + C;
        F(bn_combine)(part, nch, C, sg);
        F(bn_combine)(part + nel, nch, C, sgd);
        nb_host_free(part);
        for (int64_t c = 0; c < C; c++) {
            if (dw) dw[c] = (T)(sgd[c] * rstd[c]);
            if (db) db[c] = (T)sg[c];
        }
    }
    if (dx) {
        /* dx = a * g - k - (x - mean) * q per channel, with a = w * rstd and, for batch
         * statistics, k = a * sum(g) / M, q = a * rstd^2 * sum(g * (x - mean)) / M. */
        F(bn_job) jb = {.x = x, .g = g, .w = w, .y = dx, .mean = mean, .rstd = rstd,
                        .sg = sg, .sgd = sgd, .N = N, .C = C, .S = S,
                        .batch_stats = batch_stats};
        nb__parallel_range(N * C, nb__threads_for(N * C * S, NB__GRAIN), F(bn_bwd_planes),
                           &jb);
    }
    nb_host_free(sg);
    return NB_OK;
}

#undef LANE_SUM
#undef LANES
#undef F
#undef NB__CAT
#undef NB__CAT_
#undef NB__NORM_VEC
#undef NB__NORM_VEC2
#undef NB__ACC8
