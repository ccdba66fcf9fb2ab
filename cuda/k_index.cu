// cuda/k_index.cu - CUDA kernels of the index family (tensor/kernels/index.h): index_select,
// gather, scatter_add, index_add, masked_fill, one_hot, index_minmax, tri. Registered in the
// backend's table by nb__cuda_reg_index (cuda/kernels.h). The math of every kernel is in
// cuda/k_index.cuh (__host__ __device__), which tests/cuda_host/index.cu runs on the host
// against the CPU kernels (cpu/index.c, the spec).
//
// UNVERIFIED ON A GPU: this file compiles warning-free (nvcc --Werror, no spills) and its
// math is host-checked, but no kernel here has run on a device yet.
//
// Element moves care about the element size only (1, 2, 4 or 8 bytes): the copy kernels
// are templates over it, so every dtype the CPU kernels move is handled. Launches are
// grid-stride loops over 64-bit positions on the context's stream; nothing synchronizes
// except index_minmax, whose contract returns its result in host memory (one_hot with
// inferred classes: the output's shape depends on the values, as in PyTorch).
//
// Determinism: scatter_add and index_add never use float atomics. scatter_add gives each
// position of index's non-dim dims to one thread, which walks dim in increasing order (the
// CPU's order). index_add either scans the whole index per output element (small S*M), or
// stably radix-sorts the index (CUB) and sums each target row's segment in source order,
// one thread per (segment, column): the same bits as the CPU on every run.
//
// Bad index values. The op definitions do not check index values (tensor/ops/index.c): the
// CPU kernels scan the index and fail with NB_EINDEX before writing. A CUDA kernel cannot
// fail that way without reading device memory back (a host sync per op), so the checking
// kernels (index_select/embedding, gather, scatter_add, one_hot) never touch memory out of
// range: they write zeros for a bad gathered element, skip a bad scatter, and record the
// bad values in a per-device error record (g_ix_err), which nb__cuda_index_error
// (cuda/k_index.h) reads at a natural sync and turns into the CPU's message. The kernels
// never trap.
#include <atomic>
#include <stdlib.h>
#include <string.h>

#include <cub/device/device_radix_sort.cuh>

#include "cuda/cuda_impl.h"
#include "cuda/k_index.cuh"
#include "cuda/k_index.h"
#include "cuda/kcommon.cuh"

using namespace nbix;
using nbk::kThreads;
using nbk::nb_blocks;

static_assert(offsetof(nb__index_select_args, dim) == 3 * sizeof(nb__view),
              "nb__index_select_args: three views, then the dim");
static_assert(offsetof(nb__gather_args, op) > offsetof(nb__gather_args, dim),
              "nb__gather_args: the op name after the dim");
static_assert(offsetof(nb__scatter_add_args, dim) == 3 * sizeof(nb__view),
              "nb__scatter_add_args: the views come first");
static_assert(sizeof(ix_bad) == 16, "ix_bad: two 64-bit values");

// ---- the device error record -----------------------------------------------------------------
struct ix_err_rec {
    unsigned int tag; // 0: clean; else the call that first saw a bad value
    int op, dim, pad;
    unsigned long long size;
    long long neg;  // most negative bad value (0: none)
    long long pos1; // 1 + largest non-negative bad value (0: none)
};
__device__ ix_err_rec g_ix_err; // one per device (zero-initialized on module load)

// What a checking launch passes to its report: a tag unique to the call, the op, its dim
// and the valid range (one_hot: the number of classes).
struct ix_ctx {
    unsigned int tag;
    int op, dim;
    long long size;
};

static std::atomic<unsigned int> g_next_tag{0};
// Devices that ran a checking kernel since their record was last read: a clean device's
// record is never read, so the check at a sync costs nothing when no index kernel ran.
static std::atomic<bool> g_dirty[NB__CUDA_MAX_DEVICES];

static void ix_mark(int device) {
    if (device >= 0 && device < NB__CUDA_MAX_DEVICES) g_dirty[device].store(true);
}

