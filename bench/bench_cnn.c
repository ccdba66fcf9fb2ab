/* bench_cnn.c - the kernels of one W2 training step (models/cnn, batch 128) timed one by one:
 * the two convolutions forward and backward, the two ReLU + 2x2 max-pool stages forward and
 * backward, each called straight through its CPU kernel with the step's shapes, round-robin
 * (one call of each per round) so drift on the host hits all alike. Prints the median wall
 * time of each kernel in ms and the share of their sum.
 *
 *     bench_cnn [--threads N] [--rounds R]     (NB_CONV=im2col|dnnl picks the conv path) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nabla/nabla.h"

#include "tensor/backend.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static float *fbuf(int64_t n) {
    float *p = malloc(sizeof(float) * (size_t)n);
    if (!p) exit(1);
    uint64_t s = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        p[i] = (float)((double)((s * 2685821657736338717ull) >> 11) / 9007199254740992.0 - 0.5);
    }
    return p;
}

enum { B = 128 };
static nb__conv2d_geom g1 = {B, 1, 28, 28, 32, 3, 3, 28, 28, 1, 1, 1, 1, 1, 1, 1};
static nb__conv2d_geom g2 = {B, 32, 14, 14, 64, 3, 3, 14, 14, 1, 1, 1, 1, 1, 1, 1};
static nb__pool2d_geom p1 = {B * 32, 28, 28, 14, 14, 2, 2, 2, 2, 0, 0};
static nb__pool2d_geom p2 = {B * 64, 14, 14, 7, 7, 2, 2, 2, 2, 0, 0};

static float *x1, *w1, *b1, *y1, *gy1, *gw1, *gb1;
static float *x2, *w2, *b2, *y2, *gy2, *gx2, *gw2, *gb2;
static float *py1, *pgy1, *pgx1, *py2, *pgy2, *pgx2;
static int32_t *pi1, *pi2;

static nb_status k_conv1(void) {
    nb__conv2d_args a = {.g = g1, .dtype = NB_F32, .x = x1, .w = w1, .b = b1, .y = y1};
    return nb__run_conv2d(NB_CPU, "conv1", &a);
}
static nb_status k_conv1_bwd(void) {
    nb__conv2d_backward_args a = {.g = g1, .dtype = NB_F32, .x = x1, .w = w1, .gy = gy1,
                                  .gw = gw1, .gb = gb1};
    return nb__run_conv2d_backward(NB_CPU, "conv1 backward", &a);
}
static nb_status k_conv2(void) {
    nb__conv2d_args a = {.g = g2, .dtype = NB_F32, .x = x2, .w = w2, .b = b2, .y = y2};
    return nb__run_conv2d(NB_CPU, "conv2", &a);
}
static nb_status k_conv2_bwd(void) {
    nb__conv2d_backward_args a = {.g = g2, .dtype = NB_F32, .x = x2, .w = w2, .gy = gy2,
                                  .gx = gx2, .gw = gw2, .gb = gb2};
    return nb__run_conv2d_backward(NB_CPU, "conv2 backward", &a);
}
static nb_status k_conv2_bwd_data(void) {
    nb__conv2d_backward_args a = {.g = g2, .dtype = NB_F32, .w = w2, .gy = gy2, .gx = gx2};
    return nb__run_conv2d_backward(NB_CPU, "conv2 backward", &a);
}
static nb_status k_conv2_bwd_w(void) {
    nb__conv2d_backward_args a = {.g = g2, .dtype = NB_F32, .x = x2, .gy = gy2, .gw = gw2,
                                  .gb = gb2};
    return nb__run_conv2d_backward(NB_CPU, "conv2 backward", &a);
}
static nb_status k_pool1(void) {
    nb__pool2d_args a = {.g = p1, .dtype = NB_F32, .x = y1, .y = py1, .idx = pi1};
    return nb__run_maxpool2d(NB_CPU, "pool1", &a);
}
static nb_status k_pool1_bwd(void) {
    nb__pool2d_backward_args a = {.g = p1, .dtype = NB_F32, .gy = pgy1, .idx = pi1, .gx = pgx1};
    return nb__run_maxpool2d_backward(NB_CPU, "pool1 backward", &a);
}
static nb_status k_pool2(void) {
    nb__pool2d_args a = {.g = p2, .dtype = NB_F32, .x = y2, .y = py2, .idx = pi2};
    return nb__run_maxpool2d(NB_CPU, "pool2", &a);
}
static nb_status k_pool2_bwd(void) {
    nb__pool2d_backward_args a = {.g = p2, .dtype = NB_F32, .gy = pgy2, .idx = pi2, .gx = pgx2};
    return nb__run_maxpool2d_backward(NB_CPU, "pool2 backward", &a);
}

int main(int argc, char **argv) {
    int threads = 2, rounds = 15;
    for (int i = 1; i < argc; i++) {
        if (!strncmp(argv[i], "--threads", 9) && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strncmp(argv[i], "--rounds", 8) && i + 1 < argc) rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_cnn [--threads N] [--rounds R]\n");
            return 2;
        }
    }
    nb_set_num_threads(threads);
    x1 = fbuf(B * 784), w1 = fbuf(32 * 9), b1 = fbuf(32), y1 = fbuf(B * 32 * 784);
    gy1 = fbuf(B * 32 * 784), gw1 = fbuf(32 * 9), gb1 = fbuf(32);
    x2 = fbuf(B * 32 * 196), w2 = fbuf(64 * 288), b2 = fbuf(64), y2 = fbuf(B * 64 * 196);
    gy2 = fbuf(B * 64 * 196), gx2 = fbuf(B * 32 * 196), gw2 = fbuf(64 * 288), gb2 = fbuf(64);
    py1 = fbuf(B * 32 * 196), pgy1 = fbuf(B * 32 * 196), pgx1 = fbuf(B * 32 * 784);
    py2 = fbuf(B * 64 * 49), pgy2 = fbuf(B * 64 * 49), pgx2 = fbuf(B * 64 * 196);
    pi1 = calloc(B * 32 * 196, 4), pi2 = calloc(B * 64 * 49, 4);
    static const struct {
        const char *name;
        nb_status (*fn)(void);
    } ks[] = {{"conv1 forward", k_conv1},     {"conv1 backward (w, b)", k_conv1_bwd},
              {"conv2 forward", k_conv2},     {"conv2 backward (x, w, b)", k_conv2_bwd},
              {"conv2 backward x", k_conv2_bwd_data}, {"conv2 backward w, b", k_conv2_bwd_w},
              {"pool1 forward", k_pool1},     {"pool1 backward", k_pool1_bwd},
              {"pool2 forward", k_pool2},     {"pool2 backward", k_pool2_bwd}};
    enum { NK = sizeof ks / sizeof ks[0] };
    double *t = calloc((size_t)(NK * rounds), sizeof(double));
    double *tc = calloc((size_t)(NK * rounds), sizeof(double));
    for (int r = -2; r < rounds; r++)
        for (int k = 0; k < NK; k++) {
            double t0 = now_s(), c0 = cpu_s();
            if (ks[k].fn() != NB_OK) {
                fprintf(stderr, "bench_cnn: %s: %s\n", ks[k].name, nb_last_error());
                return 1;
            }
            if (r >= 0) t[k * rounds + r] = now_s() - t0, tc[k * rounds + r] = cpu_s() - c0;
        }
    printf("bench_cnn: %d threads, %d rounds, median ms per call (batch %d): wall, process CPU\n",
           threads, rounds, B);
    double sw = 0, sc = 0;
    for (int k = 0; k < NK; k++) {
        qsort(t + k * rounds, (size_t)rounds, sizeof(double), cmp_double);
        qsort(tc + k * rounds, (size_t)rounds, sizeof(double), cmp_double);
        double w = 1e3 * t[k * rounds + rounds / 2], c = 1e3 * tc[k * rounds + rounds / 2];
        printf("  %-26s %8.3f %8.3f\n", ks[k].name, w, c);
        if (k != 4 && k != 5) sw += w, sc += c;
    }
    printf("  %-26s %8.3f %8.3f\n", "sum (a step's calls)", sw, sc);
    return 0;
}
