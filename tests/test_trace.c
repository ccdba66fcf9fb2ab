/* test_trace.c - the timeline trace and the op profiler (nabla/trace.h, tensor/trace.c): a
 * traced training step parses as Chrome trace JSON with module forward, op, GEMM, backward
 * and optimizer spans properly nested; per-rank file names; per-thread buffers that are
 * written out when full; the profiler's self and total times, its agreement with the
 * measured wall time of training steps, its table; errors as values. Each test runs in its
 * own process (Check forks), so the trace's global state starts fresh. */
#include <ctype.h>
#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tensor/trace.h"
#include "testutil.h"

#define IN 32
#define HID 64
#define OUT 10
#define BATCH 16

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct net {
    nb_generator *g;
    nb_module *m;
    nb_optim *opt;
    nb_tensor *x, *y;
} net;

static net net_new(int in, int hid, int out, int batch) {
    net n;
    n.g = nb_generator_new(3);
    nb_linear_opts lin = nb_linear_defaults();
    lin.gen = n.g;
    nb_linear_opts lin2 = nb_linear_defaults();
    lin2.gen = n.g;
    n.m = nb_sequential_new(nb_linear_new(in, hid, &lin), nb_relu_new(),
                            nb_linear_new(hid, out, &lin2), NULL);
    nb_sgd_opts so = nb_sgd_defaults();
    so.lr = 0.01;
    n.opt = nb_sgd_new(nb_parameters(n.m), &so);
    n.x = nb_keep(nb_randn((int64_t[]){batch, in}, 2, NB_F32, n.g));
    n.y = nb_keep(nb_randint((int64_t[]){batch}, 1, NB_I64, 0, out, n.g));
    ck_assert(n.m && n.opt && n.x && n.y);
    return n;
}

static void net_free(net *n) {
    nb_tensor_free(n->x);
    nb_tensor_free(n->y);
    nb_optim_free(n->opt);
    nb_module_free(n->m);
    nb_generator_free(n->g);
}

static void train_step(net *n) {
    nb_scope_begin();
    nb_tensor *loss = nb_cross_entropy(nb_forward(n->m, n->x), n->y, NULL);
    ck_assert_int_eq(nb_zero_grad(n->opt), NB_OK);
    ck_assert_int_eq(nb_backward(loss), NB_OK);
    ck_assert_int_eq(nb_step(n->opt), NB_OK);
    nb_scope_end();
}

static json_t *load_trace(const char *path) {
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    ck_assert_msg(root, "%s does not parse: %s (line %d)", path, err.text, err.line);
    ck_assert(json_is_array(json_object_get(root, "traceEvents")));
    return root;
}

static const char *sget(json_t *e, const char *k) {
    json_t *v = json_object_get(e, k);
    return json_is_string(v) ? json_string_value(v) : "";
}
static double nget(json_t *e, const char *k) {
    json_t *v = json_object_get(e, k);
    return json_is_number(v) ? json_number_value(v) : -1;
}

/* The first event of phase ph, category cat and name; NULL if none. */
static json_t *find(json_t *root, const char *ph, const char *cat, const char *name) {
    json_t *evs = json_object_get(root, "traceEvents"), *e;
    size_t i;
    json_array_foreach(evs, i, e) {
        if (strcmp(sget(e, "ph"), ph) == 0 && (!cat || strcmp(sget(e, "cat"), cat) == 0) &&
            (!name || strcmp(sget(e, "name"), name) == 0))
            return e;
    }
    return NULL;
}
static int count(json_t *root, const char *ph, const char *cat, const char *name) {
    json_t *evs = json_object_get(root, "traceEvents"), *e;
    size_t i;
    int n = 0;
    json_array_foreach(evs, i, e) {
        if (strcmp(sget(e, "ph"), ph) == 0 && (!cat || strcmp(sget(e, "cat"), cat) == 0) &&
            (!name || strcmp(sget(e, "name"), name) == 0))
            n++;
    }
    return n;
}
/* inner lies within outer on the same thread. */
static bool inside(json_t *inner, json_t *outer) {
    return nget(inner, "tid") == nget(outer, "tid") && nget(inner, "ts") >= nget(outer, "ts") &&
           nget(inner, "ts") + nget(inner, "dur") <= nget(outer, "ts") + nget(outer, "dur") + 0.002;
}

