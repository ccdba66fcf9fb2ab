/* test_cuda_policy.c - the "cuda_policy" suite: the CUDA allocator's and streams' decisions
 * (cuda/policy.c, compiled into this program) against a fake CUDA runtime that behaves as
 * the real one does where it matters: a query of a busy stream or event answers "not ready"
 * AND records it as the thread's last error, which a kernel launch check
 * (cudaGetLastError, as kernels_basic.cu does) then reports as the launch failing. Runs on
 * any machine; the plugin uses the same code with the real runtime (unverified on a GPU). */
#include <string.h>

#include "cuda/policy.h"
#include "testutil.h"

enum { OK = 0, NOT_READY = 600, ILLEGAL = 700, OOM = 2 };

typedef struct fake_stream {
    int enqueued, completed; /* work items: busy while completed < enqueued */
    int fail_query;          /* answer this error instead (a sticky device error) */
} fake_stream;
typedef struct fake_event {
    fake_stream *s;
    int target; /* done when s->completed >= target */
} fake_event;

static struct {
    int last_error;
    int get_last_error_calls, events_live, events_created, fail_record_at;
    fake_event pool[64];
    int npool;
} F;

static void fake_reset(void) { memset(&F, 0, sizeof F); F.fail_record_at = -1; }

static int f_stream_query(void *stream) {
    fake_stream *s = stream;
    int e = s->fail_query ? s->fail_query : s->completed < s->enqueued ? NOT_READY : OK;
    if (e != OK) F.last_error = e;
    return e;
}
static int f_event_query(void *event) {
    fake_event *ev = event;
    int e = ev->s->completed >= ev->target ? OK : NOT_READY;
    if (e != OK) F.last_error = e;
    return e;
}
static int f_get_last_error(void) {
    F.get_last_error_calls++;
    int e = F.last_error;
    F.last_error = OK;
    return e;
}
static int f_event_record_new(void **event, void *stream) {
    if (F.events_created == F.fail_record_at) {
        F.last_error = ILLEGAL;
        return ILLEGAL;
    }
    ck_assert_int_lt(F.npool, 64);
    fake_event *ev = &F.pool[F.npool++];
    ev->s = stream;
    ev->target = ev->s->enqueued;
    F.events_created++;
    F.events_live++;
    *event = ev;
    return OK;
}
static void f_event_destroy(void *event) {
    ck_assert_ptr_nonnull(event);
    F.events_live--;
}

static const nb__cuda_rt fake = {
    .success = OK,
    .not_ready = NOT_READY,
    .stream_query = f_stream_query,
    .event_query = f_event_query,
    .get_last_error = f_get_last_error,
    .event_record_new = f_event_record_new,
    .event_destroy = f_event_destroy,
};

/* A kernel launch as kernels_basic.cu checks it: the launch itself is fine, then
 * cudaGetLastError() decides. */
static int fake_launch(fake_stream *s) {
    s->enqueued++;
    int e = F.last_error;
    F.last_error = OK;
    return e;
}

/* Polling a busy stream leaves no "not ready" behind: the next launch succeeds. (A raw
 * query, as the allocator did before, makes the next good launch fail.) */
START_TEST(test_poll_clears_not_ready) {
    fake_reset();
    fake_stream s = {.enqueued = 3, .completed = 1};
    ck_assert_int_eq(f_stream_query(&s), NOT_READY);
    ck_assert_int_eq(fake_launch(&s), NOT_READY); /* the bug the poll avoids */

    fake_reset();
    ck_assert_int_eq(nb__cuda_poll_stream(&fake, &s), NB__POLL_BUSY);
    ck_assert_int_eq(F.get_last_error_calls, 1);
    ck_assert_int_eq(fake_launch(&s), OK);
    s.completed = s.enqueued;
    ck_assert_int_eq(nb__cuda_poll_stream(&fake, &s), NB__POLL_DONE);
    ck_assert_int_eq(F.get_last_error_calls, 1); /* nothing to clear after success */
    /* A real error: reported as failed (callers treat it as busy), not left behind. */
    s.fail_query = ILLEGAL;
    ck_assert_int_eq(nb__cuda_poll_stream(&fake, &s), NB__POLL_FAILED);
    ck_assert_int_eq(F.last_error, OK);
    /* Events too. */
    fake_stream t = {.enqueued = 1};
    void *ev = NULL;
    ck_assert_int_eq(f_event_record_new(&ev, &t), OK);
    ck_assert_int_eq(nb__cuda_poll_event(&fake, ev), NB__POLL_BUSY);
    ck_assert_int_eq(fake_launch(&t), OK);
    t.completed = 1;
    ck_assert_int_eq(nb__cuda_poll_event(&fake, ev), NB__POLL_DONE);
}
END_TEST

/* The streams noted on a block: its own and repeats ignored, a bounded list, dropped when
 * a stream is destroyed. */
START_TEST(test_uses_add) {
    nb__block_uses u = {0};
    fake_stream st[NB__CUDA_MAX_USES + 1];
    ck_assert(nb__uses_add(&u, 7, 7, &st[0])); /* its own stream */
    ck_assert_int_eq(u.n, 0);
    for (int i = 0; i < NB__CUDA_MAX_USES; i++) ck_assert(nb__uses_add(&u, 7, 100 + i, &st[i]));
    ck_assert(nb__uses_add(&u, 7, 100, &st[0])); /* already noted */
    ck_assert_int_eq(u.n, NB__CUDA_MAX_USES);
    ck_assert(!nb__uses_add(&u, 7, 999, &st[NB__CUDA_MAX_USES])); /* full: caller syncs */
    nb__uses_drop_stream(&u, 103);
    ck_assert_int_eq(u.n, NB__CUDA_MAX_USES - 1);
    for (int i = 0; i < u.n; i++) ck_assert(u.ids[i] != 103);
    nb__uses_drop_stream(&u, 12345); /* unknown: nothing */
    ck_assert_int_eq(u.n, NB__CUDA_MAX_USES - 1);
}
END_TEST