static ix_ctx ix_ctx_of(const char *op, int code, int dim, int64_t size) {
    unsigned int tag = ++g_next_tag;
    if (tag == 0) tag = ++g_next_tag;
    if (op && strcmp(op, "embedding") == 0) code = IX_OP_EMBEDDING;
    return ix_ctx{tag, code, dim, (long long)size};
}

__device__ void ix_report(const ix_ctx &c, int64_t k) {
    unsigned int prev = atomicCAS(&g_ix_err.tag, 0u, c.tag);
    if (prev != 0u && prev != c.tag) return; // an earlier call's error is kept
    atomicExch(&g_ix_err.op, c.op);
    atomicExch(&g_ix_err.dim, c.dim);
    atomicExch(&g_ix_err.size, (unsigned long long)c.size);
    if (k < 0) atomicMin(&g_ix_err.neg, (long long)k);
    else atomicMax(&g_ix_err.pos1, (long long)k + 1);
}

extern "C" nb_status nb__cuda_index_error(int device) {
    if (device >= 0 && device < NB__CUDA_MAX_DEVICES && !g_dirty[device].exchange(false))
        return NB_OK;
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != device && cudaSetDevice(device) != cudaSuccess)
        return nb__error(NB_EDEVICE, "cuda:%d: cannot make the device current to read its index "
                         "error record", device);
    ix_err_rec r;
    cudaError_t e = cudaMemcpyFromSymbol(&r, g_ix_err, sizeof r);
    nb_status st = NB_OK;
    if (e != cudaSuccess) {
        st = nb__error(NB_EDEVICE, "cuda:%d: reading the index error record failed: %s", device,
                       cudaGetErrorString(e));
    } else if (r.tag != 0) {
        ix_err_rec zero;
        memset(&zero, 0, sizeof zero);
        e = cudaMemcpyToSymbol(g_ix_err, &zero, sizeof zero);
        char msg[160];
        ix_err_format(msg, sizeof msg, r.op, r.dim, (int64_t)r.size, ix_bad{r.neg, r.pos1});
        st = nb__error(NB_EINDEX, "%s", msg);
        (void)e; // the index error is the one to report
    }
    if (prev >= 0 && prev != device) cudaSetDevice(prev);
    return st;
}

// NB_CUDA_SYNC_INDEX_CHECKS=1 (read once): every checking kernel waits for its stream and
// reads the record, so the op itself fails with NB_EINDEX as on the CPU (debugging, and the
// op tests on a GPU); a host sync per call, so off by default.
static bool sync_checks() {
    static const bool on = [] {
        const char *e = getenv("NB_CUDA_SYNC_INDEX_CHECKS");
        return e && *e && strcmp(e, "0") != 0;
    }();
    return on;
}

// nb__cuda_kend for the checking kernels (after their launches).
static nb_status ix_end(nb__cuda_kctx *c) {
    cudaError_t e = cudaGetLastError();
    bool sync = sync_checks();
    if (e == cudaSuccess && sync) e = cudaStreamSynchronize(c->stream);
    int device = c->device;
    nb_status st = nb__cuda_kend(c, e);
    return st == NB_OK && sync ? nb__cuda_index_error(device) : st;
}

// Run the statement with ES a constant element size; `ok` false for any other size.
#define IX_BY_ES(es, ok, ES, ...)                                                          \
    switch (es) {                                                                          \
    case 1: { constexpr int ES = 1; __VA_ARGS__; } break;                                  \
    case 2: { constexpr int ES = 2; __VA_ARGS__; } break;                                  \
    case 4: { constexpr int ES = 4; __VA_ARGS__; } break;                                  \
    case 8: { constexpr int ES = 8; __VA_ARGS__; } break;                                  \
    default: ok = false; break;                                                            \
    }

#define IX_GRID_STRIDE(i, n)                                                               \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);              \
         i += (int64_t)gridDim.x * blockDim.x)

// Only the check of n index values (an empty output, a non-empty index).
__global__ void k_check(const void *ip, bool i64, int64_t n, int64_t size, ix_ctx ec) {
    IX_GRID_STRIDE(i, n) {
        int64_t k;
        if (!ix_check(ip, i64, i, size, &k)) ix_report(ec, k);
    }
}