START_TEST(test_trace_training_step) {
    char *dir = tu_make_dir();
    char *path = tu_path_in(dir, "trace.json");
    net n = net_new(IN, HID, OUT, BATCH);
    ck_assert_int_eq(nb_trace_start(path), NB_OK);
    ck_assert(nb_trace_enabled());
    nb_trace_begin("step");
    train_step(&n);
    nb_trace_end();
    nb_trace_counter("loss scale", 1024);
    ck_assert_int_eq(nb_trace_stop(), NB_OK);
    ck_assert(!nb_trace_enabled());
    ck_assert_str_eq(nb_trace_path(), path); /* one rank: the path as given */

    json_t *root = load_trace(path);
    json_t *step = find(root, "X", "user", "step");
    json_t *seq = find(root, "X", "module", "Sequential");
    json_t *lin = find(root, "X", "module", "Linear");
    json_t *relu = find(root, "X", "module", "ReLU");
    json_t *op = find(root, "X", "op", "linear");
    json_t *gemm = find(root, "X", "gemm", NULL);
    json_t *bw = find(root, "X", "backward", "backward");
    json_t *lbw = find(root, "X", "backward", "linear backward");
    json_t *sgd = find(root, "X", "optim", "sgd");
    ck_assert_msg(step && seq && lin && relu && op && gemm && bw && lbw && sgd,
                  "missing spans: step %p Sequential %p Linear %p ReLU %p linear %p gemm %p "
                  "backward %p linear backward %p sgd %p", (void *)step, (void *)seq,
                  (void *)lin, (void *)relu, (void *)op, (void *)gemm, (void *)bw, (void *)lbw,
                  (void *)sgd);
    /* forward: two Linear modules and their ops inside the Sequential, inside the step */
    ck_assert_int_eq(count(root, "X", "module", "Linear"), 2);
    ck_assert(inside(seq, step) && inside(lin, seq) && inside(op, lin) && inside(gemm, op));
    ck_assert(inside(lbw, bw) && inside(bw, step) && inside(sgd, step));
    ck_assert(nget(bw, "ts") >= nget(seq, "ts") + nget(seq, "dur"));
    /* the op knows its kernel and its work: the first Linear is (16 x 32) @ (32 x 64) */
    json_t *args = json_object_get(op, "args");
    ck_assert_str_eq(sget(args, "kernel"), "gemm");
    ck_assert_int_eq((int64_t)nget(args, "flops"), 2LL * BATCH * IN * HID);
    ck_assert_int_eq(nget(op, "pid"), 0);
    /* counters, thread and process names */
    json_t *c = find(root, "C", "user", "loss scale");
    ck_assert(c);
    ck_assert_int_eq(nget(json_object_get(c, "args"), "value"), 1024);
    ck_assert(find(root, "C", "memory", "host memory"));
    ck_assert(find(root, "M", NULL, "thread_name"));
    ck_assert(find(root, "M", NULL, "process_name"));
    json_decref(root);
    net_free(&n);
    free(path);
    tu_rm_dir(dir);
}
END_TEST

START_TEST(test_trace_off) {
    /* Neither running (no NB_TRACE / NB_PROFILE here): the flag is 0 after the first span,
     * so every instrumented place is one test of it. */
    unsetenv("NB_TRACE");
    unsetenv("NB_PROFILE");
    int tok = NB__SPAN_BEGIN("x", NULL, NB__CAT_USER);
    ck_assert_int_eq(tok, 0);
    ck_assert_int_eq(nb__trace_flags, 0);
    /* after a trace, again */
    char *dir = tu_make_dir();
    char *path = tu_path_in(dir, "t.json");
    ck_assert_int_eq(nb_trace_start(path), NB_OK);
    ck_assert_int_ne(nb__trace_flags, 0);
    ck_assert_int_eq(nb_trace_stop(), NB_OK);
    ck_assert_int_eq(nb__trace_flags, 0);
    ck_assert_int_eq(NB__SPAN_BEGIN("x", NULL, NB__CAT_USER), 0);
    nb_trace_begin("ignored");
    nb_trace_end();
    nb_trace_counter("ignored", 1);
    ck_assert_int_eq(nb_trace_stop(), NB_OK); /* not running: nothing to do */
    free(path);
    tu_rm_dir(dir);
}
END_TEST

START_TEST(test_trace_errors) {
    ck_assert_int_eq(nb_trace_start(NULL), NB_EINVAL);
    ck_assert_int_eq(nb_trace_start(""), NB_EINVAL);
    char *dir = tu_make_dir();
    char *path = tu_path_in(dir, "t.json");
    ck_assert_int_eq(nb_trace_start(path), NB_OK);
    ck_assert_int_eq(nb_trace_start(path), NB_ESTATE);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "nb_trace_stop"));
    ck_assert_int_eq(nb_trace_stop(), NB_OK);
    /* a file that cannot be written: the error comes from stop, naming it */
    ck_assert_int_eq(nb_trace_start("/nonexistent-dir/t.json"), NB_OK);
    nb_trace_begin("x");
    nb_trace_end();
    ck_assert_int_eq(nb_trace_stop(), NB_EIO);
    ck_assert_ptr_nonnull(strstr(nb_last_error(), "/nonexistent-dir/t.json"));
    ck_assert_int_eq(nb_profile_print(NULL, NB_PROFILE_SORT_SELF), NB_ENULL);
    ck_assert_int_eq(nb_profile_print(stderr, (nb_profile_sort)7), NB_EINVAL);
    free(path);
    tu_rm_dir(dir);
}
END_TEST

