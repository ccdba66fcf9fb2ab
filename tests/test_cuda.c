/* test_cuda.c - the "cuda" suite: the nabla/cuda.h API in every build.
 *
 * Without a usable GPU (a build without CUDA, or a CUDA build on a machine without driver or
 * device) it checks that the device count is 0 and that every call fails cleanly with the
 * right status and a message saying why. With a GPU (CUDA build and nb_cuda_device_count()
 * > 0) it also checks the device calls, the caching allocator (reuse, statistics, no
 * cudaMalloc after warm-up, stream rules), copies in both directions, the fill/add kernels
 * and cuBLAS GEMM against CPU references, streams and per-thread state. The GPU tests
 * return early when no GPU is usable, so the suite passes on any machine.
 *
 * CUDA must not be initialized before Check forks a test (a CUDA context does not survive
 * fork), so nothing here touches CUDA while building the suite. */
#include <float.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nabla/cuda.h"
#include "nb_config.h"
#include "nb_cuda_paths.h"
#include "testutil.h"

#include "cuda/backend.h"
#include "cuda/plugin.h"
#include "tensor/backend.h"

/* NB__CUDA_PLUGIN_ABI as text, for the loader's messages */
#define ABI_TEXT_(x) #x
#define ABI_TEXT(x) ABI_TEXT_(x)
#define ABI_STR ABI_TEXT(NB__CUDA_PLUGIN_ABI)

#if NB_HAVE_CUDA
#include <dlfcn.h>
#include <pthread.h>

#define NO_GPU_STATUS NB_EDEVICE
#define NO_GPU_TEXT "no usable GPU"
#else
#define NO_GPU_STATUS NB_EUNSUPPORTED
#define NO_GPU_TEXT "built without CUDA"
#endif

/* Check's ck_assert records every passing check; loops use these, which only call into
 * Check on failure. */
#define REQUIRE(cond, ...)                                                                 \
    do {                                                                                   \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                            \
    } while (0)
#define REQ(cond) REQUIRE(cond, "%s:%d: check failed: %s", __FILE__, __LINE__, #cond)

/* A call returning nb_status failed with status and a message containing needle. */
#define expect_status(call, status, needle) \
    expect_status_at((call), (status), (needle), #call, __FILE__, __LINE__)
static void expect_status_at(nb_status got, nb_status want, const char *needle,
                             const char *call, const char *file, int line) {
    ck_assert_msg(got == want, "%s:%d: %s returned %s, expected %s (%s)", file, line, call,
                  nb_status_name(got), nb_status_name(want), nb_last_error());
    ck_assert_msg(nb_last_status() == want, "%s:%d: %s: last status %s, expected %s", file,
                  line, call, nb_status_name(nb_last_status()), nb_status_name(want));
    if (needle)
        ck_assert_msg(strstr(nb_last_error(), needle) != NULL,
                      "%s:%d: %s: message \"%s\" lacks \"%s\"", file, line, call,
                      nb_last_error(), needle);
    nb_clear_error();
}
#define expect_ok(call)                                                                    \
    do {                                                                                   \
        nb_status st_ = (call);                                                            \
        ck_assert_msg(st_ == NB_OK, "%s:%d: %s failed: %s (%s)", __FILE__, __LINE__,       \
                      #call, nb_status_name(st_), nb_last_error());                        \
    } while (0)

/* ---- every build ---------------------------------------------------------------------------- */
START_TEST(test_cuda_build) {
    nb_scope_begin();
    nb_clear_error();
    int n = nb_cuda_device_count();
    /* Counting is never an error, whatever the machine. */
    ck_assert_int_eq(nb_last_status(), NB_OK);
    ck_assert_int_ge(n, 0);
    ck_assert_int_eq(nb_cuda_device_count(), n);
    ck_assert(nb_cuda_is_available() == (n > 0));
    ck_assert(nb_has_cuda() == (NB_HAVE_CUDA != 0));
    if (!NB_HAVE_CUDA) ck_assert_int_eq(n, 0);
    if (n == 0) fprintf(stderr, "cuda suite: no usable GPU, GPU checks skipped\n");
    nb_scope_end();
}
END_TEST


/* ---- the plugin loader (cuda/loader.c), every build ---------------------------------------- */
/* Point NB_CUDA_PLUGIN at path (NULL: unset) and make the loader try again. False when the
 * plugin is already loaded in this process (tests not forked): the caller skips. */
#define NB_CUDA_PLUGIN_VAR "NB_CUDA_PLUGIN"
static char *g_saved_env; /* NB_CUDA_PLUGIN before the test changed it ("" : unset) */
static bool plugin_retry_with(const char *path) {
    if (!nb__cuda_plugin_forget_failure()) {
        fprintf(stderr, "cuda suite: the plugin is loaded in this process (CK_FORK=no?): "
                        "plugin loader checks skipped\n");
        return false;
    }
    if (!g_saved_env) {
        const char *e = getenv(NB_CUDA_PLUGIN_VAR);
        g_saved_env = strdup(e ? e : "");
    }
    if (path) setenv(NB_CUDA_PLUGIN_VAR, path, 1);
    else unsetenv(NB_CUDA_PLUGIN_VAR);
    return true;
}

/* Put NB_CUDA_PLUGIN back as it was and let the loader try again (for CK_FORK=no runs). */
static void plugin_restore(void) {
    if (!g_saved_env) return;
    if (*g_saved_env) setenv(NB_CUDA_PLUGIN_VAR, g_saved_env, 1);
    else unsetenv(NB_CUDA_PLUGIN_VAR);
    free(g_saved_env);
    g_saved_env = NULL;
    (void)nb__cuda_plugin_forget_failure();
}

/* NB_CUDA_PLUGIN pointing nowhere: error values naming the path and dlopen's reason, the
 * device count 0 without an error, CUDA tensors refused; nothing aborts. */
START_TEST(test_cuda_plugin_missing) {
    nb_scope_begin();
    if (!plugin_retry_with("/nonexistent/libnabla-cuda.so")) goto done;
    nb_clear_error();
    ck_assert_int_eq(nb_cuda_device_count(), 0);
    ck_assert_int_eq(nb_last_status(), NB_OK);
    ck_assert(!nb_cuda_is_available());
    void *r = nb_cuda_alloc(64, 0);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nb_last_error());
    tu_assert_error(r, NB_EUNSUPPORTED, "cuda_alloc: CUDA support is not installed: ");
    ck_assert_ptr_nonnull(strstr(msg, "/nonexistent/libnabla-cuda.so (from NB_CUDA_PLUGIN)"));
    ck_assert_ptr_nonnull(strstr(msg, "No such file")); /* dlerror's text */
    expect_status(nb_cuda_set_device(0), NB_EUNSUPPORTED, "CUDA support is not installed");
    expect_status(nb_cuda_memcpy_h2d(NULL, NULL, 0), NB_EUNSUPPORTED, "not installed");
    tu_assert_error(nb_zeros_on(NB_CUDA(0), (int64_t[]){4}, 1, NB_F32), NB_EUNSUPPORTED,
                    "cuda:0: CUDA support is not installed");
    ck_assert_ptr_null(nb__cuda_kernels());
    ck_assert_int_eq(nb__cuda_cudnn_version(), -1);
    ck_assert_int_eq(nb__cuda_nccl_version(), -1);
    tu_assert_error(nb_cuda_libraries(), NB_EUNSUPPORTED, "cuda_libraries: CUDA support is not installed");
    nb_clear_error();
    ck_assert_int_eq(nb_cuda_empty_cache(), NB_OK);
    ck_assert_int_eq(nb_cuda_free(NULL), NB_OK);
    ck_assert_str_eq(nb__cuda_plugin_path(), "");
    /* The failure is kept: a second call answers the same without a new search. */
    tu_assert_error(nb_cuda_stream_new(0), NB_EUNSUPPORTED, "/nonexistent/libnabla-cuda.so");
done:
    plugin_restore();
    nb_scope_end();
}
END_TEST

/* Files that are not the plugin: a text file (dlopen refuses it), a real library without
 * the entry point. */
START_TEST(test_cuda_plugin_wrong_file) {
    nb_scope_begin();
    if (!plugin_retry_with(NB_SOURCE_DIR "/README.md")) goto done;
    void *r = nb_cuda_alloc(64, 0);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nb_last_error());
    tu_assert_error(r, NB_EUNSUPPORTED, "README.md (from NB_CUDA_PLUGIN)");
    ck_assert_msg(strstr(msg, "invalid ELF header"), "%s", msg); /* dlerror's text */
    if (!plugin_retry_with("libz.so.1")) goto done;
    tu_assert_error(nb_cuda_stream_default(0), NB_EUNSUPPORTED,
                    "libz.so.1 (from NB_CUDA_PLUGIN) is not a nabla CUDA plugin");
done:
    plugin_restore();
    nb_scope_end();
}
END_TEST