static nb_status check_launch(const char *what, const nb__view *idx, int64_t size, ix_ctx ec) {
    int64_t n = view_numel(idx);
    if (n == 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, what);
    if (st != NB_OK) return st;
    ix_mark(c.device);
    k_check<<<nb_blocks(n), kThreads, 0, c.stream>>>(idx->data, idx->dtype == NB_I64, n, size,
                                                      ec);
    return ix_end(&c);
}

// ---- index_select and gather --------------------------------------------------------------------
template <int ES>
__global__ void k_gather(gather_geom g, char *out, const char *x, const void *ip, bool i64,
                         int64_t n, ix_ctx ec) {
    IX_GRID_STRIDE(i, n) {
        int64_t k;
        if (!gather_elem<ES>(g, out, x, ip, i64, i, &k)) ix_report(ec, k);
    }
}

static nb_status gather_launch(const char *what, const nb__view *out, const nb__view *x,
                               const nb__view *idx, int dim, bool linear, const char *op,
                               int code) {
    int64_t n = view_numel(out);
    gather_geom g = gather_geom_of(x, out, idx, dim, linear);
    ix_ctx ec = ix_ctx_of(op, code, dim, g.size);
    if (n == 0) return check_launch(what, idx, g.size, ec); // the values are still checked
    int es = nb__kh_dtype_size(x->dtype);
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, what);
    if (st != NB_OK) return st;
    ix_mark(c.device);
    bool ok = true, i64 = idx->dtype == NB_I64;
    IX_BY_ES(es, ok, ES,
             k_gather<ES><<<nb_blocks(n), kThreads, 0, c.stream>>>(g, out->data, x->data,
                                                                   idx->data, i64, n, ec));
    st = ix_end(&c);
    if (!ok) return nb__error(NB_EUNSUPPORTED, "%s: the cuda kernel does not handle dtype %d",
                              what, (int)x->dtype);
    return st;
}

static nb_status cuda_index_select(const nb__index_select_args *a) {
    return gather_launch("index_select", &a->out, &a->x, &a->index, a->dim, false, a->op,
                         IX_OP_INDEX_SELECT);
}

static nb_status cuda_gather(const nb__gather_args *a) {
    return gather_launch("gather", &a->out, &a->x, &a->index, a->dim, true, a->op,
                         IX_OP_GATHER);
}

// ---- scatter_add -----------------------------------------------------------------------------------
template <typename T>
__global__ void k_scatter(scatter_geom g, T *o, const T *s, const void *ip, bool i64,
                          int64_t nq, ix_ctx ec) {
    IX_GRID_STRIDE(q, nq) {
        ix_bad bad = {0, 0};
        scatter_q<T>(g, o, s, ip, i64, q, &bad);
        if (bad.neg < 0) ix_report(ec, bad.neg);
        if (bad.pos1 > 0) ix_report(ec, bad.pos1 - 1);
    }
}

static nb_status cuda_scatter_add(const nb__scatter_add_args *a) {
    int64_t total = view_numel(&a->index);
    if (total == 0) return NB_OK;
    scatter_geom g = scatter_geom_of(a);
    int64_t nq = total / g.n;
    ix_ctx ec = ix_ctx_of(a->op, IX_OP_SCATTER_ADD, a->dim, g.size);
    bool i64 = a->index.dtype == NB_I64;
    nb_dtype dt = a->out.dtype;
    if (dt != NB_F32 && dt != NB_F64 && dt != NB_I32 && dt != NB_I64 && dt != NB_U8 &&
        dt != NB_BOOL)
        return nb__error(NB_EUNSUPPORTED, "scatter_add: the cuda kernel does not handle dtype "
                         "%d yet", (int)dt);
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "scatter_add");
    if (st != NB_OK) return st;
    ix_mark(c.device);
    unsigned blocks = nb_blocks(nq);
