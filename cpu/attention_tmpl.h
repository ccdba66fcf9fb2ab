/* cpu/attention_tmpl.h - private: the bodies of the attention kernels, written once for a
 * compute type. cpu/attention.c includes this file twice, with R = float, S = f32 and
 * R = double, S = f64 (and GEMM, EXP, LOG set to match). Not included anywhere else. */
#define NB__CAT_(a, b) a##_##b
#define NB__CAT(a, b) NB__CAT_(a, b)
#define F(name) NB__CAT(name, S)

/* One row of scores row[0..n) where only [0, cnt) is visible: softmax in place (scaled by
 * the dropout mask and factor when keep is given), zeros in [cnt, n); returns the
 * log-sum-exp. */
static inline R F(softmax_row)(R *row, int64_t cnt, int64_t n, const uint8_t *keep, R dscale) {
    R mx = -(R)INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t s = 0; s < cnt; s++) mx = row[s] > mx ? row[s] : mx;
    R sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t s = 0; s < cnt; s++) {
        R e = EXP(row[s] - mx);
        row[s] = e;
        sum += e;
    }
    R inv = 1 / sum;
    if (keep) {
        R f = inv * dscale;
        for (int64_t s = 0; s < cnt; s++) row[s] = keep[s] ? row[s] * f : 0;
    } else {
#pragma omp simd
        for (int64_t s = 0; s < cnt; s++) row[s] *= inv;
    }
    for (int64_t s = cnt; s < n; s++) row[s] = 0;
    return mx + LOG(sum);
}

/* Forward of slice bh given as (T, D) matrices with row strides ld*, ls its T statistics;
 * Sm is BLOCK x T scratch. */
static nb_status F(fwd_core)(const nb__attn_geom *g, int64_t bh, const R *qs, int64_t ldq,
                             const R *ks, int64_t ldk, const R *vs, int64_t ldv, R *os,
                             int64_t ldo, R *ls, R *Sm, uint8_t *keep) {
    const int64_t Tn = g->T, D = g->D;
    const bool drop = g->p > 0;
    const R dscale = g->p < 1 ? (R)(1.0 / (1.0 - g->p)) : 0;
    for (int64_t i0 = 0; i0 < Tn; i0 += NB__ATTN_BLOCK) {
        const int64_t i1 = i0 + NB__ATTN_BLOCK < Tn ? i0 + NB__ATTN_BLOCK : Tn;
        const int64_t m = i1 - i0, n = i1;
        /* scores of rows [i0, i1) against the keys [0, i1) they may see */
        nb_status st = GEMM(false, true, m, n, D, (R)g->scale, qs + i0 * ldq, ldq, ks, ldk, 0,
                            Sm, Tn);
        if (st != NB_OK) return st;
        for (int64_t r = 0; r < m; r++) {
            const int64_t t = i0 + r;
            if (drop) nb__attn_keep_row(g, (bh * Tn + t) * Tn, t + 1, keep);
            ls[t] = F(softmax_row)(Sm + r * Tn, t + 1, n, drop ? keep : NULL, dscale);
        }
        st = GEMM(false, false, m, D, n, 1, Sm, Tn, vs, ldv, 0, os + i0 * ldo, ldo);
        if (st != NB_OK) return st;
    }
    return NB_OK;
}

/* Forward of one (b, h) slice of the operands as the geometry lays them out. */
static nb_status F(fwd_slice)(const nb__attn_geom *g, int64_t bh, const R *q, const R *k,
                              const R *v, R *o, R *lse, R *Sm, uint8_t *keep) {
    const int64_t H = g->H, b = bh / H, h = bh % H, hk = nb__attn_kv_head(g, h);
    return F(fwd_core)(g, bh, q + b * g->sq[0] + h * g->sq[1], g->sq[2],
                       k + b * g->sk[0] + hk * g->sk[1], g->sk[2],
                       v + b * g->sv[0] + hk * g->sv[1], g->sv[2],
                       o + b * g->so[0] + h * g->so[1], g->so[2], lse + bh * g->T, Sm, keep);
}

/* The row work of one backward block (rows [i0, i0 + m) against keys [0, n)): P, holding
 * the scaled scores, becomes the weights the forward applied to v; dP, holding dO v^T (when
 * want_s), becomes dS = P (dP - rowsum(P dP)) scale. Shared by the bf16 kernels. */