/* Plugins that load but do not fit: refused with the reason, never used. */
START_TEST(test_cuda_plugin_mismatch) {
    nb_scope_begin();
    static const struct {
        const char *mode, *needle;
    } cases[] = {
        {"refuse", "cannot be used: libnabla (nabla " NB_VERSION_STRING ") does not match the fake plugin"},
        {"version", "cannot be used: the plugin (nabla 0.0.0-other, abi " ABI_STR ") does not match libnabla"},
        {"null", "cannot be used: its init failed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("FAKE_CUDA_PLUGIN", cases[i].mode, 1);
        if (!plugin_retry_with(NB_TEST_FAKE_PLUGIN)) goto done;
        nb_clear_error();
        ck_assert_int_eq(nb_cuda_device_count(), 0);
        ck_assert_int_eq(nb_last_status(), NB_OK);
        void *r = nb_cuda_alloc(64, 0);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", nb_last_error());
        tu_assert_error(r, NB_EUNSUPPORTED, "fake-cuda-plugin");
        ck_assert_msg(strstr(msg, cases[i].needle), "%s: \"%s\" lacks \"%s\"", cases[i].mode,
                      msg, cases[i].needle);
    }
done:
    unsetenv("FAKE_CUDA_PLUGIN");
    plugin_restore();
    nb_scope_end();
}
END_TEST

/* No NB_CUDA_PLUGIN: the search next to the program (this one links libnabla statically,
 * so next to nabla_tests) and in the install libdir; the message lists both. */
START_TEST(test_cuda_plugin_search) {
    nb_scope_begin();
    if (access(NB_CUDA_PLUGIN_LIBDIR "/libnabla-cuda.so", F_OK) == 0) {
        fprintf(stderr, "cuda suite: a plugin is installed in %s: search check skipped\n",
                NB_CUDA_PLUGIN_LIBDIR);
        goto done;
    }
    if (!plugin_retry_with(NULL)) goto done;
    nb_cuda_stream *r = nb_cuda_stream_new(0);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", nb_last_error());
    tu_assert_error(r, NB_EUNSUPPORTED,
                    NB_HAVE_CUDA ? "CUDA support is not installed: libnabla-cuda.so not found "
                                   "(looked in "
                                 : "built without CUDA");
    if (NB_HAVE_CUDA) {
        ck_assert_msg(strstr(msg, "/tests, " NB_CUDA_PLUGIN_LIBDIR "; set NB_CUDA_PLUGIN)"),
                      "%s", msg);
    }
done:
    plugin_restore();
    nb_scope_end();
}
END_TEST

#if NB_HAVE_CUDA
/* The plugin's NCCL entries (docs/cuda.md "NCCL"): NCCL's version exactly when meson linked
 * NCCL; ncclGetUniqueId needs no GPU; without a GPU (or without NCCL) a communicator is an
 * error value, and NULL handles are refused. */
static void check_plugin_nccl(const nb__cuda_plugin *p) {
    long v = nb__cuda_nccl_version();
    ck_assert_int_eq(v, p->nccl_version());
    unsigned char id[NB__NCCL_ID_BYTES], zero[NB__NCCL_ID_BYTES] = {0};
    memset(id, 0, sizeof id);
    if (NB_HAVE_NCCL) {
        ck_assert_int_ge(v, 21000); /* 2.28.9 is 22809 */
        ck_assert_ptr_nonnull(strstr(p->libraries, "NCCL "));
        ck_assert_msg(p->nccl_unique_id(id) == NB_OK, "%s", nb_last_error());
        ck_assert(memcmp(id, zero, sizeof id) != 0);
    } else {
        ck_assert_int_eq(v, 0);
        ck_assert_ptr_nonnull(strstr(p->libraries, "no NCCL"));
        expect_status(p->nccl_unique_id(id), NB_EUNSUPPORTED, "built without NCCL");
    }
    if (nb_cuda_device_count() == 0) {
        nb__nccl_comm *c = p->nccl_comm_new(0, 2, 0, id);
        ck_assert_ptr_null(c);
        tu_assert_error(c, NB_HAVE_NCCL ? NB_EDEVICE : NB_EUNSUPPORTED,
                        NB_HAVE_NCCL ? "nccl_comm_new: no usable GPU" : "built without NCCL");
    }
    nb_clear_error();
    expect_status((nb_status)p->nccl_comm_poll(NULL),
                  NB_HAVE_NCCL ? NB_ENULL : NB_EUNSUPPORTED, "nccl");
    tu_assert_error(p->nccl_start(NULL, NULL, 0), NB_HAVE_NCCL ? NB_ENULL : NB_EUNSUPPORTED,
                    "nccl");
    p->nccl_comm_abort(NULL); /* nothing to do, no crash */
    p->nccl_comm_free(NULL, 0);
    p->nccl_op_free(NULL);
    nb_clear_error();
}

/* This build's plugin (tests/main.c points NB_CUDA_PLUGIN at it) loads without a GPU and
 * says what it links; cuDNN's version is there exactly when meson linked cuDNN. */
START_TEST(test_cuda_plugin_loaded) {
    nb_scope_begin();
    const nb__cuda_plugin *p = nb__cuda_plugin_get("test");
    ck_assert_msg(p != NULL, "%s", nb_last_error());
    const char *path = nb__cuda_plugin_path();
    size_t n = strlen(path), k = strlen("/libnabla-cuda.so");
    ck_assert_msg(n > k && strcmp(path + n - k, "/libnabla-cuda.so") == 0, "path %s", path);
    ck_assert_ptr_nonnull(strstr(p->libraries, "CUDA runtime "));
    ck_assert_ptr_nonnull(strstr(p->libraries, "cuBLAS "));
    ck_assert_str_eq(nb_cuda_libraries(), p->libraries); /* the public form */
    long v = nb__cuda_cudnn_version();
    if (NB_HAVE_CUDNN) {
        ck_assert_int_ge(v, 80000); /* 9.19.0 is 91900 */
        ck_assert_ptr_nonnull(strstr(p->libraries, "cuDNN "));
    } else {
        ck_assert_int_eq(v, 0);
    }
    ck_assert_ptr_nonnull(nb__cuda_kernels());
    ck_assert_ptr_nonnull(nb__cuda_kernels()->fill);
    fprintf(stderr, "cuda suite: plugin %s (%s)\n", path, p->libraries);
    check_plugin_nccl(p);

    /* The plugin's own check of libnabla: a host table of another version is refused. */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    ck_assert_msg(h != NULL, "%s", dlerror());
    nb__cuda_plugin_init_fn init = NULL;
    void *sym = dlsym(h, NB__CUDA_PLUGIN_ENTRY);
    memcpy(&init, &sym, sizeof init);
    ck_assert_ptr_nonnull(sym);
    nb__cuda_host bad = {.abi = NB__CUDA_PLUGIN_ABI, .size = sizeof bad, .version = "9.9.9",
                         .kernels_size = sizeof(nb__kernels)};
    const nb__cuda_plugin *q = p;
    char msg[256];
    ck_assert_int_eq(init(&bad, &q, msg, sizeof msg), NB_EUNSUPPORTED);
    ck_assert_ptr_null(q);
    ck_assert_msg(strstr(msg, "libnabla (nabla 9.9.9, abi " ABI_STR ") does not match the plugin (nabla "
                              NB_VERSION_STRING), "%s", msg);
    bad.version = NB_VERSION_STRING;
    bad.kernels_size = 8;
    ck_assert_int_eq(init(&bad, &q, msg, sizeof msg), NB_EUNSUPPORTED);
    dlclose(h); /* drops this reference only: the loader's keeps it loaded */
    nb_scope_end();
}
END_TEST
#endif

/* Every call fails cleanly when no GPU is usable. */
START_TEST(test_cuda_no_gpu) {
    nb_scope_begin();
    if (nb_cuda_device_count() > 0) {
        nb_scope_end();
        return; /* the GPU tests cover this machine */
    }
    char buf[16] = "garbage";
    float host[4] = {1, 2, 3, 4};
    expect_status(nb_cuda_set_device(0), NO_GPU_STATUS, NO_GPU_TEXT);
    ck_assert_int_eq(nb_cuda_current_device(), -1);
    tu_assert_error(NULL, NO_GPU_STATUS, NO_GPU_TEXT);
    expect_status(nb_cuda_device_name(0, buf, sizeof buf), NO_GPU_STATUS, NO_GPU_TEXT);
    ck_assert_str_eq(buf, "");
    expect_status(nb_cuda_synchronize(), NO_GPU_STATUS, NO_GPU_TEXT);

    tu_assert_error(nb_cuda_stream_new(0), NO_GPU_STATUS, NO_GPU_TEXT);
    tu_assert_error(nb_cuda_stream_new(-1), NO_GPU_STATUS, NO_GPU_TEXT);
    tu_assert_error(nb_cuda_stream_default(-1), NO_GPU_STATUS, NO_GPU_TEXT);
    tu_assert_error(nb_cuda_stream_current(0), NO_GPU_STATUS, NO_GPU_TEXT);
    expect_status(nb_cuda_stream_synchronize(NULL), NO_GPU_STATUS, NO_GPU_TEXT);
    expect_status(nb_cuda_set_stream(NULL), NO_GPU_STATUS, NO_GPU_TEXT);
    expect_status(nb_cuda_stream_wait(NULL, NULL), NO_GPU_STATUS, NO_GPU_TEXT);
    tu_assert_error(nb_cuda_stream_role(0, NB_CUDA_ROLE_COMM), NO_GPU_STATUS, NO_GPU_TEXT);
    tu_assert_error(nb_cuda_stream_role(-1, NB_CUDA_ROLE_COPY), NO_GPU_STATUS, NO_GPU_TEXT);
    /* An unknown role is the caller's mistake, said before the missing GPU. */
    tu_assert_error(nb_cuda_stream_role(0, (nb_cuda_role)7), NB_HAVE_CUDA ? NB_EINVAL : NO_GPU_STATUS,
                    NB_HAVE_CUDA ? "unknown role 7" : NO_GPU_TEXT);
    expect_status(nb_cuda_record_stream(host, NULL), NO_GPU_STATUS, NO_GPU_TEXT);
    nb_cuda_stream_free(NULL); /* no-op, no crash */
    ck_assert_int_eq(nb_cuda_stream_device(NULL), -1);
    ck_assert_ptr_null(nb_cuda_stream_handle(NULL));

    tu_assert_error(nb_cuda_alloc(1024, 0), NO_GPU_STATUS, NO_GPU_TEXT);
    tu_assert_error(nb_cuda_alloc(0, -1), NO_GPU_STATUS, NO_GPU_TEXT);
    nb_clear_error();
    ck_assert_int_eq(nb_cuda_free(NULL), NB_OK);
    ck_assert_int_eq(nb_last_status(), NB_OK);
    /* A pointer the allocator never handed out: an error, not a crash or a free(). */
    ck_assert_int_lt(nb_cuda_free(host), 0);
    nb_clear_error();
    nb_cuda_alloc_stats st;
    memset(&st, 0x5a, sizeof st);
    expect_status(nb_cuda_alloc_get_stats(0, &st), NO_GPU_STATUS, NO_GPU_TEXT);
    ck_assert_int_eq(st.bytes_live, 0);
    ck_assert_int_eq(st.system_allocs, 0);
    expect_status(nb_cuda_alloc_reset_peak(-1), NO_GPU_STATUS, NO_GPU_TEXT);
    /* Nothing is cached, so emptying the cache has nothing to do. */
    ck_assert_int_eq(nb_cuda_empty_cache(), NB_OK);

    expect_status(nb_cuda_memcpy_h2d(host, host, sizeof host), NO_GPU_STATUS, NO_GPU_TEXT);
    expect_status(nb_cuda_memcpy_d2h(host, host, sizeof host), NO_GPU_STATUS, NO_GPU_TEXT);
    expect_status(nb_cuda_memcpy_d2d(host, host, sizeof host), NO_GPU_STATUS, NO_GPU_TEXT);
    expect_status(nb_cuda_memcpy_h2d_async(host, host, 4, NULL), NO_GPU_STATUS, NO_GPU_TEXT);
    expect_status(nb_cuda_memcpy_d2h_async(host, host, 4, NULL), NO_GPU_STATUS, NO_GPU_TEXT);
    expect_status(nb_cuda_memcpy_d2d_async(host, host, 0, NULL), NO_GPU_STATUS, NO_GPU_TEXT);
    ck_assert(host[0] == 1 && host[3] == 4); /* untouched */
#if NB_HAVE_CUDA
    expect_status(nb__cuda_fill_f32((float *)host, 0.0f, 4, NULL), NB_EDEVICE, NO_GPU_TEXT);
    expect_status(nb__cuda_add_f32(host, host, host, 4, NULL), NB_EDEVICE, NO_GPU_TEXT);
    expect_status(nb__cuda_gemm_f32(false, false, 1, 1, 1, 1.0f, host, 1, host, 1, 0.0f,
                                    host, 1, NULL),
                  NB_EDEVICE, NO_GPU_TEXT);
    ck_assert(host[0] == 1 && host[3] == 4);
#endif
    nb_scope_end();
}
END_TEST

#if NB_HAVE_CUDA
/* ---- GPU tests (return early without a GPU) ----------------------------------------------- */
static bool have_gpu(void) { return nb_cuda_device_count() > 0; }

static nb_cuda_alloc_stats stats0(void) {
    nb_cuda_alloc_stats st;
    expect_ok(nb_cuda_alloc_get_stats(0, &st));
    return st;
}

static float *dev_floats(int64_t n) {
    float *p = nb_cuda_alloc((size_t)n * sizeof(float), 0);
    ck_assert_msg(p != NULL, "cuda_alloc of %lld floats: %s", (long long)n, nb_last_error());
    return p;
}

/* n floats in [lo, hi) from a seeded generator (test data). */
static float *host_random(int64_t n, double lo, double hi, uint64_t seed) {
    double *d = malloc((size_t)(n ? n : 1) * sizeof *d);
    float *f = malloc((size_t)(n ? n : 1) * sizeof *f);
    ck_assert(d && f);
    tu_fill_uniform(d, n, lo, hi, seed);
    for (int64_t i = 0; i < n; i++) f[i] = (float)d[i];
    free(d);
    return f;
}

START_TEST(test_cuda_device) {
    nb_scope_begin();
    if (!have_gpu()) goto done;
    int n = nb_cuda_device_count();
    expect_ok(nb_cuda_set_device(0));
    ck_assert_int_eq(nb_cuda_current_device(), 0);
    char name[256];
    expect_ok(nb_cuda_device_name(0, name, sizeof name));
    ck_assert_msg(name[0] != '\0', "empty device name");
    expect_ok(nb_cuda_device_name(-1, name, sizeof name));
    char tiny[4];
    expect_ok(nb_cuda_device_name(0, tiny, sizeof tiny)); /* truncated, terminated */
    ck_assert_int_le((int)strlen(tiny), 3);
    expect_ok(nb_cuda_synchronize());
    for (int d = 0; d < n; d++) {
        expect_ok(nb_cuda_set_device(d));
        ck_assert_int_eq(nb_cuda_current_device(), d);
    }
    expect_ok(nb_cuda_set_device(0));

    /* Bad device indices name the device and the count. */
    expect_status(nb_cuda_set_device(n), NB_EDEVICE, "does not exist");
    expect_status(nb_cuda_set_device(-2), NB_EDEVICE, "does not exist");
    expect_status(nb_cuda_device_name(n, name, sizeof name), NB_EDEVICE, "does not exist");
    expect_status(nb_cuda_device_name(0, NULL, 8), NB_ENULL, "buf");
    tu_assert_error(nb_cuda_alloc(16, n), NB_EDEVICE, "does not exist");
    tu_assert_error(nb_cuda_stream_new(n), NB_EDEVICE, "does not exist");
    tu_assert_error(nb_cuda_stream_default(n + 5), NB_EDEVICE, "does not exist");
    nb_cuda_alloc_stats st;
    expect_status(nb_cuda_alloc_get_stats(n, &st), NB_EDEVICE, "does not exist");
    expect_status(nb_cuda_alloc_get_stats(0, NULL), NB_ENULL, "out");
done:
    nb_scope_end();
}
END_TEST

START_TEST(test_cuda_alloc_reuse) {
    nb_scope_begin();
    if (!have_gpu()) goto done;
    expect_ok(nb_cuda_set_device(0));
    /* Sizes around class edges: 0..512 share the smallest class; 513 is the next one. */
    static const size_t sizes[] = {0, 1, 511, 512, 513, 640, 641, 4096, 100000, 1 << 20,
                                   (3 << 20) + 7};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *p[N];
    expect_ok(nb_cuda_empty_cache());
    nb_cuda_alloc_stats a = stats0();
    ck_assert_int_eq(a.bytes_cached, 0);

    /* Warm-up: all live at once, so each is a fresh cudaMalloc. */
    int64_t requested = 0;
    for (int i = 0; i < N; i++) {
        p[i] = nb_cuda_alloc(sizes[i], 0);
        ck_assert_msg(p[i] != NULL, "alloc %zu: %s", sizes[i], nb_last_error());
        ck_assert_msg((uintptr_t)p[i] % 256 == 0, "block %p is not 256-byte aligned", p[i]);
        for (int j = 0; j < i; j++) ck_assert_ptr_ne(p[i], p[j]);
        requested += (int64_t)(sizes[i] ? sizes[i] : 1);
    }
    nb_cuda_alloc_stats b = stats0();
    ck_assert_int_eq(b.system_allocs - a.system_allocs, N);
    ck_assert_int_eq(b.allocs - a.allocs, N);
    ck_assert_int_ge(b.bytes_live - a.bytes_live, requested);
    /* Size classes waste at most 25% (plus the 512-byte minimum). */
    ck_assert_int_le(b.bytes_live - a.bytes_live, requested + requested / 4 + N * 512);
    ck_assert_int_ge(b.bytes_peak, b.bytes_live);
    for (int i = 0; i < N; i++) expect_ok(nb_cuda_free(p[i]));
    nb_cuda_alloc_stats c = stats0();
    ck_assert_int_eq(c.bytes_live, a.bytes_live);
    ck_assert_int_eq(c.bytes_cached, b.bytes_live - a.bytes_live);
    ck_assert_int_eq(c.system_frees, a.system_frees);

    /* Steady state: the same pattern again and again makes no cudaMalloc. */
    for (int it = 0; it < 20; it++) {
        for (int i = 0; i < N; i++) REQ((p[i] = nb_cuda_alloc(sizes[i], 0)) != NULL);
        for (int i = N - 1; i >= 0; i--) REQ(nb_cuda_free(p[i]) == NB_OK);
    }
    nb_cuda_alloc_stats d = stats0();
    ck_assert_int_eq(d.system_allocs, b.system_allocs);
    ck_assert_int_eq(d.allocs - b.allocs, 20 * N);
    ck_assert_int_eq(d.bytes_live, a.bytes_live);
    ck_assert_int_eq(d.bytes_cached, c.bytes_cached);
    ck_assert_int_eq(d.bytes_peak, b.bytes_peak);

    /* A freed block is handed out again for the same class (LIFO). */
    void *x = nb_cuda_alloc(700, 0);
    expect_ok(nb_cuda_free(x));
    void *y = nb_cuda_alloc(720, 0); /* same class as 700 (641..768) */
    ck_assert_ptr_eq(x, y);
    expect_ok(nb_cuda_free(y));

    /* Freeing twice or freeing foreign memory is an error, not a corruption. */
    expect_status(nb_cuda_free(y), NB_EINVAL, "not a live block");
    int local;
    expect_status(nb_cuda_free(&local), NB_EINVAL, "not a live block");
    expect_status(nb_cuda_free((char *)p[0] + 256), NB_EINVAL, "not a live block");
    ck_assert_int_eq(nb_cuda_free(NULL), NB_OK);

    /* Peak reset, then emptying the cache gives every cached block back. */
    expect_ok(nb_cuda_alloc_reset_peak(0));
    nb_cuda_alloc_stats e = stats0();
    ck_assert_int_eq(e.bytes_peak, e.bytes_live);
    expect_ok(nb_cuda_empty_cache());
    nb_cuda_alloc_stats f = stats0();
    ck_assert_int_eq(f.bytes_cached, 0);
    ck_assert_int_eq(f.system_frees - e.system_frees, N);
    ck_assert_int_eq(f.bytes_live, a.bytes_live);
done:
    nb_scope_end();
}
END_TEST

START_TEST(test_cuda_alloc_errors) {
    nb_scope_begin();
    if (!have_gpu()) goto done;
    /* Far more than any GPU: a clean NB_ENOMEM, after which allocation still works. */
    tu_assert_error(nb_cuda_alloc((size_t)1 << 52, 0), NB_ENOMEM, "out of memory");
    tu_assert_error(nb_cuda_alloc(SIZE_MAX, 0), NB_ENOMEM, "more than any GPU");
    void *p = nb_cuda_alloc(4096, 0);
    ck_assert_msg(p != NULL, "alloc after a failed one: %s", nb_last_error());
    expect_ok(nb__cuda_fill_f32(p, 1.0f, 1024, NULL));
    expect_ok(nb_cuda_stream_synchronize(NULL));
    expect_ok(nb_cuda_free(p));
done:
    nb_scope_end();
}
END_TEST

START_TEST(test_cuda_memcpy) {
    nb_scope_begin();
    if (!have_gpu()) goto done;
    static const int64_t counts[] = {1, 7, 1000, (1 << 20) + 3};
    for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
        int64_t n = counts[t];
        size_t bytes = (size_t)n * sizeof(float);
        float *src = host_random(n, -10, 10, 100 + t);
        float *back = calloc((size_t)n, sizeof(float));
        float *d1 = dev_floats(n), *d2 = dev_floats(n);
        /* Synchronous: h2d, d2d, d2h. */
        expect_ok(nb_cuda_memcpy_h2d(d1, src, bytes));
        expect_ok(nb_cuda_memcpy_d2d(d2, d1, bytes));
        expect_ok(nb_cuda_memcpy_d2h(back, d2, bytes));
        ck_assert_msg(memcmp(src, back, bytes) == 0, "sync round trip of %lld floats",
                      (long long)n);
        /* Async on a stream of our own, then one synchronize. */
        nb_cuda_stream *s = nb_cuda_stream_new(0);
        ck_assert_ptr_nonnull(s);
        memset(back, 0, bytes);
        expect_ok(nb__cuda_fill_f32(d2, -1.0f, n, s));
        expect_ok(nb_cuda_memcpy_h2d_async(d1, src, bytes, s));
        expect_ok(nb_cuda_memcpy_d2d_async(d2, d1, bytes, s));
        expect_ok(nb_cuda_memcpy_d2h_async(back, d2, bytes, s));
        expect_ok(nb_cuda_stream_synchronize(s));
        ck_assert_msg(memcmp(src, back, bytes) == 0, "async round trip of %lld floats",
                      (long long)n);
        nb_cuda_stream_free(s);
        /* Interior pointers (tensor offsets): the last element alone. */
        float last = 0;
        expect_ok(nb_cuda_memcpy_d2h(&last, d1 + n - 1, sizeof last));
        ck_assert(last == src[n - 1]);
        expect_ok(nb_cuda_free(d1));
        expect_ok(nb_cuda_free(d2));
        free(src);
        free(back);
    }

    /* Pointers on the wrong side, NULLs, and empty copies. */
    float h[8] = {0}, *d = dev_floats(8);
    expect_status(nb_cuda_memcpy_h2d(h, h, sizeof h), NB_EINVAL, "host memory");
    expect_status(nb_cuda_memcpy_h2d(d, d, sizeof h), NB_EINVAL, "device memory");
    expect_status(nb_cuda_memcpy_d2h(h, h, sizeof h), NB_EINVAL, "host memory");
    expect_status(nb_cuda_memcpy_d2h(d, d, sizeof h), NB_EINVAL, "device memory");
    expect_status(nb_cuda_memcpy_d2d(d, h, sizeof h), NB_EINVAL, "host memory");
    expect_status(nb_cuda_memcpy_d2d(h, d, sizeof h), NB_EINVAL, "host memory");
    expect_status(nb_cuda_memcpy_h2d(NULL, h, sizeof h), NB_ENULL, "dst");
    expect_status(nb_cuda_memcpy_d2h(h, NULL, sizeof h), NB_ENULL, "src");
    expect_ok(nb_cuda_memcpy_h2d(NULL, NULL, 0));
    expect_ok(nb_cuda_memcpy_d2d_async(NULL, NULL, 0, NULL));
    expect_ok(nb_cuda_free(d));
done:
    nb_scope_end();
}
END_TEST