#define IX_SCATTER(T)                                                                      \
    k_scatter<T><<<blocks, kThreads, 0, c.stream>>>(g, (T *)a->out.data,                   \
                                                    (const T *)a->src.data, a->index.data, \
                                                    i64, nq, ec)
    switch (dt) {
    case NB_F32: IX_SCATTER(float); break;
    case NB_F64: IX_SCATTER(double); break;
    case NB_I32: IX_SCATTER(uint32_t); break;
    case NB_I64: IX_SCATTER(uint64_t); break;
    case NB_U8: IX_SCATTER(uint8_t); break;
    default: IX_SCATTER(boolean); break;
    }
#undef IX_SCATTER
    return ix_end(&c);
}

// ---- index_add -------------------------------------------------------------------------------------
template <typename A, typename Src>
__global__ void k_ia_scan(ia_geom g, A *out, const Src *src, const void *ip, bool i64,
                          int64_t n) {
    IX_GRID_STRIDE(e, n) ia_scan<A, Src>(g, out, src, ip, i64, e);
}

__global__ void k_ia_keys(uint32_t *keys, uint32_t *perm, const void *ip, bool i64, int64_t M,
                          int64_t S) {
    IX_GRID_STRIDE(m, M) {
        keys[m] = ia_key(idx_at(ip, i64, m), S);
        perm[m] = (uint32_t)m;
    }
}

// One block per (sorted position, outer slice); only segment starts work, their threads
// stride over the D columns.
template <typename A, typename Src>
__global__ void k_ia_seg(ia_geom g, A *out, const Src *src, const uint32_t *keys,
                         const uint32_t *perm) {
    int64_t items = g.M * g.O;
    for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
        int64_t i = it % g.M, o = it / g.M;
        if (!ia_is_start(keys, i)) continue;
        for (int64_t j = threadIdx.x; j < g.D; j += blockDim.x)
            ia_segment<A, Src>(g, out, src, keys, perm, i, o, j);
    }
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

template <typename A, typename Src>
static cudaError_t ia_run(const nb__index_add_args *a, const ia_geom &g, nb__cuda_kctx *c,
                          bool *oom) {
    A *out = (A *)a->out.data;
    const Src *src = (const Src *)a->src.data;
    bool i64 = a->index.dtype == NB_I64;
    if (ia_use_scan(g)) {
        int64_t n = g.O * g.S * g.D;
        k_ia_scan<A, Src><<<nb_blocks(n), kThreads, 0, c->stream>>>(g, out, src, a->index.data,
                                                                    i64, n);
        return cudaGetLastError();
    }
    int M = (int)g.M, bits = ia_key_bits(g.S);
    size_t temp = 0;
    cudaError_t e = cub::DeviceRadixSort::SortPairs(nullptr, temp, (const uint32_t *)nullptr,
                                                    (uint32_t *)nullptr,
                                                    (const uint32_t *)nullptr,
                                                    (uint32_t *)nullptr, M, 0, bits, c->stream);
    if (e != cudaSuccess) return e;
    size_t arr = align256((size_t)M * sizeof(uint32_t));
    char *scratch = (char *)nb__cuda_kscratch(c, 4 * arr + align256(temp));
    if (!scratch) {
        *oom = true;
        return cudaSuccess;
    }
    uint32_t *keys_in = (uint32_t *)scratch, *keys = (uint32_t *)(scratch + arr);
    uint32_t *perm_in = (uint32_t *)(scratch + 2 * arr), *perm = (uint32_t *)(scratch + 3 * arr);
    k_ia_keys<<<nb_blocks(g.M), kThreads, 0, c->stream>>>(keys_in, perm_in, a->index.data, i64,
                                                          g.M, g.S);
    e = cudaGetLastError();
    if (e == cudaSuccess)
        e = cub::DeviceRadixSort::SortPairs(scratch + 4 * arr, temp, keys_in, keys, perm_in, perm,
                                            M, 0, bits, c->stream);
    if (e == cudaSuccess) {
        int threads = g.D >= 256 ? 256 : g.D > 64 ? 128 : 32;
        int64_t items = g.M * g.O;
        unsigned blocks = (unsigned)(items < nbk::kMaxBlocks ? items : nbk::kMaxBlocks);
        k_ia_seg<A, Src><<<blocks, threads, 0, c->stream>>>(g, out, src, keys, perm);
        e = cudaGetLastError();
    }
    nb__cuda_kfree(scratch); // stream-ordered: reused only after these launches
    return e;
}