START_TEST(test_trace_rank_paths) {
    char *dir = tu_make_dir();
    char *path = tu_path_in(dir, "t.json"), *pct = tu_path_in(dir, "t.%r.json");
    nb_trace_set_rank(1, 2);
    ck_assert_int_eq(nb_trace_start(path), NB_OK);
    nb_trace_begin("x");
    nb_trace_end();
    ck_assert_int_eq(nb_trace_stop(), NB_OK);
    char *want = tu_path_in(dir, "t.json.rank1");
    ck_assert_str_eq(nb_trace_path(), want);
    json_t *root = load_trace(want);
    ck_assert_int_eq(nget(find(root, "X", "user", "x"), "pid"), 1);
    ck_assert_int_eq(nget(json_object_get(root, "otherData"), "nabla_rank"), 1);
    json_decref(root);
    ck_assert_int_eq(nb_trace_start(pct), NB_OK);
    ck_assert_int_eq(nb_trace_stop(), NB_OK); /* no event: still a valid file */
    char *want2 = tu_path_in(dir, "t.1.json");
    ck_assert_str_eq(nb_trace_path(), want2);
    json_decref(load_trace(want2));
    free(want);
    free(want2);
    free(path);
    free(pct);
    tu_rm_dir(dir);
}
END_TEST

/* Many spans on two threads: each thread's buffer is written out when it fills, and every
 * span reaches the file, on its own thread's row. */
#define MANY 40000
static void *many_spans(void *arg) {
    (void)arg;
    for (int i = 0; i < MANY; i++) {
        nb_trace_begin("many");
        nb_trace_end();
    }
    return NULL;
}

START_TEST(test_trace_threads) {
    char *dir = tu_make_dir();
    char *path = tu_path_in(dir, "t.json");
    ck_assert_int_eq(nb_trace_start(path), NB_OK);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, many_spans, NULL), 0);
    many_spans(NULL);
    pthread_join(th, NULL);
    ck_assert_int_eq(nb_trace_stop(), NB_OK);
    json_t *root = load_trace(path);
    ck_assert_int_eq(count(root, "X", "user", "many"), 2 * MANY);
    json_t *evs = json_object_get(root, "traceEvents"), *e;
    size_t i;
    double tids[2] = {-1, -1};
    json_array_foreach(evs, i, e) {
        if (strcmp(sget(e, "name"), "many") != 0) continue;
        double t = nget(e, "tid");
        if (tids[0] < 0) tids[0] = t;
        else if (t != tids[0]) tids[1] = t;
    }
    ck_assert(tids[1] >= 0); /* two rows */
    ck_assert_int_ge(count(root, "M", NULL, "thread_name"), 2);
    json_decref(root);
    free(path);
    tu_rm_dir(dir);
}
END_TEST

static void sleep_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Self time is the total minus the nested spans, exactly. */
START_TEST(test_profile_self_time) {
    ck_assert_int_eq(nb_profile_start(), NB_OK);
    ck_assert(nb_profile_enabled());
    for (int i = 0; i < 3; i++) {
        nb_trace_begin("outer");
        sleep_ms(4);
        nb_trace_begin("inner");
        sleep_ms(4);
        nb_trace_end();
        nb_trace_end();
    }
    nb_profile_stop();
    ck_assert(!nb_profile_enabled());
    nb_profile_row o, in;
    ck_assert(nb_profile_row_get("outer", "user", &o));
    ck_assert(nb_profile_row_get("inner", NULL, &in));
    ck_assert(!nb_profile_row_get("nothing", NULL, NULL));
    ck_assert_int_eq(o.calls, 3);
    ck_assert_int_eq(in.calls, 3);
    ck_assert_double_eq_tol(o.self_s, o.total_s - in.total_s, 1e-6);
    ck_assert_double_eq_tol(in.self_s, in.total_s, 1e-9);
    ck_assert(in.total_s >= 0.012 && o.total_s >= 0.024);
    nb_profile_totals t;
    nb_profile_get_totals(&t);
    ck_assert_double_eq_tol(t.covered_s, o.total_s, 1e-6);
    ck_assert(t.wall_s >= t.covered_s);
    ck_assert_int_eq(t.rows, 2);
}
END_TEST

/* The byte offset just past a heading of the table's heading line (numbers end there). */
static int heading_end(const char *head, const char *name) {
    const char *at = strstr(head, name);
    ck_assert_ptr_nonnull(at);
    return (int)(at - head + (ptrdiff_t)strlen(name));
}