static void F(bwd_rows)(const nb__attn_geom *g, int64_t bh, int64_t i0, int64_t m, int64_t n,
                        const R *ls, R *P, R *dP, bool want_s, uint8_t *keep) {
    const int64_t Tn = g->T;
    const bool drop = g->p > 0;
    const R dscale = g->p < 1 ? (R)(1.0 / (1.0 - g->p)) : 0, scale = (R)g->scale;
    for (int64_t r = 0; r < m; r++) {
        const int64_t t = i0 + r, cnt = t + 1;
        R *pr = P + r * Tn, *dpr = dP + r * Tn;
        const R l = ls[t];
#pragma omp simd
        for (int64_t s = 0; s < cnt; s++) pr[s] = EXP(pr[s] - l);
        for (int64_t s = cnt; s < n; s++) pr[s] = 0;
        if (drop) nb__attn_keep_row(g, (bh * Tn + t) * Tn, cnt, keep);
        if (want_s) {
            /* dS = P (dP - sum_s P dP) scale, with dP = mask * dscale * (dO v^T) and
             * the row sum taken over the dropped-and-scaled weights. */
            R dsum = 0;
            if (drop) {
                for (int64_t s = 0; s < cnt; s++)
                    dsum += keep[s] ? pr[s] * dpr[s] : 0;
                dsum *= dscale;
                for (int64_t s = 0; s < cnt; s++)
                    dpr[s] = pr[s] * ((keep[s] ? dpr[s] * dscale : 0) - dsum) * scale;
            } else {
#pragma omp simd reduction(+ : dsum)
                for (int64_t s = 0; s < cnt; s++) dsum += pr[s] * dpr[s];
#pragma omp simd
                for (int64_t s = 0; s < cnt; s++) dpr[s] = pr[s] * (dpr[s] - dsum) * scale;
            }
            for (int64_t s = cnt; s < n; s++) dpr[s] = 0;
        }
        /* P becomes the weights the forward applied to v (for dv) */
        if (drop)
            for (int64_t s = 0; s < cnt; s++) pr[s] = keep[s] ? pr[s] * dscale : 0;
    }
}

/* Backward of slice bh given as (T, D) matrices (row strides in ld[]: q, k, v, do, dq, dk,
 * dv); P and dP are BLOCK x T scratch. Row blocks run last to first so the first one (which
 * sees every key) initializes dk and dv with beta = 0, unless acc: then dk and dv already hold
 * another query head's share (grouped-query attention) and every block adds to them. */
static nb_status F(bwd_core)(const nb__attn_geom *g, int64_t bh, const R *qs, const R *ks,
                             const R *vs, const R *ls, const R *dos, R *dqs, R *dks, R *dvs,
                             const int64_t ld[7], R *P, R *dP, uint8_t *keep, bool acc) {
    const int64_t Tn = g->T, D = g->D;
    const int64_t ldq = ld[0], ldk = ld[1], ldv = ld[2], lddo = ld[3];
    const int64_t lddq = ld[4], lddk = ld[5], lddv = ld[6];
    const bool want_dq = dqs != NULL, want_dk = dks != NULL;
    const bool want_s = want_dq || want_dk;
    const R scale = (R)g->scale;
    const int64_t nblk = (Tn + NB__ATTN_BLOCK - 1) / NB__ATTN_BLOCK;
    nb_status st = NB_OK;
    for (int64_t ib = nblk - 1; ib >= 0 && st == NB_OK; ib--) {
        const int64_t i0 = ib * NB__ATTN_BLOCK;
        const int64_t i1 = i0 + NB__ATTN_BLOCK < Tn ? i0 + NB__ATTN_BLOCK : Tn;
        const int64_t m = i1 - i0, n = i1;
        const R beta = ib == nblk - 1 && !acc ? 0 : 1;
        st = GEMM(false, true, m, n, D, scale, qs + i0 * ldq, ldq, ks, ldk, 0, P, Tn);
        if (st == NB_OK && want_s)
            st = GEMM(false, true, m, n, D, 1, dos + i0 * lddo, lddo, vs, ldv, 0, dP, Tn);
        if (st != NB_OK) break;
        F(bwd_rows)(g, bh, i0, m, n, ls, P, dP, want_s, keep);
        if (dvs)
            st = GEMM(true, false, n, D, m, 1, P, Tn, dos + i0 * lddo, lddo, beta, dvs, lddv);
        if (st == NB_OK && dqs)
            st = GEMM(false, false, m, D, n, 1, dP, Tn, ks, ldk, 0, dqs + i0 * lddq, lddq);
        if (st == NB_OK && dks)
            st = GEMM(true, false, n, D, m, 1, dP, Tn, qs + i0 * ldq, ldq, beta, dks, lddk);
    }
    return st;
}

/* Backward of one (b, h) slice of the operands as the geometry lays them out (acc: its dk
 * and dv add to what another query head of the same key/value head wrote). */
static nb_status F(bwd_slice)(const nb__attn_geom *g, int64_t bh, const R *q, const R *k,
                              const R *v, const R *lse, const R *dout, R *dq, R *dk, R *dv,
                              R *P, R *dP, uint8_t *keep, bool acc) {
    const int64_t H = g->H, b = bh / H, h = bh % H, hk = nb__attn_kv_head(g, h);
    const int64_t ld[7] = {g->sq[2], g->sk[2], g->sv[2], g->sdo[2], g->sdq[2], g->sdk[2],
                           g->sdv[2]};
    return F(bwd_core)(g, bh, q + b * g->sq[0] + h * g->sq[1], k + b * g->sk[0] + hk * g->sk[1],
                       v + b * g->sv[0] + hk * g->sv[1], lse + bh * g->T,
                       dout + b * g->sdo[0] + h * g->sdo[1],
                       dq ? dq + b * g->sdq[0] + h * g->sdq[1] : NULL,
                       dk ? dk + b * g->sdk[0] + hk * g->sdk[1] : NULL,
                       dv ? dv + b * g->sdv[0] + hk * g->sdv[1] : NULL, ld, P, dP, keep, acc);
}