static nb_status cuda_index_add(const nb__index_add_args *a) {
    ia_geom g = ia_geom_of(a);
    if (g.O * g.M * g.D == 0 || g.S == 0) return NB_OK;
    nb_dtype odt = a->out.dtype, sdt = a->src.dtype;
    bool f32src = sdt == NB_F32 || sdt == NB_F16 || sdt == NB_BF16;
    if (!((odt == NB_F32 && f32src) || (odt == NB_F64 && (f32src || sdt == NB_F64))))
        return nb__error(NB_EUNSUPPORTED, "index_add: the cuda kernel does not handle an "
                         "accumulator of dtype %d with a source of dtype %d", (int)odt, (int)sdt);
    if (!ia_use_scan(g) && (g.M > INT32_MAX || g.S >= (int64_t)UINT32_MAX))
        return nb__error(NB_EUNSUPPORTED, "index_add: the cuda kernel does not handle %lld "
                         "indices into %lld rows yet (at most 2^31 - 1 and 2^32 - 2)",
                         (long long)g.M, (long long)g.S);
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "index_add");
    if (st != NB_OK) return st;
    bool oom = false;
    cudaError_t e = cudaSuccess;
#define IX_IA(A, S) e = ia_run<A, S>(a, g, &c, &oom)
    if (odt == NB_F32) {
        if (sdt == NB_F32) IX_IA(float, float);
        else if (sdt == NB_F16) IX_IA(float, f16s);
        else IX_IA(float, bf16s);
    } else {
        if (sdt == NB_F64) IX_IA(double, double);
        else if (sdt == NB_F32) IX_IA(double, float);
        else if (sdt == NB_F16) IX_IA(double, f16s);
        else IX_IA(double, bf16s);
    }
#undef IX_IA
    st = nb__cuda_kend(&c, e);
    return oom ? nb_last_status() : st; // the allocator set the out-of-memory message
}

// ---- masked_fill ------------------------------------------------------------------------------------
template <int ES> __global__ void k_masked_fill(nb__iter it, uint64_t value) {
    IX_GRID_STRIDE(i, it.numel) mf_elem<ES>(it, value, i);
}

static nb_status cuda_masked_fill(const nb__masked_fill_args *a) {
    if (a->it.numel == 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "masked_fill");
    if (st != NB_OK) return st;
    bool ok = true;
    IX_BY_ES(nb__kh_dtype_size(a->it.dtype[0]), ok, ES,
             k_masked_fill<ES><<<nb_blocks(a->it.numel), kThreads, 0, c.stream>>>(a->it,
                                                                                  a->value));
    st = nb__cuda_kend(&c, cudaGetLastError());
    if (!ok) return nb__error(NB_EUNSUPPORTED, "masked_fill: the cuda kernel does not handle "
                              "dtype %d", (int)a->it.dtype[0]);
    return st;
}

// ---- one_hot ----------------------------------------------------------------------------------------
template <int ES>
__global__ void k_one_hot(char *out, const void *ip, bool i64, int64_t C, uint64_t one,
                          int64_t n, ix_ctx ec) {
    IX_GRID_STRIDE(e, n) {
        int64_t k;
        if (!oh_elem<ES>(out, ip, i64, C, one, e, &k)) ix_report(ec, k);
    }
}

static nb_status cuda_one_hot(const nb__one_hot_args *a) {
    int64_t rows = view_numel(&a->index), C = a->out.shape[a->out.ndim - 1], n = rows * C;
    ix_ctx ec = ix_ctx_of(nullptr, IX_OP_ONE_HOT, 0, C);
    if (n == 0) return check_launch("one_hot", &a->index, C, ec); // C == 0: all values bad
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "one_hot");
    if (st != NB_OK) return st;
    ix_mark(c.device);
    bool ok = true, i64 = a->index.dtype == NB_I64;
    IX_BY_ES(nb__kh_dtype_size(a->out.dtype), ok, ES,
             k_one_hot<ES><<<nb_blocks(n), kThreads, 0, c.stream>>>(a->out.data, a->index.data,
                                                                    i64, C, a->one, n, ec));
    st = ix_end(&c);
    if (!ok) return nb__error(NB_EUNSUPPORTED, "one_hot: the cuda kernel does not handle dtype "
                              "%d", (int)a->out.dtype);
    return st;
}