/* The number of a data row that ends at byte offset end (a right-aligned column). */
static double number_ending_at(const char *line, int end) {
    int start = end;
    while (start > 0 && line[start - 1] != ' ') start--;
    return strtod(line + start, NULL);
}

/* The profiler accounts for the time of training steps: its wall time and the time inside
 * its outermost spans (module forwards, the loss, backward, the optimizer) both agree with
 * the wall time of the steps measured around them, within 10 %; its rows count what ran. */
START_TEST(test_profile_agrees_with_step_time) {
    enum { STEPS = 20 };
    net n = net_new(256, 512, 10, 128);
    train_step(&n); /* warm-up: first-touch allocations, provider start-up */
    ck_assert_int_eq(nb_profile_start(), NB_OK);
    double t0 = now_s();
    for (int i = 0; i < STEPS; i++) train_step(&n);
    double measured = now_s() - t0;
    nb_profile_stop();
    nb_profile_totals t;
    nb_profile_get_totals(&t);
    ck_assert_msg(fabs(t.wall_s - measured) <= 0.1 * measured,
                  "profiled wall %.4f s vs measured %.4f s", t.wall_s, measured);
    ck_assert_msg(fabs(t.covered_s - measured) <= 0.1 * measured,
                  "time inside spans %.4f s vs measured %.4f s", t.covered_s, measured);
    nb_profile_row r;
    ck_assert(nb_profile_row_get("Linear", "module", &r));
    ck_assert_int_eq(r.calls, 2 * STEPS);
    ck_assert(nb_profile_row_get("sgd", "optim", &r));
    ck_assert_int_eq(r.calls, STEPS);
    ck_assert(nb_profile_row_get("backward", "backward", &r));
    ck_assert_int_eq(r.calls, STEPS);
    ck_assert(nb_profile_row_get("linear", "gemm", &r));
    /* forward: 2 x 128 x (256 x 512 + 512 x 10) per step, at least (the backward GEMMs add) */
    ck_assert_int_ge(r.flops, (int64_t)STEPS * 2 * 128 * (256 * 512 + 512 * 10));

    /* the table: header with the rank, one line per row, sorted, and the footer */
    for (int s = NB_PROFILE_SORT_SELF; s <= NB_PROFILE_SORT_TOTAL; s++) {
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        ck_assert_int_eq(nb_profile_print(f, (nb_profile_sort)s), NB_OK);
        fclose(f);
        ck_assert_ptr_nonnull(strstr(buf, "nabla profile, rank 0 of 1"));
        ck_assert_ptr_nonnull(strstr(buf, s == NB_PROFILE_SORT_SELF ? "sorted by self"
                                                                    : "sorted by total"));
        ck_assert_ptr_nonnull(strstr(buf, "GFLOP/s"));
        ck_assert_ptr_nonnull(strstr(buf, "inside outermost spans"));
        /* data rows under the heading, each number right-aligned to its heading's end; every
         * name and kind whole (the backward of the loss, cross_entropy_backward, is longer
         * than a fixed 20-character column) */
        char *head = strchr(buf, '\n') + 1, *line = strchr(head, '\n') + 1;
        const char *sorted_by = s == NB_PROFILE_SORT_SELF ? "Self ms" : "Total ms";
        const int key_end = heading_end(head, sorted_by), calls_end = heading_end(head, "Calls");
        ck_assert_ptr_nonnull(strstr(buf, " cross_entropy_backward "));
        double prev = 1e300;
        int rows = 0;
        for (char *end; (end = strchr(line, '\n')) && strncmp(line, "wall ", 5) != 0;
             line = end + 1, rows++) {
            ck_assert_msg(end - line > calls_end && isdigit((unsigned char)line[calls_end - 1]) &&
                              line[calls_end] == ' ',
                          "row %d not aligned under its heading:\n%.*s%.*s", rows,
                          (int)(line - head), head, (int)(end - line), line);
            double v = number_ending_at(line, key_end);
            ck_assert_msg(v <= prev + 1e-9, "row %d out of order: %s", rows, line);
            prev = v;
        }
        nb_profile_totals tt;
        nb_profile_get_totals(&tt);
        ck_assert_int_eq(rows, tt.rows);
        free(buf);
    }
    net_free(&n);
}
END_TEST

Suite *nb_suite_trace(void) {
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("trace");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_trace_training_step);
    tcase_add_test(tc, test_trace_off);
    tcase_add_test(tc, test_trace_errors);
    tcase_add_test(tc, test_trace_rank_paths);
    tcase_add_test(tc, test_trace_threads);
    tcase_add_test(tc, test_profile_self_time);
    tcase_add_test(tc, test_profile_agrees_with_step_time);
    suite_add_tcase(s, tc);
    return s;
}
