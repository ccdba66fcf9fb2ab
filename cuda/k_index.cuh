// cuda/k_index.cuh - private: the per-element and per-segment math of the index kernels
// (cuda/k_index.cu; arguments in tensor/kernels/index.h), written once as __host__ __device__
// functions so that tests/cuda_host/index.cu runs the very same code on the host and compares
// it with the CPU backend's kernels (cpu/index.c, the spec). nvcc only (templates); needs no
// CUDA runtime header. UNVERIFIED ON A GPU: only the host side of this math has run.
//
//   gather_geom / gather_src        index_select and gather: where output element i comes
//                                   from in x, and the index value it used
//   scatter_geom / scatter_q        scatter_add: all additions of one position q of index's
//                                   non-dim dims, in increasing index order along dim
//   ia_scan / ia_segment            index_add, deterministic in index order: one output
//                                   element scanning the whole index (small indices), or one
//                                   (target row, column) summing its segment of a stable sort
//   mf_elem, oh_elem, tri_elem      masked_fill, one_hot, tril/triu per output element
//   ix_bad / ix_err_format          what a bad index records (the device error flag of
//                                   k_index.cu) and the CPU kernels' message built from it
#ifndef NABLA_CUDA_K_INDEX_CUH
#define NABLA_CUDA_K_INDEX_CUH

#include <stdint.h>
#include <stdio.h>

#include "cuda/khelp.h"
#include "tensor/kernels.h"