// ---- index_minmax -------------------------------------------------------------------------------------
__global__ void k_minmax_init(long long *res) {
    res[0] = INT64_MAX;
    res[1] = INT64_MIN;
}

// Per-thread min/max, warp butterfly, one integer atomic per warp (min and max do not depend
// on the order).
__global__ void k_minmax(const void *ip, bool i64, int64_t n, long long *res) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    IX_GRID_STRIDE(i, n) mm_note(ip, i64, i, &lo, &hi);
    for (int o = 16; o > 0; o >>= 1) {
        long long l = __shfl_xor_sync(0xffffffffu, (long long)lo, o);
        long long h = __shfl_xor_sync(0xffffffffu, (long long)hi, o);
        lo = l < lo ? l : lo;
        hi = h > hi ? h : hi;
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMin(&res[0], (long long)lo);
        atomicMax(&res[1], (long long)hi);
    }
}

static nb_status cuda_index_minmax(const nb__index_minmax_args *a) {
    int64_t n = view_numel(&a->index);
    *a->out_min = INT64_MAX;
    *a->out_max = INT64_MIN;
    if (n == 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "index_minmax");
    if (st != NB_OK) return st;
    long long *res = (long long *)nb__cuda_kscratch(&c, 2 * sizeof(long long));
    if (!res) {
        nb__cuda_kend(&c, cudaSuccess);
        return nb_last_status(); // the allocator's out-of-memory message
    }
    long long host[2] = {INT64_MAX, INT64_MIN};
    k_minmax_init<<<1, 1, 0, c.stream>>>(res);
    k_minmax<<<nb_blocks(n), kThreads, 0, c.stream>>>(a->index.data, a->index.dtype == NB_I64, n,
                                                      res);
    cudaError_t e = cudaGetLastError();
    // The contract's result is host memory: the one synchronizing kernel of the family.
    if (e == cudaSuccess) e = cudaMemcpyAsync(host, res, sizeof host, cudaMemcpyDeviceToHost,
                                              c.stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c.stream);
    nb__cuda_kfree(res);
    st = nb__cuda_kend(&c, e);
    if (st == NB_OK) {
        *a->out_min = host[0];
        *a->out_max = host[1];
    }
    return st;
}

// ---- tril / triu -------------------------------------------------------------------------------------
template <int ES> __global__ void k_tri(tri_geom g, char *out, const char *x, int64_t n) {
    IX_GRID_STRIDE(e, n) tri_elem<ES>(g, out, x, e);
}

static nb_status cuda_tri(const nb__tri_args *a) {
    int64_t n = view_numel(&a->x);
    if (n == 0) return NB_OK;
    tri_geom g = tri_geom_of(a);
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, a->lower ? "tril" : "triu");
    if (st != NB_OK) return st;
    bool ok = true;
    IX_BY_ES(nb__kh_dtype_size(a->x.dtype), ok, ES,
             k_tri<ES><<<nb_blocks(n), kThreads, 0, c.stream>>>(g, a->out.data, a->x.data, n));
    st = nb__cuda_kend(&c, cudaGetLastError());
    if (!ok) return nb__error(NB_EUNSUPPORTED, "tri: the cuda kernel does not handle dtype %d",
                              (int)a->x.dtype);
    return st;
}

extern "C" void nb__cuda_reg_index(nb__backend *be) {
    be->k.index_select = cuda_index_select;
    be->k.gather = cuda_gather;
    be->k.scatter_add = cuda_scatter_add;
    be->k.index_add = cuda_index_add;
    be->k.masked_fill = cuda_masked_fill;
    be->k.one_hot = cuda_one_hot;
    be->k.index_minmax = cuda_index_minmax;
    be->k.tri = cuda_tri;
}