START_TEST(test_cuda_kernels) {
    nb_scope_begin();
    if (!have_gpu()) goto done;
    /* Sizes around the block size (256) and past the grid cap (65535 blocks), which the
     * grid-stride loop must cover. */
    static const int64_t counts[] = {0, 1, 255, 256, 257, 100003, 65535LL * 256 + 777};
    for (size_t t = 0; t < sizeof counts / sizeof counts[0]; t++) {
        int64_t n = counts[t], m = n ? n : 1;
        size_t bytes = (size_t)n * sizeof(float);
        float *a = host_random(m, -100, 100, 7 + t), *b = host_random(m, -1, 1, 70 + t);
        float *out = malloc((size_t)m * sizeof(float));
        float *da = dev_floats(m), *db = dev_floats(m), *dc = dev_floats(m);

        expect_ok(nb__cuda_fill_f32(dc, 3.25f, n, NULL));
        expect_ok(nb_cuda_memcpy_d2h(out, dc, bytes));
        for (int64_t i = 0; i < n; i++) REQUIRE(out[i] == 3.25f, "fill n=%lld: [%lld] = %g",
                                                (long long)n, (long long)i, out[i]);

        expect_ok(nb_cuda_memcpy_h2d(da, a, bytes));
        expect_ok(nb_cuda_memcpy_h2d(db, b, bytes));
        expect_ok(nb__cuda_add_f32(dc, da, db, n, NULL));
        expect_ok(nb_cuda_memcpy_d2h(out, dc, bytes));
        /* One IEEE rounding on both sides: the results agree bit for bit. */
        for (int64_t i = 0; i < n; i++)
            REQUIRE(out[i] == a[i] + b[i], "add n=%lld: [%lld] = %.9g, CPU %.9g",
                    (long long)n, (long long)i, out[i], a[i] + b[i]);
        /* In place: a += b. */
        expect_ok(nb__cuda_add_f32(da, da, db, n, NULL));
        expect_ok(nb_cuda_memcpy_d2h(out, da, bytes));
        for (int64_t i = 0; i < n; i++) REQ(out[i] == a[i] + b[i]);

        expect_ok(nb_cuda_free(da));
        expect_ok(nb_cuda_free(db));
        expect_ok(nb_cuda_free(dc));
        free(a);
        free(b);
        free(out);
    }
    float *d = dev_floats(4);
    expect_status(nb__cuda_fill_f32(d, 0, -1, NULL), NB_EINVAL, "negative");
    expect_status(nb__cuda_fill_f32(NULL, 0, 4, NULL), NB_ENULL, "dst");
    expect_status(nb__cuda_add_f32(d, NULL, d, 4, NULL), NB_ENULL, "'a'");
    expect_ok(nb__cuda_add_f32(NULL, NULL, NULL, 0, NULL));
    expect_ok(nb_cuda_free(d));
done:
    nb_scope_end();
}
END_TEST

