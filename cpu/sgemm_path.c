/* cpu/sgemm_path.c - which f32 GEMM path this machine runs by default (cpu/sgemm.h,
 * nb__sgemm_choose_packed): nabla's packed GEMM (cpu/sgemm.c) or the tiles of provider calls
 * (cpu/gemm.c). Asked once per process, on the first f32 GEMM, unless NB_SGEMM chose.
 *
 * The CPU's features decide where measurements said which is faster (docs/threads.md, "Which
 * f32 path"):
 *   - no packed kernel in this build: the tiles;
 *   - the provider's kernels are not AVX-512 here (an AVX2 CPU such as AMD Zen 3, oneDNN
 *     held to AVX2 by ONEDNN_MAX_CPU_ISA, or the openblas provider on its Haswell core):
 *     packed (oneDNN's AVX2 tiles ran W1's GEMMs at 0.66x of it, OpenBLAS's at ~1.0x on one
 *     thread, and both repack per tile where packed shares one packing among the threads);
 *   - AMD family 19h with AVX-512 (Zen 4, whose 512-bit instructions run as two 256-bit
 *     halves): packed (1.13x the speed of oneDNN's AVX-512 tiles on W1's GEMMs, 1.07x on
 *     W3's, one thread);
 *   - AMD family 1Ah (Zen 5, full 512-bit units): the tiles (the packed GEMM took 0.93-1.14x
 *     their time on the workloads there).
 * Elsewhere (an Intel CPU with AVX-512, a newer AMD) a short calibration runs: the GEMMs of a
 * small training step, on one thread, both paths alternated, about 0.1 s; packed wins only
 * by more than 3 %. Its answer is cached per CPU and build in a file, so that every later
 * process on the machine takes the same path, and gives the same bits, without measuring
 * again: $NB_CACHE_DIR, else $XDG_CACHE_HOME/nabla, else $HOME/.cache/nabla, file
 * sgemm-path (one line "key packed|tiles" per CPU; delete it to measure again). Where no
 * cache can be written the answer holds for this process only. NB_SGEMM=measure takes this
 * cached measurement on any CPU, the rules above aside. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "nabla/runtime.h"

#include "cpu/cpu_impl.h"
#include "cpu/gemm.h"
#include "cpu/sgemm.h"
#include "nb_config.h"

#if NB_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#include "cpu/dnnl_dl.h" /* oneDNN, opened on first use */
#endif

typedef struct {
    char vendor[13];
    unsigned family, model, stepping;
} cpu_id;

static cpu_id identify(void) {
    cpu_id c = {.vendor = "unknown"};
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, cc, d;
    if (__get_cpuid(0, &a, &b, &cc, &d)) {
        memcpy(c.vendor, &b, 4), memcpy(c.vendor + 4, &d, 4), memcpy(c.vendor + 8, &cc, 4);
        c.vendor[12] = 0;
    }
    if (__get_cpuid(1, &a, &b, &cc, &d)) {
        unsigned fam = (a >> 8) & 0xf, mod = (a >> 4) & 0xf;
        if (fam == 0xf) fam += (a >> 20) & 0xff;
        if (fam == 0x6 || fam >= 0xf) mod |= ((a >> 16) & 0xf) << 4;
        c.family = fam, c.model = mod, c.stepping = a & 0xf;
    }
#endif
    return c;
}

/* 512 when the current provider's kernels run AVX-512 here, else 256 (OpenBLAS: the
 * Haswell core this project's environment pins it to). */
static int provider_vector_bits(void) {
#if NB_HAVE_DNNL
    if (nb_gemm_provider_current() == NB_GEMM_DNNL && nb__dnnl_ok()) {
        unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
        unsigned avx512 = (unsigned)dnnl_cpu_isa_avx512_core;
        return (isa & avx512) == avx512 ? 512 : 256;
    }
#endif
    return 256;
}

/* ---- the calibration ------------------------------------------------------------------------ */
typedef struct {
    int64_t M, N, K;
    bool ta, tb;
} cal_shape;

/* A W3-like layer on 512 rows: forward (NT), input gradient (NN), weight gradient (TN). */
static const cal_shape cal_shapes[] = {
    {512, 768, 256, false, true}, {512, 256, 768, false, false}, {768, 256, 512, true, false}};

typedef struct {
    float *a, *b, *c;
    double t[2]; /* best seconds of one pass over the shapes: tiles, packed */
    bool failed;
} cal_job;

static double thread_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double cal_pass(cal_job *j, bool packed) {
    double t0 = thread_seconds();
    for (size_t i = 0; i < sizeof cal_shapes / sizeof cal_shapes[0]; i++) {
        const cal_shape *s = &cal_shapes[i];
        int64_t lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
        nb_status st = packed ? nb__sgemm_packed(s->ta, s->tb, s->M, s->N, s->K, 1.0f, j->a, lda,
                                                 j->b, ldb, 0.0f, j->c, s->N)
                              : nb__sgemm_tiles(s->ta, s->tb, s->M, s->N, s->K, 1.0f, j->a, lda,
                                                j->b, ldb, 0.0f, j->c, s->N);
        if (st != NB_OK) j->failed = true;
    }
    return thread_seconds() - t0;
}