namespace nbix {

// ---- elements ----------------------------------------------------------------------------
template <int ES> struct uint_of;
template <> struct uint_of<1> { using type = uint8_t; };
template <> struct uint_of<2> { using type = uint16_t; };
template <> struct uint_of<4> { using type = uint32_t; };
template <> struct uint_of<8> { using type = uint64_t; };

// One element of ES bytes (typed load and store: device buffers are element-aligned).
template <int ES> NB_HD void copy_elem(char *dst, const char *src) {
    using U = typename uint_of<ES>::type;
    *(U *)dst = *(const U *)src;
}
// The first ES bytes of bits (little-endian on both sides: the low bytes).
template <int ES> NB_HD void store_bits(char *dst, uint64_t bits) {
    using U = typename uint_of<ES>::type;
    *(U *)dst = (U)bits;
}

NB_HD int64_t idx_at(const void *p, bool i64, int64_t i) {
    return i64 ? ((const int64_t *)p)[i] : (int64_t)((const int32_t *)p)[i];
}

// Storage of the half types for index_add's source (distinct types for overloads).
struct bf16s { uint16_t bits; };
struct f16s { uint16_t bits; };
NB_HD float to_f32(float v) { return v; }
NB_HD float to_f32(bf16s v) { return nb__kh_f32_from_bf16(v.bits); }
NB_HD float to_f32(f16s v) { return nb__kh_f32_from_f16(v.bits); }
NB_HD double to_f64(double v) { return v; }
NB_HD double to_f64(float v) { return (double)v; }
NB_HD double to_f64(bf16s v) { return (double)nb__kh_f32_from_bf16(v.bits); }
NB_HD double to_f64(f16s v) { return (double)nb__kh_f32_from_f16(v.bits); }
NB_HD float acc_of(float, float s) { return s; }
template <typename S> NB_HD float acc_of(float, S s) { return to_f32(s); }
template <typename S> NB_HD double acc_of(double, S s) { return to_f64(s); }

// ---- bad indices ---------------------------------------------------------------------------
// What the kernels of one call saw of the out-of-range values: the most negative (neg, 0 if
// none) and 1 + the largest non-negative bad one (pos1, 0 if none). The CPU's message names
// the smallest value when it is negative, else the largest: both are bad values, so these
// two suffice.
struct ix_bad {
    int64_t neg;
    int64_t pos1;
};
NB_HD void ix_bad_note(ix_bad *b, int64_t k) {
    if (k < 0) b->neg = k < b->neg ? k : b->neg;
    else b->pos1 = k + 1 > b->pos1 ? k + 1 : b->pos1;
}
NB_HD bool ix_bad_any(const ix_bad &b) { return b.neg < 0 || b.pos1 > 0; }
NB_HD int64_t ix_bad_value(const ix_bad &b) { return b.neg < 0 ? b.neg : b.pos1 - 1; }

// The ops whose kernels check their index (codes stored in the device error record).
enum { IX_OP_INDEX_SELECT = 1, IX_OP_EMBEDDING, IX_OP_GATHER, IX_OP_SCATTER_ADD, IX_OP_ONE_HOT };
inline const char *ix_op_name(int op) {
    switch (op) {
    case IX_OP_INDEX_SELECT: return "index_select";
    case IX_OP_EMBEDDING: return "embedding";
    case IX_OP_GATHER: return "gather";
    case IX_OP_SCATTER_ADD: return "scatter_add";
    case IX_OP_ONE_HOT: return "one_hot";
    default: return "index kernel";
    }
}
// The CPU kernels' message for the bad values b of op (dim and its size, or the number of
// classes for one_hot), into buf.
inline void ix_err_format(char *buf, size_t n, int op, int dim, int64_t size, const ix_bad &b) {
    long long v = (long long)ix_bad_value(b);
    if (op == IX_OP_ONE_HOT && v < 0)
        snprintf(buf, n, "one_hot: class index %lld is negative; class values must be "
                 "non-negative", v);
    else if (op == IX_OP_ONE_HOT)
        snprintf(buf, n, "one_hot: class index %lld is out of range for %lld classes", v,
                 (long long)size);
    else
        snprintf(buf, n, "%s: index %lld is out of range for dim %d of size %lld",
                 ix_op_name(op), v, dim, (long long)size);
}

// Index value i alone, for calls whose output is empty but whose index is not (the CPU
// still checks those): false and *k when out of [0, size).
NB_HD bool ix_check(const void *ip, bool i64, int64_t i, int64_t size, int64_t *k) {
    *k = idx_at(ip, i64, i);
    return *k >= 0 && *k < size;
}

// ---- index_select and gather ---------------------------------------------------------------
// Output element i (row-major over shape) is x at the same position with p[dim] replaced by
// an index value: the index at i (gather: the index has the output's shape) or at p[dim]
// (index_select: a flat index; shape[dim] = its numel). xstr are x's strides (elements).
struct gather_geom {
    int nd, dim;
    bool linear;
    int64_t size; // x.shape[dim]: the valid index range
    int64_t sdim; // x.strides[dim]
    int64_t shape[NB_MAX_DIMS];
    int64_t xstr[NB_MAX_DIMS];
};

// 0-dim views as shape [1] (as the CPU's geom_of).
inline void view_geom(const nb__view *v, int *nd, int64_t *shape, int64_t *strides) {
    if (v->ndim == 0) {
        *nd = 1;
        shape[0] = 1;
        strides[0] = 1;
        return;
    }
    *nd = v->ndim;
    for (int d = 0; d < v->ndim; d++) shape[d] = v->shape[d], strides[d] = v->strides[d];
}

inline int64_t view_numel(const nb__view *v) {
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
    return n;
}

// index_select (linear = false): shape = x's with shape[dim] = numel(index).
// gather (linear = true): shape = out's.
inline gather_geom gather_geom_of(const nb__view *x, const nb__view *out, const nb__view *idx,
                                  int dim, bool linear) {
    gather_geom g;
    int64_t xshape[NB_MAX_DIMS];
    view_geom(x, &g.nd, xshape, g.xstr);
    g.dim = dim;
    g.linear = linear;
    g.size = xshape[dim];
    g.sdim = g.xstr[dim];
    if (linear) {
        int nd;
        int64_t ostr[NB_MAX_DIMS];
        view_geom(out, &nd, g.shape, ostr);
    } else {
        for (int d = 0; d < g.nd; d++) g.shape[d] = xshape[d];
        g.shape[dim] = view_numel(idx);
    }
    for (int d = g.nd; d < NB_MAX_DIMS; d++) g.shape[d] = 1, g.xstr[d] = 0;
    return g;
}

// x's element offset for output element i; false (and *k the bad value) when the index
// value is out of range.
NB_HD bool gather_src(const gather_geom &g, const void *ip, bool i64, int64_t i, int64_t *xoff,
                      int64_t *k) {
    int64_t rem = i, off = 0, pdim = 0;
    for (int d = g.nd - 1; d >= 0; d--) {
        int64_t n = g.shape[d];
        int64_t q = rem / n, c = rem - q * n;
        rem = q;
        if (d == g.dim) pdim = c;
        else off += c * g.xstr[d];
    }
    int64_t v = idx_at(ip, i64, g.linear ? i : pdim);
    *k = v;
    if (v < 0 || v >= g.size) return false;
    *xoff = off + v * g.sdim;
    return true;
}

// The whole of output element i (zero bits where the index is bad).
template <int ES>
NB_HD bool gather_elem(const gather_geom &g, char *out, const char *x, const void *ip, bool i64,
                       int64_t i, int64_t *k) {
    int64_t xoff;
    if (gather_src(g, ip, i64, i, &xoff, k)) {
        copy_elem<ES>(out + i * ES, x + xoff * ES);
        return true;
    }
    store_bits<ES>(out + i * ES, 0);
    return false;
}

// ---- scatter_add ---------------------------------------------------------------------------
// Positions q of the non-dim dims of index (nq = numel(index) / n of them): distinct q write
// distinct output elements, and one q walks j = 0 .. n-1 along dim in order, as the CPU.
struct scatter_geom {
    int nd, dim;
    int64_t n;    // index.shape[dim]
    int64_t size; // out.shape[dim]: the valid index range
    int64_t idim, odim, sdim; // strides along dim of index, out, src
    int64_t ishape[NB_MAX_DIMS], istr[NB_MAX_DIMS], os[NB_MAX_DIMS], ss[NB_MAX_DIMS];
};

inline scatter_geom scatter_geom_of(const nb__scatter_add_args *a) {
    scatter_geom c;
    int nd;
    int64_t oshape[NB_MAX_DIMS], sshape[NB_MAX_DIMS];
    view_geom(&a->index, &c.nd, c.ishape, c.istr);
    view_geom(&a->out, &nd, oshape, c.os);
    view_geom(&a->src, &nd, sshape, c.ss);
    c.dim = a->dim;
    c.n = c.ishape[c.dim];
    c.size = oshape[c.dim];
    c.idim = c.istr[c.dim];
    c.odim = c.os[c.dim];
    c.sdim = c.ss[c.dim];
    for (int d = c.nd; d < NB_MAX_DIMS; d++) c.ishape[d] = 1, c.istr[d] = c.os[d] = c.ss[d] = 0;
    return c;
}

// *o += *s in the dtype's arithmetic: floats add, integers wrap (unsigned), bool is or.
template <typename T> NB_HD void add_to(T *o, const T *s) { *o = (T)(*o + *s); }
struct boolean { uint8_t v; };
NB_HD void add_to(boolean *o, const boolean *s) {
    o->v = (uint8_t)((o->v | s->v) != 0);
}

// All additions of position q, in order; bad index values are skipped and noted in *bad.
template <typename T>
NB_HD void scatter_q(const scatter_geom &c, T *o, const T *s, const void *ip, bool i64,
                     int64_t q, ix_bad *bad) {
    int64_t rem = q, ob = 0, sb = 0, ib = 0;
    for (int d = c.nd - 1; d >= 0; d--) {
        if (d == c.dim) continue;
        int64_t n = c.ishape[d];
        int64_t x = rem % n;
        rem /= n;
        ob += x * c.os[d], sb += x * c.ss[d], ib += x * c.istr[d];
    }
    for (int64_t j = 0; j < c.n; j++) {
        int64_t k = idx_at(ip, i64, ib + j * c.idim);
        if (k < 0 || k >= c.size) {
            ix_bad_note(bad, k);
            continue;
        }
        add_to(o + ob + k * c.odim, s + sb + j * c.sdim);
    }
}

// ---- index_add -------------------------------------------------------------------------------
// out (O, S, D) contiguous of the accumulation type A (float or double); src (O, M, D)
// contiguous of storage type Src; index of M values in [0, S) (trusted: the forward checked
// them; a bad one is skipped). Every output element receives its rows in increasing m, from
// its current value: bit for bit the CPU's sum.
struct ia_geom {
    int64_t O, S, D, M;
};

inline ia_geom ia_geom_of(const nb__index_add_args *a) {
    ia_geom g = {1, 1, 1, view_numel(&a->index)};
    for (int d = 0; d < a->out.ndim; d++) {
        if (d < a->dim) g.O *= a->out.shape[d];
        else if (d == a->dim) g.S = a->out.shape[d];
        else g.D *= a->out.shape[d];
    }
    return g;
}

// Small indices: output element e scans the whole index in order.
template <typename A, typename Src>
NB_HD void ia_scan(const ia_geom &g, A *out, const Src *src, const void *ip, bool i64,
                   int64_t e) {
    int64_t j = e % g.D, t = e / g.D, r = t % g.S, o = t / g.S;
    A acc = out[e];
    const Src *s = src + o * g.M * g.D + j;
    for (int64_t m = 0; m < g.M; m++)
        if (idx_at(ip, i64, m) == r) acc += acc_of(acc, s[m * g.D]);
    out[e] = acc;
}

// Large indices: keys[0 .. M) are the index values stably sorted (out-of-range ones replaced
// by S, sorting last and skipped), perm[i] the position m of keys[i]: equal keys keep
// increasing m. A segment starts where the key changes; the segment's (o, column j) sum is
// one thread's loop, so each output element gets its rows in index order.
NB_HD bool ia_is_start(const uint32_t *keys, int64_t i) { return i == 0 || keys[i] != keys[i - 1]; }

// The sort key of index value v (S for a bad one).
NB_HD uint32_t ia_key(int64_t v, int64_t S) { return (uint32_t)(v >= 0 && v < S ? v : S); }

// Radix bits that hold every key 0 .. S.
inline int ia_key_bits(int64_t S) {
    int b = 1;
    while (b < 32 && ((int64_t)1 << b) <= S) b++;
    return b;
}

template <typename A, typename Src>
NB_HD void ia_segment(const ia_geom &g, A *out, const Src *src, const uint32_t *keys,
                      const uint32_t *perm, int64_t start, int64_t o, int64_t j) {
    uint32_t r = keys[start];
    if ((int64_t)r >= g.S) return;
    A *dst = out + (o * g.S + r) * g.D + j;
    const Src *s = src + o * g.M * g.D + j;
    A acc = *dst;
    for (int64_t i = start; i < g.M && keys[i] == r; i++) acc += acc_of(acc, s[(int64_t)perm[i] * g.D]);
    *dst = acc;
}

// Scan (true) or sort + segments (false): scanning costs O*S*D*M index reads, S times the
// sort path's O*M*D additions, but saves the sort's launches and scratch; scan only while
// that whole work is small (2^25 reads: microseconds on a current GPU).
inline bool ia_use_scan(const ia_geom &g) {
    return (double)g.O * (double)g.S * (double)g.D * (double)g.M <= 33554432.0;
}

// ---- masked_fill -------------------------------------------------------------------------------
template <int ES> NB_HD void mf_elem(const nb__iter &it, uint64_t value, int64_t i) {
    int64_t oo = nb__kh_offset(&it, 0, i), xo, mo;
    nb__kh_offsets2(&it, 1, 2, i, &xo, &mo);
    if (*(const uint8_t *)(it.data[2] + mo)) store_bits<ES>(it.data[0] + oo, value);
    else copy_elem<ES>(it.data[0] + oo, it.data[1] + xo);
}

// ---- one_hot -----------------------------------------------------------------------------------
// out (n, C) contiguous; element e is `one` where its column is the row's class. A bad class
// value leaves its row zero; false (and *k) for the row's first element then, so each bad
// row is noted once.
template <int ES>
NB_HD bool oh_elem(char *out, const void *ip, bool i64, int64_t C, uint64_t one, int64_t e,
                   int64_t *k) {
    int64_t i = e / C, c = e - i * C, v = idx_at(ip, i64, i);
    *k = v;
    store_bits<ES>(out + e * ES, v == c ? one : 0);
    return !(c == 0 && (v < 0 || v >= C));
}

// ---- tril / triu ---------------------------------------------------------------------------------
struct tri_geom {
    int nb;          // batch dims (nd - 2)
    int64_t R, C, k; // k clamped to +-(R + C), as the CPU
    bool lower;
    int64_t srow, scol;
    int64_t bshape[NB_MAX_DIMS], bstr[NB_MAX_DIMS];
};

inline tri_geom tri_geom_of(const nb__tri_args *a) {
    tri_geom g;
    int nd = a->x.ndim;
    g.nb = nd - 2;
    g.R = a->x.shape[nd - 2];
    g.C = a->x.shape[nd - 1];
    g.k = a->k;
    if (g.k > g.R + g.C) g.k = g.R + g.C;
    if (g.k < -(g.R + g.C)) g.k = -(g.R + g.C);
    g.lower = a->lower;
    g.srow = a->x.strides[nd - 2];
    g.scol = a->x.strides[nd - 1];
    for (int d = 0; d < NB_MAX_DIMS; d++) {
        g.bshape[d] = d < g.nb ? a->x.shape[d] : 1;
        g.bstr[d] = d < g.nb ? a->x.strides[d] : 0;
    }
    return g;
}

// tril keeps column j <= i + k, triu keeps j >= i + k; the rest is zero.
NB_HD bool tri_keep(const tri_geom &g, int64_t i, int64_t j) {
    return g.lower ? j <= i + g.k : j >= i + g.k;
}

template <int ES> NB_HD void tri_elem(const tri_geom &g, char *out, const char *x, int64_t e) {
    int64_t j = e % g.C, r = e / g.C, i = r % g.R, b = r / g.R;
    if (!tri_keep(g, i, j)) {
        store_bits<ES>(out + e * ES, 0);
        return;
    }
    int64_t off = i * g.srow + j * g.scol;
    for (int d = g.nb - 1; d >= 0; d--) {
        int64_t n = g.bshape[d];
        off += (b % n) * g.bstr[d];
        b /= n;
    }
    copy_elem<ES>(out + e * ES, x + off * ES);
}

// ---- index_minmax --------------------------------------------------------------------------------
NB_HD void mm_note(const void *ip, bool i64, int64_t i, int64_t *lo, int64_t *hi) {
    int64_t v = idx_at(ip, i64, i);
    *lo = v < *lo ? v : *lo;
    *hi = v > *hi ? v : *hi;
}

} // namespace nbix

#endif
