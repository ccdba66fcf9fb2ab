// cuda/k_random.cu - CUDA kernels of the random family (tensor/kernels/random.h): random
// (uniform, normal, randint, bernoulli: dropout's keep mask is a bernoulli draw into u8,
// nn/dropout.c) and randperm. Registered in the backend's table by nb__cuda_reg_random
// (cuda/kernels.h).
//
// UNVERIFIED ON A GPU: this file compiles (nvcc -Werror, no spills); the per-block math
// (cuda/k_random.cuh) and randperm's rounds are emulated on the host by
// tests/cuda_host/random.cu and give the CPU kernels' bytes; nothing here has run on a
// device.
//
// random: one thread per Philox block (grid-stride), which computes the block's 4 words
// once and writes the block's per_block elements (row-major element e = block * per + k,
// through the view's strides unless the output is dense). The values are the CPU's
// (tensor/random.c's layout), bit for bit except the last-bit caveat of normal in
// cuda/k_random.cuh.
//
// randperm: the CPU's sequential Fisher-Yates (swap i with j_i for i = n-1 down to 1) gives
// the same permutation as any schedule that performs each swap after every earlier swap
// touching one of its two positions. So: one grid kernel draws every j_i (the swaps' words
// do not depend on the array) and sets p = identity; then rounds of deterministic
// reservations (nbr::rp_reserve / rp_commit / rp_clear): every pending swap i writes max(i)
// into the reservation of positions i and j_i (integer atomicMax: order-independent); a
// swap that holds both reservations has no pending earlier swap on its positions and
// commits; the committed swaps of a round touch disjoint positions. The highest pending
// swap always commits, so rounds end, and the result is exactly the CPU's permutation,
// whatever the timing. About 2 log2(n) + 16 rounds run as grid-wide kernels (one per
// phase; a round after the last pending swap returns at once, read from a device flag, so
// the host never waits); a one-block kernel finishes whatever is left (normally nothing).
#include "cuda/k_random.cuh"
#include "cuda/kcommon.cuh"

static_assert(sizeof(nb__randperm_args) == 8 * 5, "randperm args layout");

using namespace nbk;

namespace {

// ---- random --------------------------------------------------------------------------------
__global__ void random_kernel(const __grid_constant__ nb__random_args a, int64_t n,
                              int64_t nblocks, bool dense) {
    const int64_t per = a.per_block;
    const size_t es = nb__kh_dtype_size(a.out.dtype);
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks;
         b += (int64_t)gridDim.x * blockDim.x) {
        double v[4];
        int64_t q[4];
        nbr::block_values(&a, (uint64_t)b, v, q);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int64_t e = b * per + k;
            if (k < per && e < n) {
                int64_t off = dense ? e : nbr::view_offset(&a.out, e);
                nbr::store(&a, a.out.data + off * (int64_t)es, v[k], q[k]);
            }
        }
    }
}

nb_status cuda_random(const nb__random_args *a) {
    const nb__view *v = &a->out;
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
    if (n == 0) return NB_OK;
    if (a->per_block != 4 && a->per_block != 2)
        return nb__error(NB_EUNSUPPORTED, "random: the cuda kernel does not handle %d "
                         "elements per Philox block", a->per_block);
    if (nb__kh_dtype_size(v->dtype) == 0)
        return nb__error(NB_EUNSUPPORTED, "random: the cuda kernel does not handle dtype %d",
                         (int)v->dtype);
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "random");
    if (st != NB_OK) return st;
    int64_t nblocks = (n + a->per_block - 1) / a->per_block;
    random_kernel<<<nb_blocks(nblocks), kThreads, 0, c.stream>>>(*a, n, nblocks,
                                                                 nbr::view_contiguous(v));
    return nb__cuda_kend(&c, cudaGetLastError());
}

// ---- randperm ------------------------------------------------------------------------------
#define NBR_GRID_LOOP(i, n)                                                                 \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (int64_t)gridDim.x * blockDim.x)