/* A block freed while two other streams still use it is reused only after both have
 * finished the work enqueued before the free; later work on them does not hold it. */
START_TEST(test_record_stream_events) {
    fake_reset();
    fake_stream a = {.enqueued = 2}, b = {.enqueued = 5, .completed = 4};
    nb__block_uses u = {0};
    ck_assert(nb__uses_add(&u, 1, 10, &a));
    ck_assert(nb__uses_add(&u, 1, 11, &b));
    ck_assert(nb__uses_record(&fake, &u)); /* the free */
    ck_assert_int_eq(u.n, 0);
    ck_assert_int_eq(u.nevents, 2);
    fake_launch(&a); /* work after the free does not matter */
    ck_assert(!nb__uses_settled(&fake, &u));
    ck_assert_int_eq(F.last_error, OK);
    a.completed = 2;
    ck_assert(!nb__uses_settled(&fake, &u)); /* b still reads it */
    ck_assert_int_eq(u.nevents, 1);
    b.completed = 5;
    ck_assert(nb__uses_settled(&fake, &u));
    ck_assert_int_eq(F.events_live, 0);
    ck_assert_int_eq(F.last_error, OK);
    ck_assert_int_eq(fake_launch(&a), OK);

    /* An event that cannot be recorded: false (the caller waits for the device), nothing
     * leaked, no error left behind. */
    fake_reset();
    F.fail_record_at = 1;
    nb__block_uses v = {0};
    ck_assert(nb__uses_add(&v, 1, 10, &a));
    ck_assert(nb__uses_add(&v, 1, 11, &b));
    ck_assert(!nb__uses_record(&fake, &v));
    ck_assert_int_eq(F.events_live, 0);
    ck_assert_int_eq(v.nevents, 0);
    ck_assert_int_eq(v.n, 0);
    ck_assert_int_eq(F.last_error, OK);
    /* nb__uses_clear after a device synchronize destroys what is pending. */
    fake_reset();
    nb__block_uses w = {0};
    ck_assert(nb__uses_add(&w, 1, 10, &a));
    a.enqueued++;
    ck_assert(nb__uses_record(&fake, &w));
    nb__uses_clear(&fake, &w);
    ck_assert_int_eq(F.events_live, 0);
    ck_assert(nb__uses_settled(&fake, &w));
}
END_TEST

START_TEST(test_copy_joins) {
    ck_assert(nb__copy_joins_source(0, 1));
    ck_assert(nb__copy_joins_source(3, 0));
    ck_assert(!nb__copy_joins_source(1, 1));
}
END_TEST

/* Out of memory names the request, its class, what nabla holds, what the retry gave back
 * and what the GPU has left. */
START_TEST(test_oom_message) {
    char buf[400], b[32];
    nb__cuda_bytes_str(b, sizeof b, 512);
    ck_assert_str_eq(b, "512 B");
    nb__cuda_bytes_str(b, sizeof b, 1536);
    ck_assert_str_eq(b, "1.50 KiB");
    nb__cuda_bytes_str(b, sizeof b, 3.0 * (1 << 30));
    ck_assert_str_eq(b, "3.00 GiB");
    const double gib = 1024.0 * 1024 * 1024;
    nb__oom_info o = {.device = 1, .requested = (size_t)(1.5 * gib), .class_size = (size_t)(1.5 * gib),
                      .stats = {.bytes_live = (int64_t)(70 * gib), .bytes_cached = 0},
                      .cached_released = (int64_t)(2 * gib),
                      .gpu_free = 512u << 20, .gpu_total = (size_t)(140 * gib)};
    nb__cuda_oom_message(buf, sizeof buf, &o);
    const char *want[] = {"cuda_alloc: out of memory on GPU 1: requested 1610612736 bytes "
                          "(1.50 GiB, class 1.50 GiB)",
                          "nabla holds 70.00 GiB in use and 0 B cached",
                          "2.00 GiB of cached blocks were given back to CUDA and the "
                          "allocation retried",
                          "the GPU has 512.00 MiB free of 140.00 GiB"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(buf, want[i]), "\"%s\" lacks \"%s\"", buf, want[i]);
    o = (nb__oom_info){.device = 0, .requested = 100, .class_size = 512,
                       .stats = {.bytes_live = 1024, .bytes_cached = 2048}};
    nb__cuda_oom_message(buf, sizeof buf, &o);
    ck_assert_msg(strstr(buf, "requested 100 bytes (100 B, class 512 B)"), "%s", buf);
    ck_assert_msg(strstr(buf, "1.00 KiB in use and 2.00 KiB cached (no cached block to give back)"), "%s", buf);
    ck_assert_msg(strstr(buf, "the GPU's free memory is unknown"), "%s", buf);
}
END_TEST

Suite *nb_suite_cuda_policy(void) {
    Suite *s = suite_create("cuda_policy");
    TCase *tc = tcase_create("cuda_policy");
    tcase_add_test(tc, test_poll_clears_not_ready);
    tcase_add_test(tc, test_uses_add);
    tcase_add_test(tc, test_record_stream_events);
    tcase_add_test(tc, test_copy_joins);
    tcase_add_test(tc, test_oom_message);
    suite_add_tcase(s, tc);
    return s;
}