START_TEST(test_cuda_streams) {
    nb_scope_begin();
    if (!have_gpu()) goto done;
    expect_ok(nb_cuda_set_device(0));
    expect_ok(nb_cuda_empty_cache()); /* the reuse checks below expect an empty cache */
    nb_cuda_stream *def = nb_cuda_stream_default(-1);
    ck_assert_ptr_nonnull(def);
    ck_assert_ptr_eq(nb_cuda_stream_default(0), def); /* created once per thread */
    ck_assert_ptr_eq(nb_cuda_stream_current(-1), def);
    ck_assert_int_eq(nb_cuda_stream_device(def), 0);
    ck_assert_ptr_nonnull(nb_cuda_stream_handle(def));
    nb_cuda_stream_free(def); /* the library's: ignored */
    ck_assert_ptr_eq(nb_cuda_stream_current(0), def);
    expect_ok(nb_cuda_stream_synchronize(def));

    nb_cuda_stream *s1 = nb_cuda_stream_new(0), *s2 = nb_cuda_stream_new(-1);
    ck_assert(s1 && s2 && s1 != s2 && s1 != def);
    expect_ok(nb_cuda_set_stream(s1));
    ck_assert_ptr_eq(nb_cuda_stream_current(-1), s1);
    ck_assert_ptr_eq(nb_cuda_stream_default(-1), def);

    /* Work on the current stream (s1) is ordered: a fill then an async copy back. */
    int64_t n = 1 << 22;
    float *d = dev_floats(n), *h = malloc((size_t)n * sizeof(float));
    expect_ok(nb__cuda_fill_f32(d, 0.5f, n, NULL));
    expect_ok(nb_cuda_memcpy_d2h_async(h, d, (size_t)n * sizeof(float), NULL));
    expect_ok(nb_cuda_stream_synchronize(NULL)); /* current = s1 */
    for (int64_t i = 0; i < n; i++) REQ(h[i] == 0.5f);
    /* The block belongs to s1; s2 takes it only once s1 is idle (it is, after the sync). */
    expect_ok(nb_cuda_free(d));
    nb_cuda_alloc_stats a = stats0();
    expect_ok(nb_cuda_set_stream(s2));
    float *d2 = dev_floats(n);
    nb_cuda_alloc_stats b = stats0();
    ck_assert_int_eq(b.system_allocs, a.system_allocs);
    ck_assert_ptr_eq(d2, d);
    expect_ok(nb_cuda_free(d2));

    /* A freed stream: its cached blocks become free for every stream. */
    expect_ok(nb_cuda_set_stream(s1));
    float *d3 = dev_floats(1000);
    expect_ok(nb__cuda_fill_f32(d3, 1.0f, 1000, NULL));
    expect_ok(nb_cuda_free(d3));
    expect_ok(nb_cuda_set_stream(NULL));
    ck_assert_ptr_eq(nb_cuda_stream_current(-1), def);
    nb_cuda_stream_free(s1);
    a = stats0();
    float *d4 = dev_floats(1000);
    ck_assert_ptr_eq(d4, d3);
    ck_assert_int_eq(stats0().system_allocs, a.system_allocs);
    expect_ok(nb_cuda_free(d4));

    /* Freeing the current stream puts the library stream back. */
    expect_ok(nb_cuda_set_stream(s2));
    nb_cuda_stream_free(s2);
    ck_assert_ptr_eq(nb_cuda_stream_current(-1), def);
    expect_ok(nb_cuda_set_stream(def)); /* setting the default is the same as NULL */
    ck_assert_ptr_eq(nb_cuda_stream_current(-1), def);
    free(h);
done:
    nb_scope_end();
}
END_TEST