// p = identity; J[i] = j_i (i >= 1) or -1 (position 0: no swap); R[i] = -1 (unreserved).
__global__ void randperm_init_kernel(nb__randperm_args a, int64_t *J, long long *R) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.n;
         i += (int64_t)gridDim.x * blockDim.x) {
        a.out[i] = i;
        R[i] = -1;
        J[i] = i >= 1 ? nbr::swap_index(&a, a.n - 1 - i) : -1;
    }
}

// Rounds in grid-wide kernels, one kernel per phase (a kernel boundary finishes a phase for
// the whole grid). left[r] = 1 when round r's clear found a pending swap; the kernels of
// round r + 1 return at once when left[r] is 0, so the host launches a fixed number of
// rounds without reading anything back.
__global__ void rp_reserve_kernel(const int64_t *J, long long *R, int64_t n, const int *left,
                                  int r) {
    if (r > 0 && !left[r - 1]) return;
    NBR_GRID_LOOP(i, n) nbr::rp_reserve(J, R, i);
}
__global__ void rp_commit_kernel(int64_t *p, int64_t *J, const long long *R, int64_t n,
                                 const int *left, int r) {
    if (r > 0 && !left[r - 1]) return;
    NBR_GRID_LOOP(i, n) nbr::rp_commit(p, J, R, i);
}
__global__ void rp_clear_kernel(int64_t *J, long long *R, int64_t n, int *left, int r) {
    if (r > 0 && !left[r - 1]) return;
    bool any = false;
    NBR_GRID_LOOP(i, n) any |= nbr::rp_clear(J, R, i);
    if (any) left[r] = 1; // every writer stores 1: no read-modify-write
}

// The tail (one block, barriers between the phases): runs rounds until none is pending,
// when the grid-wide rounds did not finish (*left_last != 0). The highest pending swap
// always commits, so this ends.
__global__ void rp_tail_kernel(int64_t *p, int64_t n, int64_t *J, long long *R,
                               const int *left_last) {
    if (!*left_last) return;
    for (;;) {
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) nbr::rp_reserve(J, R, i);
        __syncthreads();
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) nbr::rp_commit(p, J, R, i);
        __syncthreads();
        int any = 0;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) any |= nbr::rp_clear(J, R, i);
        if (!__syncthreads_or(any)) break;
    }
}

nb_status cuda_randperm(const nb__randperm_args *a) {
    if (a->n <= 0) return NB_OK;
    nb__cuda_kctx c;
    nb_status st = nb__cuda_kbegin(&c, "randperm");
    if (st != NB_OK) return st;
    const size_t n = (size_t)a->n;
    const int rounds = nbr::rp_grid_rounds(a->n);
    char *scratch = (char *)nb__cuda_kscratch(
        &c, n * (sizeof(int64_t) + sizeof(long long)) + sizeof(int) * (size_t)rounds);
    if (!scratch) return nb__cuda_kfail(&c);
    int64_t *J = (int64_t *)scratch;
    long long *R = (long long *)(scratch + n * sizeof(int64_t));
    int *left = (int *)(scratch + n * (sizeof(int64_t) + sizeof(long long)));
    const unsigned grid = nb_blocks(a->n);
    cudaError_t e = cudaMemsetAsync(left, 0, sizeof(int) * (size_t)rounds, c.stream);
    if (e == cudaSuccess) {
        randperm_init_kernel<<<grid, kThreads, 0, c.stream>>>(*a, J, R);
        for (int r = 0; a->n > 1 && r < rounds; r++) {
            rp_reserve_kernel<<<grid, kThreads, 0, c.stream>>>(J, R, a->n, left, r);
            rp_commit_kernel<<<grid, kThreads, 0, c.stream>>>(a->out, J, R, a->n, left, r);
            rp_clear_kernel<<<grid, kThreads, 0, c.stream>>>(J, R, a->n, left, r);
        }
        if (a->n > 1)
            rp_tail_kernel<<<1, 1024, 0, c.stream>>>(a->out, a->n, J, R, left + rounds - 1);
        e = cudaGetLastError();
    }
    nb__cuda_kfree(scratch);
    return nb__cuda_kend(&c, e);
}

}  // namespace

extern "C" void nb__cuda_reg_random(nb__backend *be) {
    be->k.random = cuda_random;
    be->k.randperm = cuda_randperm;
}
