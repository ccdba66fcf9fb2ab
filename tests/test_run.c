/* test_run.c - the run toolkit (nabla/run.h) and TensorBoard event files (nabla/summary.h):
 * a tfevents file is decoded back here (TFRecord framing, both masked CRC-32Cs computed bit
 * by bit from the polynomial, the Event and Summary fields) and compared with the logged
 * scalars; JSON lines stay strict JSON (null for NaN, escaped strings) and report write
 * errors; the progress line's rates, ETA and \r rule; the parameter summary; flag parsing. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "nabla/run.h"
#include "nabla/summary.h"
#include "testutil.h"

/* ---- an independent TFRecord / Event decoder ---------------------------------------------- */
static uint32_t crc32c_bitwise(const unsigned char *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1)));
    }
    return ~c;
}

static uint32_t masked(const unsigned char *p, size_t n) {
    uint32_t c = crc32c_bitwise(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static uint64_t varint(const unsigned char **p, const unsigned char *end) {
    uint64_t v = 0;
    for (int shift = 0; *p < end; shift += 7) {
        unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    ck_abort_msg("a varint runs past its message");
    return 0;
}

typedef struct event {
    double wall_time;
    int64_t step;
    char version[32], tag[64];
    float value;
    bool has_value;
} event;

/* Value { tag = 1; simple_value = 2 } inside Summary { value = 1 }. */
static void decode_value(const unsigned char *p, const unsigned char *end, event *e) {
    while (p < end) {
        uint64_t key = varint(&p, end);
        if (key == (1 << 3 | 2)) {
            uint64_t n = varint(&p, end);
            ck_assert(n < sizeof e->tag && p + n <= end);
            memcpy(e->tag, p, n);
            e->tag[n] = 0;
            p += n;
        } else if (key == (2 << 3 | 5)) {
            uint32_t bits = (uint32_t)le(p, 4);
            memcpy(&e->value, &bits, 4);
            e->has_value = true;
            p += 4;
        } else {
            ck_abort_msg("unexpected field %llu in Summary.Value", (unsigned long long)key);
        }
    }
}

static void decode_event(const unsigned char *p, const unsigned char *end, event *e) {
    memset(e, 0, sizeof *e);
    while (p < end) {
        uint64_t key = varint(&p, end);
        if (key == (1 << 3 | 1)) { /* wall_time: double */
            uint64_t bits = le(p, 8);
            memcpy(&e->wall_time, &bits, 8);
            p += 8;
        } else if (key == (2 << 3 | 0)) {
            e->step = (int64_t)varint(&p, end);
        } else if (key == (3 << 3 | 2)) {
            uint64_t n = varint(&p, end);
            ck_assert(n < sizeof e->version);
            memcpy(e->version, p, n);
            e->version[n] = 0;
            p += n;
        } else if (key == (5 << 3 | 2)) { /* summary: one value */
            uint64_t n = varint(&p, end);
            const unsigned char *s = p, *send = p + n;
            ck_assert(send <= end);
            ck_assert_int_eq((int)varint(&s, send), 1 << 3 | 2);
            uint64_t nv = varint(&s, send);
            ck_assert(s + nv == send);
            decode_value(s, send, e);
            p = send;
        } else {
            ck_abort_msg("unexpected field %llu in Event", (unsigned long long)key);
        }
    }
}

/* Decode every record of the file (checking the framing and both CRCs) into ev[]. */
static int read_events(const char *path, event *ev, int max) {
    size_t n;
    unsigned char *buf = tu_read_file(path, &n);
    int k = 0;
    size_t at = 0;
    while (at < n) {
        ck_assert_msg(at + 12 <= n, "a record header is cut at byte %zu", at);
        uint64_t len = le(buf + at, 8);
        ck_assert_msg(le(buf + at + 8, 4) == masked(buf + at, 8), "length CRC of record %d", k);
        ck_assert(at + 12 + len + 4 <= n);
        ck_assert_msg(le(buf + at + 12 + len, 4) == masked(buf + at + 12, len),
                      "data CRC of record %d", k);
        ck_assert(k < max);
        decode_event(buf + at + 12, buf + at + 12 + len, &ev[k++]);
        at += 12 + len + 4;
    }
    free(buf);
    return k;
}

/* The one event file in dir (malloc'd path). */
static char *event_file(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert(d);
    char *found = NULL;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, "events.out.tfevents.")) {
            ck_assert_msg(!found, "two event files");
            found = tu_path_in(dir, e->d_name);
        }
    closedir(d);
    ck_assert_msg(found, "no event file in %s", dir);
    return found;
}

START_TEST(test_crc32c) {
    /* the check value of CRC-32C (iSCSI) */
    ck_assert_uint_eq(nb_crc32c(0, "123456789", 9), 0xe3069283u);
    ck_assert_uint_eq(nb_crc32c(nb_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
    unsigned char b[300];
    for (int i = 0; i < 300; i++) b[i] = (unsigned char)(i * 7 + 3);
    ck_assert_uint_eq(nb_crc32c_masked(b, 300), masked(b, 300));
}
END_TEST

START_TEST(test_summary_decodes) {
    char *dir = tu_make_dir();
    char *sub = tu_path_in(dir, "runs/exp1"); /* a missing folder and its parent are made */
    nb_summary *w = nb_summary_open(sub);
    ck_assert_msg(w, "%s", nb_last_error());
    ck_assert(strstr(nb_summary_path(w), "/events.out.tfevents."));
    const char *tags[] = {"train/loss", "train/lr", "val/loss"};
    double values[] = {2.5, 3e-4, -1.25, 1e30, 0.1};
    int64_t steps[] = {1, 2, 300, INT64_C(5000000000), 0};
    for (int i = 0; i < 5; i++)
        ASSERT_OK(nb_summary_scalar(w, tags[i % 3], steps[i], values[i]));
    ASSERT_OK(nb_summary_scalar(w, "nan", 7, NAN));
    ASSERT_OK(nb_summary_flush(w));
    ASSERT_OK(nb_summary_scalar_at(w, "replayed", 8, 4.0, 1234.5));
    ASSERT_OK(nb_summary_close(w));
    char *path = event_file(sub);
    event ev[16];
    int n = read_events(path, ev, 16);
    ck_assert_int_eq(n, 8);
    ck_assert_str_eq(ev[0].version, "brain.Event:2");
    ck_assert(!ev[0].has_value && ev[0].wall_time > 1.6e9);
    for (int i = 0; i < 5; i++) {
        ck_assert_str_eq(ev[i + 1].tag, tags[i % 3]);
        ck_assert_int_eq(ev[i + 1].step, steps[i]);
        ck_assert(ev[i + 1].has_value && ev[i + 1].value == (float)values[i]);
        ck_assert(ev[i + 1].wall_time >= ev[0].wall_time - 1);
    }
    ck_assert(isnan(ev[6].value) && ev[6].step == 7);
    ck_assert(ev[7].wall_time == 1234.5 && ev[7].value == 4.0f);
    free(path);
    free(sub);
    tu_rm_dir(dir);
}
END_TEST

START_TEST(test_summary_errors) {
    char *dir = tu_make_dir();
    char *file = tu_path_in(dir, "plain");
    tu_write_file(file, "x", 1);
    ck_assert(!nb_summary_open(file)); /* a file where the folder should be */
    ck_assert_int_eq(nb_last_status(), NB_EIO);
    ck_assert(strstr(nb_last_error(), file));
    ck_assert(!nb_summary_open(""));
    nb_summary *w = nb_summary_open(dir);
    ck_assert(w);
    ck_assert_int_eq(nb_summary_scalar(w, "", 1, 1.0), NB_EINVAL);
    ck_assert_int_eq(nb_summary_scalar(NULL, "a", 1, 1.0), NB_ENULL);
    /* a write that fails (the file size limit) is reported, and again on every later call */
    struct rlimit saved, lim;
    ck_assert(getrlimit(RLIMIT_FSIZE, &saved) == 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = saved;
    lim.rlim_cur = 200;
    ck_assert(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    nb_status s = NB_OK;
    for (int i = 0; i < 1000 && s == NB_OK; i++) s = nb_summary_scalar(w, "loss", i, 1.0);
    if (s == NB_OK) s = nb_summary_flush(w);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, prev);
    ck_assert_int_eq(s, NB_EIO);
    ck_assert_msg(strstr(nb_last_error(), "File too large"), "%s", nb_last_error());
    ck_assert_int_eq(nb_summary_scalar(w, "loss", 1, 1.0), NB_EIO);
    ck_assert_int_eq(nb_summary_close(w), NB_EIO);
    ck_assert(strstr(nb_last_error(), "events.out.tfevents."));
    ck_assert_int_eq(nb_summary_close(NULL), NB_OK);
    free(file);
    tu_rm_dir(dir);
}
END_TEST

/* ---- JSON lines ---------------------------------------------------------------------------- */
START_TEST(test_jsonl) {
    char *dir = tu_make_dir();
    char *path = tu_path_in(dir, "log.jsonl");
    nb_jsonl *j = nb_jsonl_open("prog", path, "w");
    ck_assert(j);
    nb_jsonl_begin(j);
    nb_jsonl_str(j, "type", "step");
    nb_jsonl_int(j, "step", -3);
    nb_jsonl_num(j, "loss", 0.5, 6);
    nb_jsonl_num(j, "nan", NAN, 6);
    nb_jsonl_num(j, "inf", -INFINITY, 2);
    nb_jsonl_num_g(j, "lr", 3e-4, 6);
    nb_jsonl_num_g(j, "ginf", INFINITY, 6);
    nb_jsonl_bool(j, "ok", true);
    nb_jsonl_str(j, "text", "a \"q\" \\ \n\t\x01 \xc3\xa9");
    nb_jsonl_str(j, "none", NULL);
    nb_jsonl_end(j);
    nb_jsonl_begin(j); /* an empty object */
    nb_jsonl_end(j);
    nb_jsonl_begin(j);
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    nb_jsonl_str(j, "big", big); /* longer than the first buffer */
    nb_jsonl_end(j);
    ck_assert(nb_jsonl_ok(j));
    ASSERT_OK(nb_jsonl_close(j));
    size_t n;
    char *text = (char *)tu_read_file(path, &n);
    const char *want = "{\"type\": \"step\", \"step\": -3, \"loss\": 0.500000, \"nan\": null, "
                       "\"inf\": null, \"lr\": 0.0003, \"ginf\": null, \"ok\": true, "
                       "\"text\": \"a \\\"q\\\" \\\\ \\u000a\\u0009\\u0001 \xc3\xa9\", "
                       "\"none\": null}\n{}\n{\"big\": \"";
    ck_assert_msg(!strncmp(text, want, strlen(want)), "%s", text);
    ck_assert_int_eq((int)n, (int)(strlen(want) + 2999 + 3));
    free(text);
    /* a NULL writer is a no-op everywhere */
    nb_jsonl_begin(NULL);
    nb_jsonl_num(NULL, "x", 1, 1);
    nb_jsonl_end(NULL);
    ASSERT_OK(nb_jsonl_close(NULL));
    char b[16];
    ck_assert_str_eq(nb_json_num(NAN, 3, b, sizeof b), "null");
    ck_assert_str_eq(nb_json_num(1.5, 3, b, sizeof b), "1.500");
    ck_assert(!nb_jsonl_open("prog", "/nonexistent/dir/log", "w"));
    ck_assert(strstr(nb_last_error(), "cannot open --log /nonexistent/dir/log"));
    free(path);
    tu_rm_dir(dir);
}
END_TEST

START_TEST(test_jsonl_write_error) {
    nb_jsonl *j = nb_jsonl_open("prog", "/dev/full", "w");
    ck_assert(j);
    for (int i = 0; i < 3; i++) {
        nb_jsonl_begin(j);
        nb_jsonl_int(j, "i", i);
        nb_jsonl_end(j);
        nb_jsonl_flush(j); /* warns once on stderr */
    }
    ck_assert(!nb_jsonl_ok(j));
    ck_assert_int_eq(nb_jsonl_close(j), NB_EIO);
    ck_assert_str_eq(nb_last_error(), "writing --log /dev/full failed: No space left on device");
}
END_TEST

/* ---- progress line ------------------------------------------------------------------------- */
START_TEST(test_progress) {
    FILE *f = tmpfile();
    nb_progress_opts o = nb_progress_defaults();
    o.total = 10;
    o.window = 2;
    o.unit = "tokens";
    o.out = f;
    nb_progress *p = nb_progress_new(&o);
    ck_assert(p && !nb_progress_live(p)); /* a file is never live */
    nb_progress_step(p, 1.0, 100);
    nb_progress_step(p, 1.0, 100);
    nb_progress_step(p, 0.5, 100); /* the recent window: the last two steps */
    ck_assert_double_eq_tol(nb_progress_rate(p), 300 / 2.5, 1e-9);
    ck_assert_double_eq_tol(nb_progress_recent_rate(p), 200 / 1.5, 1e-9);
    ck_assert_double_eq_tol(nb_progress_eta_s(p), 7 * 0.75, 1e-9);
    nb_progress_show(p, false, "not shown");
    nb_progress_show(p, true, "step %d", 3);
    nb_progress_free(p);
    o.live = 1;
    o.start = 9; /* resumed: one step left */
    o.window = 20;
    p = nb_progress_new(&o);
    nb_progress_step(p, 2.0, 10);
    nb_progress_show(p, false, "last"); /* the last step is always shown */
    nb_progress_break(p);
    nb_progress_free(p);
    rewind(f);
    char buf[512] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    ck_assert_str_eq(buf, "step 3  120 tokens/s (recent 133)  ETA 0:00:05\n"
                          "\rlast  5 tokens/s (recent 5)  ETA 0:00:00   \n");
    o = nb_progress_defaults();
    o.window = 0;
    ck_assert(!nb_progress_new(&o));
    ck_assert_int_eq(nb_last_status(), NB_EINVAL);
    /* under a launcher a terminal is not live either (its pseudo-terminal may be a file) */
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    ck_assert(nb_under_launcher());
    unsetenv("OMPI_COMM_WORLD_SIZE");
    char d[32];
    ck_assert_str_eq(nb_format_duration(3725.4, d, sizeof d), "1:02:05");
    ck_assert_str_eq(nb_format_duration(NAN, d, sizeof d), "0:00:00");
    double v[] = {5, 1, 3, 2};
    ck_assert(nb_median(v, 4) == 2.5 && nb_median(v, 3) == 2 && isnan(nb_median(v, 0)));
}
END_TEST

/* ---- parameter summary ------------------------------------------------------------------- */
START_TEST(test_module_summary) {
    nb_module *m = nb_sequential_new(nb_linear_new(784, 1024, NULL), nb_relu_new(),
                                     nb_linear_new(1024, 10, NULL), NULL);
    FILE *f = tmpfile();
    ASSERT_OK(nb_module_summary(m, f, 0));
    rewind(f);
    char buf[1024] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    ck_assert_str_eq(buf, "Sequential  (814,090 parameters)\n"
                          "  (0): Linear  weight [1024, 784]  bias [1024]  (803,840)\n"
                          "  (1): ReLU\n"
                          "  (2): Linear  weight [10, 1024]  bias [10]  (10,250)\n");
    ck_assert_str_eq(nb_module_child_name(m, 2), "2");
    ck_assert(!nb_module_child_name(m, 3));
    ck_assert_int_eq(nb_module_summary(NULL, f, 0), NB_ENULL);
    ck_assert_int_eq(nb_module_summary(m, f, -1), NB_EINVAL);
    fclose(f);
    nb_module_free(m);
}
END_TEST

/* ---- flags and settings ------------------------------------------------------------------ */
START_TEST(test_parse_flags) {
    int64_t i = 7;
    double x = 7;
    ck_assert(nb_parse_int("p", "--n", "42", 0, 100, &i) && i == 42);
    ck_assert(!nb_parse_int("p", "--n", "101", 0, 100, &i) && i == 42);
    ck_assert(!nb_parse_int("p", "--n", "4x", 0, 100, &i));
    ck_assert(nb_parse_num("p", "--lr", "0.5", 0, true, 1, false, &x) && x == 0.5);
    ck_assert(!nb_parse_num("p", "--lr", "0", 0, true, 1, false, &x));
    ck_assert(!nb_parse_num("p", "--lr", "nan", 0, true, 1, false, &x));
    ck_assert(!nb_parse_num("p", "--lr", "1e999", 0, true, INFINITY, false, &x) && x == 0.5);
    nb_run_config c = {0};
    nb_run_config_num(&c, "lr", 0.1);
    nb_run_config_int(&c, "seed", 3);
    nb_run_config_fixed(&c, "why");
    nb_checkpoint ck = {0};
    ck_assert(nb_run_config_apply(&c, &ck, "p", "lr"));
    ck_assert_int_eq(ck.nconfig, 2);
    ck_assert_str_eq(ck.config_values[0], "0.1");
    ck_assert_int_eq(ck.nmay_change, 1);
    ck_assert(!nb_run_config_apply(&c, &ck, "p", "seed"));
    ck_assert(!nb_run_config_apply(&c, &ck, "p", "bogus"));
}
END_TEST

Suite *nb_suite_run(void) {
    Suite *s = suite_create("run");
    TCase *tc = tcase_create("run");
    tcase_add_test(tc, test_crc32c);
    tcase_add_test(tc, test_summary_decodes);
    tcase_add_test(tc, test_summary_errors);
    tcase_add_test(tc, test_jsonl);
    tcase_add_test(tc, test_jsonl_write_error);
    tcase_add_test(tc, test_progress);
    tcase_add_test(tc, test_module_summary);
    tcase_add_test(tc, test_parse_flags);
    suite_add_tcase(s, tc);
    return s;
}