/* Runs as the one task of a job: inside a task every GEMM runs on this thread alone, so
 * the timing is one thread's work whatever the thread count (and the answer too). */
static void cal_task(int64_t t, void *ctx) {
    (void)t;
    cal_job *j = ctx;
    j->t[0] = j->t[1] = 1e30;
    for (int r = 0; r < 4; r++) /* the first round warms up (packing buffers, primitives) */
        for (int p = 0; p < 2; p++) {
            double s = cal_pass(j, p == 1);
            if (r > 0 && s < j->t[p]) j->t[p] = s;
        }
}

bool nb__sgemm_calibrate(double *tiles_s, double *packed_s) {
    size_t n = (size_t)768 * 512;
    cal_job j = {.a = malloc(sizeof(float) * n), .b = malloc(sizeof(float) * n),
                 .c = malloc(sizeof(float) * n)};
    bool packed = false;
    if (j.a && j.b && j.c && nb__sgemm_packed_available()) {
        uint32_t x = 12345;
        for (size_t i = 0; i < n; i++) {
            x = x * 1664525u + 1013904223u;
            j.a[i] = (float)(x >> 9) * (1.0f / 8388608.0f) - 0.5f;
            j.b[i] = j.a[(i * 7919) % n];
        }
        nb__run_tasks(1, 1, cal_task, &j);
        packed = !j.failed && j.t[1] * 1.03 < j.t[0];
        if (tiles_s) *tiles_s = j.t[0];
        if (packed_s) *packed_s = j.t[1];
    }
    free(j.a), free(j.b), free(j.c);
    return packed;
}

/* ---- the cache ------------------------------------------------------------------------------ */
static bool cache_dir(char *buf, size_t len) {
    const char *d = getenv("NB_CACHE_DIR");
    if (d && *d) return snprintf(buf, len, "%s", d) < (int)len;
    d = getenv("XDG_CACHE_HOME");
    if (d && *d) return snprintf(buf, len, "%s/nabla", d) < (int)len;
    d = getenv("HOME");
    if (d && *d) return snprintf(buf, len, "%s/.cache/nabla", d) < (int)len;
    return false;
}

/* mkdir -p of an absolute or relative path (existing parts are fine). */
static bool make_dirs(char *path) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        int r = mkdir(path, 0755);
        *p = '/';
        if (r != 0 && errno != EEXIST) return false;
    }
    return mkdir(path, 0755) == 0 || errno == EEXIST;
}

/* The key: the CPU, the packed kernel's and the provider's instruction sets, the version. */
static void cache_key(const cpu_id *c, char *key, size_t len) {
    snprintf(key, len, "%s-%x-%x-%x/%s/%s%d/%s", c->vendor, c->family, c->model, c->stepping,
             nb__sgemm_packed_isa(), nb_gemm_provider_name(nb_gemm_provider_current()),
             provider_vector_bits(), nb_version());
}

/* 1 packed, 0 tiles, -1 not in the cache. */
static int cache_read(const char *file, const char *key) {
    FILE *f = fopen(file, "r");
    if (!f) return -1;
    char line[512];
    int v = -1;
    size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ' ')
            v = !strncmp(line + kl + 1, "packed", 6) ? 1 : 0; /* the last line wins */
    fclose(f);
    return v;
}

static void cache_write(char *dir, const char *file, const char *key, bool packed) {
    if (!make_dirs(dir)) return;
    int fd = open(file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char line[512];
    int n = snprintf(line, sizeof line, "%s %s\n", key, packed ? "packed" : "tiles");
    if (n > 0 && n < (int)sizeof line) {
        ssize_t w = write(fd, line, (size_t)n); /* one append: whole lines even when racing */
        (void)w;
    }
    close(fd);
}

bool nb__sgemm_measured_packed(void) {
    if (!nb__sgemm_packed_available()) return false;
    cpu_id c = identify();
    char dir[400], file[480], key[256];
    cache_key(&c, key, sizeof key);
    bool have_dir = cache_dir(dir, sizeof dir);
    if (have_dir) {
        snprintf(file, sizeof file, "%s/sgemm-path", dir);
        int v = cache_read(file, key);
        if (v >= 0) return v;
    }
    bool packed = nb__sgemm_calibrate(NULL, NULL);
    if (have_dir) cache_write(dir, file, key, packed);
    return packed;
}

bool nb__sgemm_choose_packed(void) {
    if (!nb__sgemm_packed_available()) return false;
    if (provider_vector_bits() < 512) return true;
    cpu_id c = identify();
    bool amd = !strcmp(c.vendor, "AuthenticAMD");
    if (amd && c.family == 0x19) return true;
    if (amd && c.family == 0x1a) return false;
    return nb__sgemm_measured_packed();
}
