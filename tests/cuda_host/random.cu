// tests/cuda_host/random.cu - host checks of the random family's __host__ __device__ math
// (cuda/k_random.cuh, used by cuda/k_random.cu), compiled by nvcc and compared with the CPU
// backend (cpu/random.c) on the same args structs. No GPU needed.
//
// random: the kernel emulated thread by thread (one thread per Philox block, in reverse
// order to show the order does not matter) must write the CPU kernel's bytes, for every
// distribution and output dtype the ops use, several seeds, offsets (not multiples of 4,
// and across the 2^32 and 2^64 wraps of the counter), odd sizes and a strided output.
// randperm: the rounds of deterministic reservations emulated phase by phase must give the
// CPU's Fisher-Yates permutation. sincos_small (the device's sin/cos in Box-Muller) is
// compared with glibc's within 2 ulp.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda/k_random.cuh"
#include "cuhost.h"
#include "tensor/backend_table.h"

namespace {

// k_random.cu's random_kernel on the host: every block b (any order), its elements placed
// through the view (dense: offset = element index).
void emulate_random(const nb__random_args *a) {
    const nb__view *v = &a->out;
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++) n *= v->shape[d];
    const int64_t per = a->per_block, nblocks = (n + per - 1) / per;
    const bool dense = nbr::view_contiguous(v);
    const size_t es = nb__kh_dtype_size(v->dtype);
    for (int64_t b = nblocks - 1; b >= 0; b--) {
        double val[4];
        int64_t q[4];
        nbr::block_values(a, (uint64_t)b, val, q);
        for (int k = 0; k < 4; k++) {
            int64_t e = b * per + k;
            if (k < per && e < n) {
                int64_t off = dense ? e : nbr::view_offset(v, e);
                nbr::store(a, v->data + off * (int64_t)es, val[k], q[k]);
            }
        }
    }
}

struct rcase {
    nb__random_dist dist;
    nb_dtype dt;
    int per;
    double a, b;
    int64_t ilo;
    uint64_t range;
};

uint16_t below_h(nb_dtype dt, float hi) { // the half value just below hi (hi > 0, exact)
    return (uint16_t)((dt == NB_F16 ? nb__kh_f16_from_f32(hi) : nb__kh_bf16_from_f32(hi)) - 1);
}

void check_random(cuhost *t) {
    const rcase cases[] = {
        {NB__RANDOM_UNIFORM, NB_F32, 4, -2, 3, 0, 0},
        {NB__RANDOM_UNIFORM, NB_F32, 4, 1 - 1e-7, 1, 0, 0}, // many round up to hi
        {NB__RANDOM_UNIFORM, NB_F16, 4, 0, 1, 0, 0},
        {NB__RANDOM_UNIFORM, NB_BF16, 4, 0.99, 1, 0, 0},    // many round up to hi
        {NB__RANDOM_UNIFORM, NB_F64, 2, -1, 1, 0, 0},
        {NB__RANDOM_UNIFORM, NB_F64, 2, 1 - 1e-15, 1, 0, 0},
        {NB__RANDOM_NORMAL, NB_F32, 4, 0.5, 2, 0, 0},
        {NB__RANDOM_NORMAL, NB_BF16, 4, 0, 1, 0, 0},
        {NB__RANDOM_NORMAL, NB_F16, 4, 0, 0.02, 0, 0},
        {NB__RANDOM_NORMAL, NB_F64, 2, -1, 3, 0, 0},
        {NB__RANDOM_INT, NB_I64, 4, 0, 0, -5, 10},
        {NB__RANDOM_INT, NB_I32, 4, 0, 0, 7, 1000003},
        {NB__RANDOM_INT, NB_U8, 4, 0, 0, 0, 256},
        {NB__RANDOM_INT, NB_F32, 4, 0, 0, -100, 200},
        {NB__RANDOM_INT, NB_I64, 4, 0, 0, 0, 1ull << 32},
        {NB__RANDOM_INT, NB_I64, 2, 0, 0, -(1ll << 40), 3ull << 40},
        {NB__RANDOM_BERNOULLI, NB_U8, 4, 0.3, 0, 0, 0},  // dropout's keep mask
        {NB__RANDOM_BERNOULLI, NB_BOOL, 4, 0.9, 0, 0, 0},
        {NB__RANDOM_BERNOULLI, NB_F32, 4, 0.5, 0, 0, 0},
    };
    const uint64_t seeds[] = {0, 42, 0x9E3779B97F4A7C15ull};
    const uint64_t offsets[] = {0, 3, 5, 0xFFFFFFFFull, 0xFFFFFFFFFFFFFFFEull};
    const int64_t sizes[] = {1, 3, 7, 1023, 1025, 4099};
    long cmp = 0;
    for (const rcase &rc : cases)
        for (uint64_t seed : seeds)
            for (uint64_t off : offsets)
                for (int64_t n : sizes)
                    for (int strided = 0; strided < 2; strided++) {
                        size_t es = nb__kh_dtype_size(rc.dt);
                        nb__random_args a = {};
                        a.out.dtype = rc.dt;
                        // dense [n] or, strided, [n / 3 + 1, 3] transposed-in-place: shape
                        // (r, 3) with strides (1, r + 2): gaps the kernel must not touch
                        int64_t r = n / 3 + 1, cap = strided ? 3 * (r + 2) : n;
                        if (strided) {
                            a.out.ndim = 2;
                            a.out.shape[0] = r, a.out.shape[1] = 3;
                            a.out.strides[0] = 1, a.out.strides[1] = r + 2;
                        } else {
                            a.out.ndim = 1;
                            a.out.shape[0] = n, a.out.strides[0] = 1;
                        }
                        a.dist = rc.dist;
                        a.seed = seed, a.stream = seed ? 7 : 0, a.offset = off;
                        a.per_block = rc.per;
                        a.a = rc.a, a.b = rc.b, a.ilo = rc.ilo, a.range = rc.range;
                        a.below_hi_d = nextafter(rc.b, -INFINITY);
                        a.below_hi_f = nextafterf((float)rc.b, -INFINITY);
                        if (rc.dt == NB_F16 || rc.dt == NB_BF16) a.below_hi_h = below_h(rc.dt, (float)rc.b);
                        std::vector<char> o1((size_t)cap * es, 0x5a), o2 = o1;
                        a.out.data = o1.data();
                        nb_status st = cuhost_cpu()->random(&a);
                        a.out.data = o2.data();
                        emulate_random(&a);
                        cmp++;
                        CUHOST_CHECK(t, st == NB_OK && o1 == o2,
                                     "random dist %d dtype %d per %d seed %llu offset %llu n %lld "
                                     "strided %d", (int)rc.dist, (int)rc.dt, rc.per,
                                     (unsigned long long)seed, (unsigned long long)off,
                                     (long long)n, strided);
                    }
    (void)cmp;
}