typedef struct {
    nb_cuda_stream *stream;
    void *block;
    nb_status st;
    char err[256];
} thread_result;

/* Another thread: its own library stream, a kernel and a GEMM (so its cuBLAS handle and
 * stream are destroyed at thread exit), and a block it frees before exiting. */
static void *worker(void *arg) {
    thread_result *r = arg;
    r->st = nb_cuda_set_device(0);
    r->stream = nb_cuda_stream_current(-1);
    float *d = nb_cuda_alloc(3 * 64 * sizeof(float), 0); /* A, B, C: three 8x8 */
    if (r->st == NB_OK && !d) r->st = nb_last_status();
    if (r->st == NB_OK) r->st = nb__cuda_fill_f32(d, 2.0f, 2 * 64, NULL);
    if (r->st == NB_OK)
        r->st = nb__cuda_gemm_f32(false, false, 8, 8, 8, 1.0f, d, 8, d + 64, 8, 0.0f,
                                  d + 128, 8, NULL);
    if (r->st == NB_OK) r->st = nb_cuda_stream_synchronize(NULL);
    r->block = d;
    if (d) nb_cuda_free(d);
    if (r->st != NB_OK) snprintf(r->err, sizeof r->err, "%s", nb_last_error());
    return NULL;
}

START_TEST(test_cuda_threads) {
    nb_scope_begin();
    if (!have_gpu()) goto done;
    expect_ok(nb_cuda_set_device(0));
    nb_cuda_stream *mine = nb_cuda_stream_current(-1);
    expect_ok(nb_cuda_empty_cache());
    thread_result r = {0};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, worker, &r), 0);
    ck_assert_int_eq(pthread_join(th, NULL), 0);
    ck_assert_msg(r.st == NB_OK, "worker thread: %s", r.err);
    ck_assert_ptr_nonnull(r.stream);
    ck_assert_ptr_ne(r.stream, mine); /* one library stream per thread */
    /* The worker's stream was retired at thread exit: its block serves this thread. */
    nb_cuda_alloc_stats a = stats0();
    void *p = nb_cuda_alloc(3 * 64 * sizeof(float), 0);
    ck_assert_ptr_eq(p, r.block);
    ck_assert_int_eq(stats0().system_allocs, a.system_allocs);
    expect_ok(nb_cuda_free(p));