/* The slices run as tasks on nabla's workers (cpu/workers.c); each thread has its own
 * scratch, picked by its task slot. */
typedef struct F(attn_job) {
    const nb__attn_geom *g;
    const R *q, *k, *v, *lse, *dout;
    R *o, *lse_out, *dq, *dk, *dv;
    char *buf;
    size_t per, mat;
    atomic_int status; /* the first failure, NB_OK if none */
} F(attn_job);

static void F(fwd_task)(int64_t bh, void *p) {
    F(attn_job) *j = p;
    char *mine = j->buf + j->per * (size_t)nb__task_slot();
    R *Sm = (R *)mine;
    uint8_t *keep = (uint8_t *)(mine + j->mat);
    nb_status s = F(fwd_slice)(j->g, bh, j->q, j->k, j->v, j->o, j->lse_out, Sm, keep);
    if (s != NB_OK) {
        int ok = NB_OK;
        atomic_compare_exchange_strong(&j->status, &ok, (int)s);
    }
}

/* Task bkv: the query heads of key/value slice bkv = (b, hk), in order (one head each
 * without grouping), so the heads sharing dk and dv add to them on one thread. */
static void F(bwd_task)(int64_t bkv, void *p) {
    F(attn_job) *j = p;
    char *mine = j->buf + j->per * (size_t)nb__task_slot();
    R *P = (R *)mine, *dP = (R *)(mine + j->mat);
    uint8_t *keep = (uint8_t *)(mine + 2 * j->mat);
    const int64_t rep = nb__attn_group(j->g), hkv = j->g->H / rep;
    const int64_t bh0 = (bkv / hkv) * j->g->H + (bkv % hkv) * rep;
    nb_status s = NB_OK;
    for (int64_t r = 0; r < rep && s == NB_OK; r++)
        s = F(bwd_slice)(j->g, bh0 + r, j->q, j->k, j->v, j->lse, j->dout, j->dq, j->dk, j->dv,
                         P, dP, keep, r > 0);
    if (s != NB_OK) {
        int ok = NB_OK;
        atomic_compare_exchange_strong(&j->status, &ok, (int)s);
    }
}

nb_status F(nb__cpu_attention_fwd)(const nb__attn_geom *g, const R *q, const R *k, const R *v,
                                   R *o, R *lse) {
    const int64_t BH = g->B * g->H;
    if (BH == 0 || g->T == 0) return NB_OK;
    int nt = nb__attn_threads(g);
    const size_t mat = nb__attn_round64(NB__ATTN_BLOCK * g->T * sizeof(R));
    const size_t per = mat + nb__attn_round64((size_t)g->T);
    char *buf = nb_host_alloc(per * (size_t)nt);
    if (!buf) return nb__error(NB_ENOMEM, "causal_attention: out of memory for scratch");
    F(attn_job) j = {.g = g, .q = q, .k = k, .v = v, .o = o, .lse_out = lse, .buf = buf,
                     .per = per, .mat = mat, .status = NB_OK};
    nb__run_tasks(BH, nt, F(fwd_task), &j);
    nb_host_free(buf);
    nb_status st = (nb_status)atomic_load(&j.status);
    return st == NB_OK ? NB_OK : nb__error(st, "causal_attention: a GEMM failed (%s)",
                                           nb_status_name(st));
}

nb_status F(nb__cpu_attention_bwd)(const nb__attn_geom *g, const R *q, const R *k, const R *v,
                                   const R *lse, const R *dout, R *dq, R *dk, R *dv) {
    const int64_t BH = g->B * g->H;
    if (BH == 0 || g->T == 0) return NB_OK;
    int nt = nb__attn_threads(g);
    const size_t mat = nb__attn_round64(NB__ATTN_BLOCK * g->T * sizeof(R));
    const size_t per = 2 * mat + nb__attn_round64((size_t)g->T);
    char *buf = nb_host_alloc(per * (size_t)nt);
    if (!buf) return nb__error(NB_ENOMEM, "causal_attention: out of memory for scratch");
    F(attn_job) j = {.g = g, .q = q, .k = k, .v = v, .lse = lse, .dout = dout, .dq = dq,
                     .dk = dk, .dv = dv, .buf = buf, .per = per, .mat = mat, .status = NB_OK};
    nb__run_tasks(BH / nb__attn_group(g), nt, F(bwd_task), &j);
    nb_host_free(buf);
    nb_status st = (nb_status)atomic_load(&j.status);
    return st == NB_OK ? NB_OK : nb__error(st, "causal_attention: a GEMM failed (%s)",
                                           nb_status_name(st));
}