// k_random.cu's randperm: init (identity, j_i, no reservation), then `grid_rounds` rounds
// (the grid-wide kernels: each phase over every i, in an order that must not matter), then
// the one-block tail's rounds until none is pending. Returns the number of rounds run
// (-1 past n rounds: a round that commits nothing, which cannot happen: the highest pending
// swap always commits); *tail the rounds the tail ran.
int emulate_randperm(const nb__randperm_args *a, int grid_rounds, int *tail) {
    const int64_t n = a->n;
    std::vector<int64_t> J((size_t)n);
    std::vector<long long> R((size_t)n);
    int64_t *p = a->out;
    for (int64_t i = 0; i < n; i++) {
        p[i] = i;
        R[(size_t)i] = -1;
        J[(size_t)i] = i >= 1 ? nbr::swap_index(a, n - 1 - i) : -1;
    }
    int rounds = 0;
    *tail = 0;
    bool left = n > 1;
    for (int r = 0; r < grid_rounds && left; r++) { // kernels of later rounds return at once
        rounds++;
        for (int64_t i = 0; i < n; i++) nbr::rp_reserve(J.data(), R.data(), i);
        for (int64_t i = n - 1; i >= 0; i--) nbr::rp_commit(p, J.data(), R.data(), i);
        left = false;
        for (int64_t i = 0; i < n; i++) left |= nbr::rp_clear(J.data(), R.data(), i);
    }
    while (left) { // rp_tail_kernel
        if (++rounds > n) return -1;
        ++*tail;
        for (int64_t i = n - 1; i >= 0; i--) nbr::rp_reserve(J.data(), R.data(), i);
        for (int64_t i = 0; i < n; i++) nbr::rp_commit(p, J.data(), R.data(), i);
        left = false;
        for (int64_t i = n - 1; i >= 0; i--) left |= nbr::rp_clear(J.data(), R.data(), i);
    }
    return rounds;
}

void check_randperm(cuhost *t) {
    const int64_t sizes[] = {1, 2, 3, 10, 1000, 4097, 100003};
    const uint64_t seeds[] = {0, 1, 123456789};
    const uint64_t offsets[] = {0, 5, 0xFFFFFFFFull};
    for (int64_t n : sizes)
        for (uint64_t seed : seeds)
            for (uint64_t off : offsets) {
                std::vector<int64_t> p1((size_t)n), p2((size_t)n);
                nb__randperm_args a = {};
                a.n = n, a.seed = seed, a.stream = 3, a.offset = off;
                a.out = p1.data();
                nb_status st = cuhost_cpu()->randperm(&a);
                // the kernel's round count, and 3 grid rounds (the tail does the rest)
                for (int few = 0; few < 2; few++) {
                    a.out = p2.data();
                    int tail = 0;
                    int rounds = emulate_randperm(&a, few ? 3 : nbr::rp_grid_rounds(n), &tail);
                    CUHOST_CHECK(t, st == NB_OK && p1 == p2,
                                 "randperm n %lld seed %llu offset %llu grid rounds %d (%d "
                                 "rounds, %d in the tail)", (long long)n,
                                 (unsigned long long)seed, (unsigned long long)off,
                                 few ? 3 : nbr::rp_grid_rounds(n), rounds, tail);
                    if (!few)
                        CUHOST_CHECK(t, tail == 0, "randperm n %lld: %d rounds in the tail",
                                     (long long)n, tail);
                    if (few && n > 1000) CUHOST_CHECK(t, tail > 0, "randperm: no tail rounds");
                }
            }
}

void check_sincos(cuhost *t) {
    double worst = 0;
    for (uint64_t k = 0; k < 200000; k++) {
        uint32_t w = (uint32_t)(k * 2654435761u) ^ (uint32_t)(k >> 3);
        double tt = nbr::mul(nbr::kTwoPi, (double)w * nbr::kInv32), s, c;
        nbr::sincos_small(tt, &s, &c);
        double es = sin(tt), ec = cos(tt);
        // relative to the larger of |sin|, |cos| (the scale the product r * z is used at)
        double us = fabs(s - es) / (fabs(es) > 1e-300 ? fabs(es) : 1e-300) / 0x1p-52;
        double uc = fabs(c - ec) / (fabs(ec) > 1e-300 ? fabs(ec) : 1e-300) / 0x1p-52;
        double u = us > uc ? us : uc;
        if (u > worst) worst = u;
    }
    CUHOST_CHECK(t, worst <= 4, "sincos_small: worst error %.2f ulp against glibc (host sincospi)",
                 worst);
}

}  // namespace

void cuhost_random(cuhost *t) {
    check_random(t);
    check_randperm(t);
    check_sincos(t);
}