done:
    nb_scope_end();
}
END_TEST

/* C = alpha op(A) op(B) + beta C against a double reference, with the standard bound for
 * a k-term float dot product: |err| <= gamma * sum |a_il b_lj| (gamma ~ k * eps), plus
 * the rounding of alpha and beta terms. */
START_TEST(test_cuda_gemm) {
    nb_scope_begin();
    if (!have_gpu()) goto done;
    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {64, 33, 17}, {128, 96, 256}};
    const float alpha = 1.5f, beta = 0.5f;
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        for (int ta = 0; ta < 2; ta++) {
            for (int tb = 0; tb < 2; tb++) {
                int64_t m = shapes[t][0], n = shapes[t][1], k = shapes[t][2];
                /* Stored shapes: A (m,k) or (k,m) if transposed; B (k,n) or (n,k). */
                int64_t lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
                float *a = host_random(m * k, -1, 1, 1000 + t);
                float *b = host_random(k * n, -1, 1, 2000 + t);
                float *c = host_random(m * n, -1, 1, 3000 + t);
                float *out = malloc((size_t)(m * n) * sizeof(float));
                float *da = dev_floats(m * k), *db = dev_floats(k * n), *dc = dev_floats(m * n);
                expect_ok(nb_cuda_memcpy_h2d(da, a, (size_t)(m * k) * sizeof(float)));
                expect_ok(nb_cuda_memcpy_h2d(db, b, (size_t)(k * n) * sizeof(float)));
                expect_ok(nb_cuda_memcpy_h2d(dc, c, (size_t)(m * n) * sizeof(float)));
                expect_ok(nb__cuda_gemm_f32(ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc,
                                            ldc, NULL));
                expect_ok(nb_cuda_memcpy_d2h(out, dc, (size_t)(m * n) * sizeof(float)));
                for (int64_t i = 0; i < m; i++) {
                    for (int64_t j = 0; j < n; j++) {
                        double ref = 0, mag = 0;
                        for (int64_t l = 0; l < k; l++) {
                            double x = ta ? a[l * lda + i] : a[i * lda + l];
                            double y = tb ? b[j * ldb + l] : b[l * ldb + j];
                            ref += x * y;
                            mag += fabs(x * y);
                        }
                        double full = alpha * ref + beta * c[i * ldc + j];
                        double bound = (2.0 * (double)k + 4) * FLT_EPSILON *
                                       (fabs(alpha) * mag + fabs(beta * c[i * ldc + j]));
                        double got = out[i * ldc + j];
                        REQUIRE(fabs(got - full) <= bound,
                                "gemm m=%lld n=%lld k=%lld ta=%d tb=%d: C[%lld,%lld] = %.9g, "
                                "reference %.9g (bound %.3g)",
                                (long long)m, (long long)n, (long long)k, ta, tb, (long long)i,
                                (long long)j, got, full, bound);
                    }
                }
                expect_ok(nb_cuda_free(da));
                expect_ok(nb_cuda_free(db));
                expect_ok(nb_cuda_free(dc));
                free(a);
                free(b);
                free(c);
                free(out);
            }
        }
    }
    /* Empty output: nothing to do. Bad sizes and NULLs: errors. */
    expect_ok(nb__cuda_gemm_f32(false, false, 0, 4, 4, 1, NULL, 4, NULL, 4, 0, NULL, 4, NULL));
    expect_status(nb__cuda_gemm_f32(false, false, -1, 4, 4, 1, NULL, 4, NULL, 4, 0, NULL, 4, NULL),
                  NB_EINVAL, "negative");
    float *d = dev_floats(16);
    expect_status(nb__cuda_gemm_f32(false, false, 4, 4, 4, 1, NULL, 4, d, 4, 0, d, 4, NULL),
                  NB_ENULL, "'a'");
    expect_ok(nb_cuda_free(d));
done:
    nb_scope_end();
}
END_TEST

/* Role streams, waits between streams and record_stream (unverified on a GPU). */
START_TEST(test_cuda_roles_record) {
    nb_scope_begin();
    if (!have_gpu()) goto done;
    expect_ok(nb_cuda_set_device(0));
    expect_ok(nb_cuda_empty_cache());
    nb_cuda_stream *compute = nb_cuda_stream_role(0, NB_CUDA_ROLE_COMPUTE);
    nb_cuda_stream *comm = nb_cuda_stream_role(0, NB_CUDA_ROLE_COMM);
    nb_cuda_stream *copy = nb_cuda_stream_role(-1, NB_CUDA_ROLE_COPY);
    ck_assert(compute && comm && copy && comm != copy && comm != compute);
    ck_assert_ptr_eq(compute, nb_cuda_stream_default(0));
    ck_assert_ptr_eq(nb_cuda_stream_role(0, NB_CUDA_ROLE_COMM), comm); /* once per thread */
    nb_cuda_stream_free(comm); /* the library's: ignored */

    /* compute fills, comm waits for it and overwrites: the result is comm's value. */
    int64_t n = 1 << 20;
    float *d = dev_floats(n), *h = malloc((size_t)n * sizeof(float));
    expect_ok(nb__cuda_fill_f32(d, 1.0f, n, compute));
    expect_ok(nb_cuda_stream_wait(comm, compute));
    expect_ok(nb__cuda_fill_f32(d, 2.0f, n, comm));
    expect_ok(nb_cuda_stream_wait(compute, comm));
    expect_ok(nb_cuda_memcpy_d2h(h, d, (size_t)n * sizeof(float))); /* on compute */
    for (int64_t i = 0; i < n; i++) REQ(h[i] == 2.0f);
    expect_ok(nb_cuda_stream_wait(comm, comm)); /* a stream waiting on itself: nothing */

    /* record_stream: the block, used on comm, is freed; once comm is done it is reused. */
    expect_ok(nb_cuda_record_stream(d, comm));
    expect_ok(nb_cuda_record_stream(d, NULL)); /* its own stream: nothing to note */
    expect_ok(nb__cuda_fill_f32(d, 3.0f, n, comm));
    expect_ok(nb_cuda_free(d));
    expect_ok(nb_cuda_stream_synchronize(comm));
    nb_cuda_alloc_stats a = stats0();
    float *d2 = dev_floats(n);
    ck_assert_ptr_eq(d2, d);
    ck_assert_int_eq(stats0().system_allocs, a.system_allocs);
    expect_status(nb_cuda_record_stream(h, comm), NB_EINVAL, "not a live block");
    expect_ok(nb_cuda_free(d2));
    expect_status(nb_cuda_record_stream(d2, comm), NB_EINVAL, "not a live block");
    free(h);
done:
    nb_scope_end();
}
END_TEST
#endif /* NB_HAVE_CUDA */

Suite *nb_suite_cuda(void) {
    Suite *s = suite_create("cuda");
    TCase *tc = tcase_create("cuda");
    tcase_add_test(tc, test_cuda_build);
    tcase_add_test(tc, test_cuda_no_gpu);
    tcase_add_test(tc, test_cuda_plugin_missing);
    tcase_add_test(tc, test_cuda_plugin_wrong_file);
    tcase_add_test(tc, test_cuda_plugin_mismatch);
    tcase_add_test(tc, test_cuda_plugin_search);
#if NB_HAVE_CUDA
    tcase_add_test(tc, test_cuda_plugin_loaded);
    tcase_add_test(tc, test_cuda_device);
    tcase_add_test(tc, test_cuda_alloc_reuse);
    tcase_add_test(tc, test_cuda_alloc_errors);
    tcase_add_test(tc, test_cuda_memcpy);
    tcase_add_test(tc, test_cuda_kernels);
    tcase_add_test(tc, test_cuda_streams);
    tcase_add_test(tc, test_cuda_threads);
    tcase_add_test(tc, test_cuda_gemm);
    tcase_add_test(tc, test_cuda_roles_record);
#endif
    suite_add_tcase(s, tc);
    suite_add_tcase(s, nb_tcase_cuda_conv()); /* tests/test_cuda_conv.c */
    return s;
}
