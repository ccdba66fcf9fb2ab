/* trace.c - the timeline trace and the op profiler (nabla/trace.h; the library's spans are
 * the macros of tensor/trace.h).
 *
 * Per thread: a stack of open spans, a ring of finished trace events and a table of profile
 * rows, all written by that thread alone (no lock per event). A ring is written out under
 * the one global lock when it is full (by its thread), at nb_trace_stop and at exit (by the
 * stopping thread): the writer publishes an event by advancing `head` (release), the
 * flusher consumes up to it and advances `tail` (release) under the lock. Thread states are
 * never freed while the process runs; the state of a thread that has ended is taken over by
 * the next new thread once its events are written.
 *
 * The file is the Chrome trace event format, object form: {"traceEvents": [...], ...}. ts is
 * in microseconds since the trace started (CLOCK_MONOTONIC), and "otherData" carries the
 * wall-clock time of ts 0 (nabla_clock_base_us) and the rank, which tools/merge-traces uses
 * to put the files of several ranks on one time axis. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "nabla/trace.h"
#include "tensor/error.h"
#include "tensor/trace.h"

int nb__trace_flags = NB__TRACE_UNINIT;

#define RING 16384     /* events per thread before the ring is written out */
#define MAXDEPTH 64    /* nesting recorded per thread (deeper spans are counted, not timed) */
#define PROWS 1024     /* distinct (name, kind) per thread in the profiler */
#define PATHMAX 4096

static const char *const cat_names[NB__CAT_COUNT] = {
    "op", "module", "backward", "gemm", "comm", "ddp", "data", "io", "optim", "user",
};

typedef struct ev {
    const char *name, *detail, *key;
    int64_t t0, dur;       /* ticks; an async pair: CLOCK_MONOTONIC ns and its length */
    int64_t flops, bytes;  /* X: work; C memory: in use, cached; async: id */
    int64_t val;           /* the value of key */
    double dval;           /* C user counter */
    char ph;               /* 'X', 'C' (memory), 'U' (user counter), 'A' (async pair) */
    unsigned char cat;
} ev;

typedef struct span {
    const char *name, *detail;
    int64_t t0, child;
    unsigned session, psession;
    unsigned char cat, flags;
} span;

typedef struct prow {
    const char *name; /* NULL: free slot (published last, release) */
    const char *detail;
    unsigned char cat;
    int64_t calls, total, self, flops, bytes;
} prow;

typedef struct tstate {
    struct tstate *next;
    int tid;
    const char *thread_name;
    int dead; /* atomic: the thread has ended */
    /* the trace ring */
    ev *evs;
    uint64_t head, tail; /* atomic */
    unsigned named_session; /* the thread_name event was written in this session */
    int64_t last_mem_ns; /* ticks */
    /* spans */
    span stack[MAXDEPTH];
    int depth;
    /* the profiler */
    unsigned psession;
    prow *rows;
    int64_t covered; /* ticks inside outermost spans (atomic) */
} tstate;

static struct {
    pthread_mutex_t mu;
    tstate *threads;
    /* the trace */
    unsigned session; /* atomic: incremented by every start and stop */
    char templ[PATHMAX], path[PATHMAX + 32];
    FILE *file;
    bool file_failed;
    int err_no;
    int64_t t0_ns;
    double base_us; /* wall clock (us since 1970) of ts 0 */
    int rank, size;
    bool started_by_env, profile_by_env;
    /* the profiler */
    unsigned psession; /* atomic */
    int64_t p0_ns, p1_ns; /* p1 0 while running */
    char ppath[PATHMAX];
    nb_profile_sort psort;
    /* interned names (user spans and counters) */
    char **interned;
    int ninterned, capinterned;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .size = 1};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_key_t g_key;
static _Thread_local tstate *tl;
static _Thread_local const char *tl_name;

static int flags_load(void) { return __atomic_load_n(&nb__trace_flags, __ATOMIC_RELAXED); }
static void flags_set(int bits, bool on) {
    if (on) __atomic_fetch_or(&nb__trace_flags, bits, __ATOMIC_RELAXED);
    else __atomic_fetch_and(&nb__trace_flags, ~bits, __ATOMIC_RELAXED);
}

int64_t nb__trace_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spans are timed in ticks: the time-stamp counter on x86-64, a few nanoseconds to read
 * where clock_gettime can cost 150 (virtual machines without a vDSO clock), and
 * CLOCK_MONOTONIC nanoseconds elsewhere. Ticks become nanoseconds of CLOCK_MONOTONIC
 * when written: the rate is measured over 2 ms at start and then over the whole time since
 * (refined whenever events are written or the table printed, with g.mu held). */
#if defined(__x86_64__)
static inline int64_t ticks(void) { return (int64_t)__builtin_ia32_rdtsc(); }
#else
static inline int64_t ticks(void) { return nb__trace_now_ns(); }
#endif
static struct {
    int64_t tick0, ns0;
    double ns_per_tick;
    int64_t ticks_20us;
} clk;

/* A (ns, ticks) pair read at one moment: the clock read between two tick reads, the
 * closest of a few tries (a thread preempted between the reads would skew the rate). */
static void sample(int64_t *ns, int64_t *t) {
    int64_t best = INT64_MAX;
    *ns = *t = 0;
    for (int i = 0; i < 16; i++) {
        int64_t a = ticks(), n = nb__trace_now_ns(), b = ticks();
        if (b - a < best) best = b - a, *ns = n, *t = a + (b - a) / 2;
    }
}

static void calibrate(void) {
    sample(&clk.ns0, &clk.tick0);
    int64_t ns, t;
    while (nb__trace_now_ns() - clk.ns0 < 2000000) {
    }
    sample(&ns, &t);
    clk.ns_per_tick = t > clk.tick0 ? (double)(ns - clk.ns0) / (double)(t - clk.tick0) : 1.0;
    clk.ticks_20us = (int64_t)(20000.0 / clk.ns_per_tick);
}

/* Measured when a trace or profile first starts, not before: off costs nothing. */
static pthread_once_t clk_once = PTHREAD_ONCE_INIT;
static void ensure_clock(void) { pthread_once(&clk_once, calibrate); }

static void refine_clock(void) { /* with g.mu held */
    int64_t ns, t;
    sample(&ns, &t);
    if (ns - clk.ns0 > 100000000 && t > clk.tick0)
        clk.ns_per_tick = (double)(ns - clk.ns0) / (double)(t - clk.tick0);
}

static int64_t ticks_to_ns(int64_t dt) { return (int64_t)((double)dt * clk.ns_per_tick); }
/* A tick count as CLOCK_MONOTONIC nanoseconds. */
static int64_t tick_time(int64_t t) { return clk.ns0 + ticks_to_ns(t - clk.tick0); }

/* ---- start-up: the environment ------------------------------------------------------------ */
static void at_exit(void);
static nb_status trace_start(const char *path);
static void profile_start(void);

static int env_int(const char *a, const char *b, const char *c, int dflt) {
    const char *names[3] = {a, b, c};
    for (int i = 0; i < 3; i++) {
        const char *v = names[i] ? getenv(names[i]) : NULL;
        if (v && *v) return atoi(v);
    }
    return dflt;
}

static void thread_gone(void *p) { __atomic_store_n(&((tstate *)p)->dead, 1, __ATOMIC_RELEASE); }

static void init_once(void) {
    pthread_key_create(&g_key, thread_gone);
    g.rank = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", 0);
    g.size = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", 1);
    if (g.rank < 0) g.rank = 0;
    if (g.size < 1) g.size = 1;
    int f = 0;
    const char *tr = getenv("NB_TRACE");
    const char *pr = getenv("NB_PROFILE");
    __atomic_store_n(&nb__trace_flags, 0, __ATOMIC_RELAXED);
    if (tr && *tr && trace_start(tr) == NB_OK) g.started_by_env = true, f = 1;
    if (pr && *pr && strcmp(pr, "0") != 0) {
        if (strcmp(pr, "1") != 0) snprintf(g.ppath, sizeof g.ppath, "%s", pr);
        const char *s = getenv("NB_PROFILE_SORT");
        g.psort = s && strcmp(s, "total") == 0   ? NB_PROFILE_SORT_TOTAL
                  : s && strcmp(s, "calls") == 0 ? NB_PROFILE_SORT_CALLS
                                                 : NB_PROFILE_SORT_SELF;
        profile_start();
        g.profile_by_env = true, f = 1;
    }
    if (f) atexit(at_exit);
}

static void ensure_init(void) { pthread_once(&g_once, init_once); }

/* The flags, after reading the environment if nobody has yet. */
static int flags_now(void) {
    int f = flags_load();
    if (f & NB__TRACE_UNINIT) {
        ensure_init();
        f = flags_load();
    }
    return f;
}

/* ---- thread states ------------------------------------------------------------------------- */
static void write_pending(tstate *t); /* with g.mu held */

static tstate *state(void) {
    if (tl) return tl;
    ensure_init();
    tstate *t = NULL;
    pthread_mutex_lock(&g.mu);
    /* Take over the state of an ended thread, unless it holds rows of the running profile
     * (its loader or communicator time must stay in the table). */
    unsigned ps = __atomic_load_n(&g.psession, __ATOMIC_RELAXED);
    for (tstate *s = g.threads; s; s = s->next) {
        if (__atomic_load_n(&s->dead, __ATOMIC_ACQUIRE) &&
            (!s->rows || __atomic_load_n(&s->psession, __ATOMIC_RELAXED) != ps)) {
            write_pending(s);
            t = s;
            break;
        }
    }
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t) {
            pthread_mutex_unlock(&g.mu);
            return NULL;
        }
        t->next = g.threads;
        g.threads = t;
    } else {
        __atomic_store_n(&t->dead, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&t->tail, __atomic_load_n(&t->head, __ATOMIC_RELAXED),
                         __ATOMIC_RELEASE);
        t->depth = 0;
        __atomic_store_n(&t->psession, 0, __ATOMIC_RELAXED); /* rows cleared at its first span */
        t->named_session = 0;
        t->last_mem_ns = 0;
    }
    t->tid = (int)syscall(SYS_gettid);
    t->thread_name = tl_name;
    pthread_mutex_unlock(&g.mu);
    pthread_setspecific(g_key, t);
    tl = t;
    return t;
}

void nb__trace_thread_name(const char *name) {
    tl_name = name;
    if (tl) tl->thread_name = name;
}

static const char *intern(const char *s) { /* a copy that lives as long as the process */
    if (!s) s = "(null)";
    pthread_mutex_lock(&g.mu);
    for (int i = 0; i < g.ninterned; i++) {
        if (strcmp(g.interned[i], s) == 0) {
            pthread_mutex_unlock(&g.mu);
            return g.interned[i];
        }
    }
    const char *r = NULL;
    if (g.ninterned == g.capinterned) {
        int cap = g.capinterned ? 2 * g.capinterned : 32;
        char **n = realloc(g.interned, sizeof(char *) * (size_t)cap);
        if (n) g.interned = n, g.capinterned = cap;
    }
    if (g.ninterned < g.capinterned && (g.interned[g.ninterned] = strdup(s)))
        r = g.interned[g.ninterned++];
    pthread_mutex_unlock(&g.mu);
    return r;
}

/* ---- writing the file ---------------------------------------------------------------------- */
/* The file is written through one buffer (with g.mu held): the formatting is done by hand,
 * since a W3 run writes a few thousand events per step and fprintf's float formatting and
 * per-character locking cost microseconds each. */
static struct {
    char b[1 << 16];
    size_t n;
} wb;

static void wflush(void) {
    if (wb.n && g.file) fwrite(wb.b, 1, wb.n, g.file);
    wb.n = 0;
}
static void wmem(const char *p, size_t n) {
    if (wb.n + n > sizeof wb.b) wflush();
    if (n > sizeof wb.b) { /* longer than the buffer: straight through */
        if (g.file) fwrite(p, 1, n, g.file);
        return;
    }
    memcpy(wb.b + wb.n, p, n);
    wb.n += n;
}
static void wlit(const char *s) { wmem(s, strlen(s)); }
static void wstr(const char *s) { /* a JSON string */
    wmem("\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') esc[0] = '\\', esc[1] = (char)*p, wmem(esc, 2);
        else if (*p < 0x20) wmem(esc, (size_t)snprintf(esc, sizeof esc, "\\u%04x", *p));
        else wmem((const char *)p, 1);
    }
    wmem("\"", 1);
}
static void wint(int64_t v) {
    char d[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do d[sizeof d - 1 - n++] = (char)('0' + u % 10); while ((u /= 10) && n < 23);
    if (v < 0) d[sizeof d - 1 - n++] = '-';
    wmem(d + sizeof d - n, (size_t)n);
}
/* v / 1000 with three decimals (nanoseconds as microseconds). */
static void wmilli(int64_t v) {
    if (v < 0) wmem("-", 1), v = -v;
    wint(v / 1000);
    char d[4] = {'.', (char)('0' + v / 100 % 10), (char)('0' + v / 10 % 10), (char)('0' + v % 10)};
    wmem(d, 4);
}
static void wkey(const char *k) { /* ,"k": */
    wmem(",\"", 2);
    wlit(k);
    wmem("\":", 2);
}
static void warg(const char *k, bool *first) { /* ,"args":{"k": then ,"k": */
    if (*first) wlit(",\"args\":{\""), *first = false;
    else wmem(",\"", 2);
    wlit(k);
    wmem("\":", 2);
}

/* The path for this rank: %r replaced, or ".rank<r>" appended with several ranks. */
static void rank_path(const char *templ, char *out, size_t n) {
    const char *r = strstr(templ, "%r");
    if (r) snprintf(out, n, "%.*s%d%s", (int)(r - templ), templ, g.rank, r + 2);
    else if (g.size > 1) snprintf(out, n, "%s.rank%d", templ, g.rank);
    else snprintf(out, n, "%s", templ);
}

static bool open_file(void) { /* with g.mu held */
    if (g.file) return true;
    if (g.file_failed || !g.templ[0]) return false;
    rank_path(g.templ, g.path, sizeof g.path);
    g.file = fopen(g.path, "w");
    if (!g.file) {
        g.file_failed = true;
        g.err_no = errno;
        return false;
    }
    fprintf(g.file, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"nabla\","
            "\"nabla_rank\":%d,\"nabla_size\":%d,\"nabla_clock_base_us\":%.3f},\n"
            "\"traceEvents\":[\n", g.rank, g.size, g.base_us);
    fprintf(g.file, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"name\":\"rank %d\"}},\n", g.rank, g.rank);
    fprintf(g.file, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
            "\"args\":{\"sort_index\":%d}}", g.rank, g.rank);
    return true;
}

static void write_event(const tstate *t, const ev *e) {
    int64_t ts = e->ph == 'A' ? e->t0 - g.t0_ns : tick_time(e->t0) - g.t0_ns;
    wlit(",\n{\"name\":");
    wstr(e->ph == 'C' ? "host memory" : e->name);
    wlit(",\"cat\":\"");
    wlit(e->ph == 'C' ? "memory" : e->ph == 'U' ? "user" : cat_names[e->cat]);
    wlit("\",\"ph\":\"");
    wlit(e->ph == 'X' ? "X" : e->ph == 'A' ? "b" : "C");
    wlit("\",\"ts\":");
    wmilli(ts);
    if (e->ph == 'X') wkey("dur"), wmilli(ticks_to_ns(e->dur));
    if (e->ph == 'A') wkey("id"), wint(e->flops);
    wkey("pid"), wint(g.rank);
    wkey("tid"), wint(t->tid);
    switch (e->ph) {
    case 'X':
        if (e->detail || e->key || e->flops || e->bytes) {
            bool first = true;
            if (e->detail) warg(e->cat == NB__CAT_GEMM ? "provider" : "kernel", &first), wstr(e->detail);
            if (e->key) warg(e->key, &first), wint(e->val);
            if (e->flops) warg("flops", &first), wint(e->flops);
            if (e->bytes) warg("bytes", &first), wint(e->bytes);
            wlit("}");
        }
        break;
    case 'C': /* MiB with three decimals */
        wlit(",\"args\":{\"in_use_mb\":");
        wmilli(e->flops * 1000 / 1048576);
        wkey("cached_mb"), wmilli(e->bytes * 1000 / 1048576);
        wlit("}");
        break;
    case 'U': {
        char v[40];
        wlit(",\"args\":{\"value\":");
        wmem(v, (size_t)snprintf(v, sizeof v, "%.17g", isfinite(e->dval) ? e->dval : 0.0));
        wlit("}");
        break;
    }
    case 'A': /* the end of the pair */
        if (e->key) wlit(",\"args\":{\""), wlit(e->key), wlit("\":"), wint(e->val), wlit("}");
        wlit("},\n{\"name\":");
        wstr(e->name);
        wlit(",\"cat\":\"");
        wlit(cat_names[e->cat]);
        wlit("\",\"ph\":\"e\",\"ts\":");
        wmilli(ts + e->dur);
        wkey("id"), wint(e->flops);
        wkey("pid"), wint(g.rank);
        wkey("tid"), wint(t->tid);
        break;
    }
    wlit("}");
}

static void write_thread_name(tstate *t) {
    if (t->named_session == g.session) return;
    t->named_session = g.session;
    char buf[64];
    const char *name = t->thread_name;
    if (!name) {
        snprintf(buf, sizeof buf, t->tid == (int)getpid() ? "main" : "thread %d", t->tid);
        name = buf;
    }
    wlit(",\n{\"name\":\"thread_name\",\"ph\":\"M\"");
    wkey("pid"), wint(g.rank);
    wkey("tid"), wint(t->tid);
    wlit(",\"args\":{\"name\":");
    wstr(name);
    wlit("}}");
}

/* Write t's finished events (with g.mu held); dropped when there is no file to write to. */
static void write_pending(tstate *t) {
    uint64_t tail = __atomic_load_n(&t->tail, __ATOMIC_RELAXED);
    uint64_t head = __atomic_load_n(&t->head, __ATOMIC_ACQUIRE);
    if (head == tail) return;
    if ((flags_load() & NB__TRACE_TRACING) && open_file()) {
        write_thread_name(t);
        refine_clock();
        for (uint64_t i = tail; i < head; i++) write_event(t, &t->evs[i % RING]);
        wflush();
    }
    __atomic_store_n(&t->tail, head, __ATOMIC_RELEASE);
}

static void push(tstate *t, const ev *e) {
    if (!t->evs && !(t->evs = malloc(sizeof(ev) * RING))) return;
    uint64_t head = __atomic_load_n(&t->head, __ATOMIC_RELAXED);
    if (head - __atomic_load_n(&t->tail, __ATOMIC_ACQUIRE) >= RING) {
        pthread_mutex_lock(&g.mu);
        write_pending(t);
        pthread_mutex_unlock(&g.mu);
        if (head - __atomic_load_n(&t->tail, __ATOMIC_ACQUIRE) >= RING) return;
    }
    t->evs[head % RING] = *e;
    __atomic_store_n(&t->head, head + 1, __ATOMIC_RELEASE);
}

/* ---- the profiler's rows ------------------------------------------------------------------- */
/* A thread's rows belong to one profile (psession); the owner clears them lazily at its
 * first span of a new one and then publishes the session (release), which readers check
 * (acquire) before reading the rows. */
static void prof_reset_if_stale(tstate *t, unsigned ps) {
    if (t->psession == ps) return;
    __atomic_store_n(&t->psession, 0, __ATOMIC_RELAXED);
    if (!t->rows) {
        prow *r = calloc(PROWS, sizeof(prow));
        if (!r) return;
        __atomic_store_n(&t->rows, r, __ATOMIC_RELEASE);
    } else {
        memset(t->rows, 0, sizeof(prow) * PROWS);
    }
    __atomic_store_n(&t->covered, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&t->psession, ps, __ATOMIC_RELEASE);
}

static void add64(int64_t *p, int64_t v) {
    __atomic_store_n(p, __atomic_load_n(p, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
}

static void prof_add(tstate *t, const span *s, int64_t dur, int64_t flops, int64_t bytes) {
    if (!t->rows) return;
    uintptr_t h = ((uintptr_t)s->name >> 3) * 31u + ((uintptr_t)s->detail >> 3) * 17u + s->cat;
    for (int probe = 0; probe < PROWS; probe++) {
        prow *r = &t->rows[(h + (uintptr_t)probe) % PROWS];
        const char *n = __atomic_load_n(&r->name, __ATOMIC_RELAXED);
        if (!n) {
            r->detail = s->detail;
            r->cat = s->cat;
            __atomic_store_n(&r->name, s->name, __ATOMIC_RELEASE);
        } else if (n != s->name || r->detail != s->detail || r->cat != s->cat) {
            continue;
        }
        add64(&r->calls, 1);
        add64(&r->total, dur);
        add64(&r->self, dur - s->child > 0 ? dur - s->child : 0);
        if (flops) add64(&r->flops, flops);
        if (bytes) add64(&r->bytes, bytes);
        return;
    }
}

/* ---- spans --------------------------------------------------------------------------------- */
int nb__span_begin(const char *name, const char *detail, nb__cat cat) {
    int f = flags_now();
    if (!f) return 0;
    tstate *t = state();
    if (!t) return 0;
    if (t->depth < MAXDEPTH) {
        span *s = &t->stack[t->depth];
        s->name = name, s->detail = detail, s->cat = (unsigned char)cat;
        s->flags = (unsigned char)f;
        s->session = __atomic_load_n(&g.session, __ATOMIC_RELAXED);
        s->psession = __atomic_load_n(&g.psession, __ATOMIC_RELAXED);
        s->child = 0;
        s->t0 = ticks();
    }
    return ++t->depth;
}

static void span_finish(int tok, int64_t flops, int64_t bytes, const char *key, int64_t val) {
    tstate *t = tl;
    if (!t || tok <= 0 || tok > t->depth) return; /* not recorded, or closed already */
    t->depth = tok - 1;                           /* also closes spans left open inside */
    if (tok > MAXDEPTH) return;
    span *s = &t->stack[tok - 1];
    int64_t now = ticks(), dur = now - s->t0;
    if (tok >= 2) t->stack[tok - 2].child += dur;
    int f = flags_load();
    if ((f & s->flags & NB__TRACE_TRACING) &&
        s->session == __atomic_load_n(&g.session, __ATOMIC_RELAXED)) {
        ev e = {.name = s->name, .detail = s->detail, .key = key, .val = val, .t0 = s->t0,
                .dur = dur, .flops = flops, .bytes = bytes, .ph = 'X', .cat = s->cat};
        push(t, &e);
    }
    unsigned ps = __atomic_load_n(&g.psession, __ATOMIC_RELAXED);
    if ((f & s->flags & NB__TRACE_PROFILING) && s->psession == ps) {
        prof_reset_if_stale(t, ps);
        prof_add(t, s, dur, flops, bytes);
        if (tok == 1) add64(&t->covered, dur);
    }
}

void nb__span_end(int tok, int64_t flops, int64_t bytes) { span_finish(tok, flops, bytes, NULL, 0); }
void nb__span_end_arg(int tok, const char *key, int64_t value) {
    span_finish(tok, 0, 0, key, value);
}

void nb__trace_async(const char *name, nb__cat cat, int64_t id, int64_t t0_ns, int64_t t1_ns,
                     const char *key, int64_t value) {
    if (!(flags_now() & NB__TRACE_TRACING)) return;
    tstate *t = state();
    if (!t) return;
    ev e = {.name = name, .key = key, .val = value, .t0 = t0_ns, .dur = t1_ns - t0_ns,
            .flops = id, .ph = 'A', .cat = (unsigned char)cat};
    push(t, &e);
}

void nb__trace_memory(int64_t in_use, int64_t cached) {
    if (!(flags_now() & NB__TRACE_TRACING)) return;
    tstate *t = state();
    if (!t) return;
    int64_t now = ticks();
    if (t->last_mem_ns && now - t->last_mem_ns < clk.ticks_20us) return;
    t->last_mem_ns = now;
    ev e = {.name = "host memory", .t0 = now, .flops = in_use, .bytes = cached, .ph = 'C'};
    push(t, &e);
}

/* ---- the public trace API ------------------------------------------------------------------ */
nb_status nb_trace_start(const char *path) {
    ensure_init();
    return trace_start(path);
}

static nb_status trace_start(const char *path) {
    ensure_clock();
    if (!path || !*path) return nb__error(NB_EINVAL, "trace_start: the path is empty");
    if (strlen(path) >= PATHMAX - 32)
        return nb__error(NB_EINVAL, "trace_start: the path is %zu characters long (at most %d)",
                         strlen(path), PATHMAX - 32);
    pthread_mutex_lock(&g.mu);
    if (flags_load() & NB__TRACE_TRACING) {
        pthread_mutex_unlock(&g.mu);
        return nb__error(NB_ESTATE, "trace_start: a trace is already being written to %s; "
                         "call nb_trace_stop first", g.templ);
    }
    snprintf(g.templ, sizeof g.templ, "%s", path);
    g.path[0] = '\0';
    g.file_failed = false;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    g.t0_ns = nb__trace_now_ns();
    g.base_us = (double)rt.tv_sec * 1e6 + (double)rt.tv_nsec / 1e3;
    __atomic_fetch_add(&g.session, 1, __ATOMIC_RELAXED);
    for (tstate *t = g.threads; t; t = t->next) /* forget events of an earlier trace */
        __atomic_store_n(&t->tail, __atomic_load_n(&t->head, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);
    flags_set(NB__TRACE_TRACING, true);
    pthread_mutex_unlock(&g.mu);
    return NB_OK;
}

nb_status nb_trace_stop(void) {
    ensure_init();
    pthread_mutex_lock(&g.mu);
    if (!(flags_load() & NB__TRACE_TRACING)) {
        pthread_mutex_unlock(&g.mu);
        return NB_OK;
    }
    nb_status st = NB_OK;
    if (open_file()) {
        for (tstate *t = g.threads; t; t = t->next) write_pending(t);
        wlit("\n]}\n");
        wflush();
        if (fclose(g.file) != 0) st = nb__error(NB_EIO, "trace_stop: writing %s failed", g.path);
        g.file = NULL;
    } else {
        st = nb__error(NB_EIO, "trace_stop: cannot write the trace to %s: %s", g.path,
                       strerror(g.err_no));
    }
    flags_set(NB__TRACE_TRACING, false);
    __atomic_fetch_add(&g.session, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g.mu);
    return st;
}

bool nb_trace_enabled(void) {
    ensure_init();
    return flags_load() & NB__TRACE_TRACING;
}

const char *nb_trace_path(void) { return g.path; }

void nb_trace_set_rank(int rank, int size) {
    ensure_init();
    pthread_mutex_lock(&g.mu);
    if (rank >= 0 && size >= 1 && rank < size) g.rank = rank, g.size = size;
    pthread_mutex_unlock(&g.mu);
}

void nb_trace_begin(const char *name) {
    if (!NB__TRACE_ACTIVE()) return;
    const char *n = intern(name);
    if (n) nb__span_begin(n, NULL, NB__CAT_USER);
}

void nb_trace_end(void) {
    tstate *t = tl;
    if (!t || t->depth == 0) return;
    /* the innermost user span */
    for (int d = t->depth < MAXDEPTH ? t->depth : MAXDEPTH; d > 0; d--) {
        if (t->stack[d - 1].cat == NB__CAT_USER) {
            nb__span_end(d, 0, 0);
            return;
        }
    }
}

void nb_trace_counter(const char *name, double value) {
    if (!(flags_now() & NB__TRACE_TRACING)) return;
    const char *n = intern(name);
    tstate *t = state();
    if (!n || !t) return;
    ev e = {.name = n, .t0 = ticks(), .dval = value, .ph = 'U'};
    push(t, &e);
}

/* ---- the profiler -------------------------------------------------------------------------- */
nb_status nb_profile_start(void) {
    ensure_init();
    profile_start();
    return NB_OK;
}

static void profile_start(void) {
    ensure_clock();
    pthread_mutex_lock(&g.mu);
    __atomic_fetch_add(&g.psession, 1, __ATOMIC_RELAXED);
    g.p0_ns = nb__trace_now_ns();
    g.p1_ns = 0;
    flags_set(NB__TRACE_PROFILING, true);
    pthread_mutex_unlock(&g.mu);
}

void nb_profile_stop(void) {
    ensure_init();
    pthread_mutex_lock(&g.mu);
    if ((flags_load() & NB__TRACE_PROFILING) && !g.p1_ns) g.p1_ns = nb__trace_now_ns();
    flags_set(NB__TRACE_PROFILING, false);
    pthread_mutex_unlock(&g.mu);
}

bool nb_profile_enabled(void) {
    ensure_init();
    return flags_load() & NB__TRACE_PROFILING;
}

typedef struct mrow {
    const char *name, *kind;
    unsigned char cat;
    int64_t calls, total, self, flops, bytes;
} mrow;

static const char *kind_of(const char *detail, unsigned char cat) {
    return cat == NB__CAT_OP && detail ? detail : cat_names[cat];
}

/* The rows of every thread of the current profile, merged by (name, kind); *covered the most
 * time inside outermost spans of one thread. Caller frees. With g.mu held. */
static mrow *merged(int *n, int64_t *covered) {
    int cap = 64, k = 0;
    mrow *m = malloc(sizeof(mrow) * (size_t)cap);
    *covered = 0;
    refine_clock();
    unsigned ps = __atomic_load_n(&g.psession, __ATOMIC_RELAXED);
    for (tstate *t = g.threads; m && t; t = t->next) {
        if (__atomic_load_n(&t->psession, __ATOMIC_ACQUIRE) != ps ||
            !__atomic_load_n(&t->rows, __ATOMIC_ACQUIRE))
            continue;
        int64_t c = __atomic_load_n(&t->covered, __ATOMIC_RELAXED);
        if (c > *covered) *covered = c;
        for (int i = 0; i < PROWS; i++) {
            prow *r = &t->rows[i];
            const char *name = __atomic_load_n(&r->name, __ATOMIC_ACQUIRE);
            if (!name) continue;
            const char *kind = kind_of(r->detail, r->cat);
            int j = 0;
            while (j < k && !(m[j].cat == r->cat && strcmp(m[j].name, name) == 0 &&
                              strcmp(m[j].kind, kind) == 0))
                j++;
            if (j == k) {
                if (k == cap) {
                    mrow *nm = realloc(m, sizeof(mrow) * (size_t)(cap *= 2));
                    if (!nm) break;
                    m = nm;
                }
                m[k++] = (mrow){.name = name, .kind = kind, .cat = r->cat};
            }
            m[j].calls += __atomic_load_n(&r->calls, __ATOMIC_RELAXED);
            m[j].total += __atomic_load_n(&r->total, __ATOMIC_RELAXED);
            m[j].self += __atomic_load_n(&r->self, __ATOMIC_RELAXED);
            m[j].flops += __atomic_load_n(&r->flops, __ATOMIC_RELAXED);
            m[j].bytes += __atomic_load_n(&r->bytes, __ATOMIC_RELAXED);
        }
    }
    for (int j = 0; j < k; j++) m[j].total = ticks_to_ns(m[j].total), m[j].self = ticks_to_ns(m[j].self);
    *covered = ticks_to_ns(*covered);
    *n = k;
    return m;
}

static int64_t wall_ns(void) {
    if (!g.p0_ns) return 0;
    return (g.p1_ns ? g.p1_ns : nb__trace_now_ns()) - g.p0_ns;
}

static nb_profile_sort g_sort;
static int cmp_rows(const void *a, const void *b) {
    const mrow *x = a, *y = b;
    int64_t kx = g_sort == NB_PROFILE_SORT_TOTAL ? x->total
                 : g_sort == NB_PROFILE_SORT_CALLS ? x->calls : x->self;
    int64_t ky = g_sort == NB_PROFILE_SORT_TOTAL ? y->total
                 : g_sort == NB_PROFILE_SORT_CALLS ? y->calls : y->self;
    if (kx != ky) return kx < ky ? 1 : -1;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->kind, y->kind);
}

/* A row's numeric cells of the profile table (cells 2-8; 0 and 1 are its name and kind). */
enum { PCOLS = 9 };
static void profile_cells(const mrow *r, int64_t wall, char cell[PCOLS][64]) {
    snprintf(cell[2], 64, "%lld", (long long)r->calls);
    snprintf(cell[3], 64, "%.3f", (double)r->total / 1e6);
    snprintf(cell[4], 64, "%.3f", (double)r->self / 1e6);
    snprintf(cell[5], 64, "%.2f", wall ? 100.0 * (double)r->self / (double)wall : 0.0);
    snprintf(cell[6], 64, "%.2f", r->calls ? (double)r->total / 1e3 / (double)r->calls : 0.0);
    snprintf(cell[7], 64, "-");
    snprintf(cell[8], 64, "-");
    if (r->flops && r->total) snprintf(cell[7], 64, "%.2f", (double)r->flops / (double)r->total);
    if (r->bytes && r->total) snprintf(cell[8], 64, "%.2f", (double)r->bytes / (double)r->total);
}

nb_status nb_profile_print(FILE *f, nb_profile_sort sort) {
    if (!f) return nb__error(NB_ENULL, "profile_print: the FILE is NULL");
    if ((unsigned)sort > NB_PROFILE_SORT_CALLS)
        return nb__error(NB_EINVAL, "profile_print: sort %d is not an nb_profile_sort", (int)sort);
    ensure_init();
    pthread_mutex_lock(&g.mu);
    int n = 0;
    int64_t covered = 0, wall = wall_ns();
    mrow *m = merged(&n, &covered);
    if (!m) {
        pthread_mutex_unlock(&g.mu);
        return nb__error(NB_ENOMEM, "profile_print: out of memory");
    }
    g_sort = sort;
    qsort(m, (size_t)n, sizeof *m, cmp_rows);
    static const char *const sort_names[] = {"self", "total", "calls"};
    double wall_ms = (double)wall / 1e6;
    fprintf(f, "nabla profile, rank %d of %d: %.3f ms of wall time, %d rows, sorted by %s\n",
            g.rank, g.size, wall_ms, n, sort_names[sort]);
    /* The columns as wide as their longest cell: the names and kinds whole, and the numbers
     * right-aligned under their headings (two passes over the rows: measure, then print). */
    static const char *const head[PCOLS] = {"Name",   "Kind",   "Calls",   "Total ms", "Self ms",
                                            "Self %", "Avg us", "GFLOP/s", "GB/s"};
    int w[PCOLS];
    for (int c = 0; c < PCOLS; c++) w[c] = (int)strlen(head[c]);
    char cell[PCOLS][64];
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            for (int c = 0; c < PCOLS; c++)
                fprintf(f, c < 2 ? "%-*s%s" : "%*s%s", w[c], head[c], c + 1 < PCOLS ? " " : "\n");
        }
        for (int i = 0; i < n; i++) {
            const mrow *r = &m[i];
            profile_cells(r, wall, cell);
            for (int c = 0; c < PCOLS; c++) {
                const char *v = c == 0 ? r->name : c == 1 ? r->kind : cell[c];
                int len = (int)strlen(v);
                if (pass == 0 && len > w[c]) w[c] = len;
                if (pass == 1)
                    fprintf(f, c < 2 ? "%-*s%s" : "%*s%s", w[c], v, c + 1 < PCOLS ? " " : "\n");
            }
        }
    }
    fprintf(f, "wall %.3f ms; inside outermost spans %.3f ms (%.1f%%) on the busiest thread; "
            "untracked %.3f ms\n", wall_ms, (double)covered / 1e6,
            wall ? 100.0 * (double)covered / (double)wall : 0.0,
            (double)(wall - covered) / 1e6);
    free(m);
    pthread_mutex_unlock(&g.mu);
    return NB_OK;
}

bool nb_profile_row_get(const char *name, const char *kind, nb_profile_row *out) {
    if (!name) return false;
    ensure_init();
    pthread_mutex_lock(&g.mu);
    int n = 0;
    int64_t covered;
    mrow *m = merged(&n, &covered);
    nb_profile_row r = {0};
    bool found = false;
    for (int i = 0; m && i < n; i++) {
        if (strcmp(m[i].name, name) != 0 || (kind && strcmp(m[i].kind, kind) != 0)) continue;
        found = true;
        r.calls += m[i].calls;
        r.total_s += (double)m[i].total / 1e9;
        r.self_s += (double)m[i].self / 1e9;
        r.flops += m[i].flops;
        r.bytes += m[i].bytes;
    }
    free(m);
    pthread_mutex_unlock(&g.mu);
    if (out) *out = r;
    return found;
}

void nb_profile_get_totals(nb_profile_totals *out) {
    if (!out) return;
    ensure_init();
    pthread_mutex_lock(&g.mu);
    int n = 0;
    int64_t covered = 0;
    mrow *m = merged(&n, &covered);
    free(m);
    out->wall_s = (double)wall_ns() / 1e9;
    out->covered_s = (double)covered / 1e9;
    out->rows = n;
    pthread_mutex_unlock(&g.mu);
}

/* ---- exit ---------------------------------------------------------------------------------- */
static void at_exit(void) {
    if (g.profile_by_env && (flags_load() & NB__TRACE_PROFILING)) {
        nb_profile_stop();
        FILE *f = stderr;
        char path[PATHMAX + 32];
        if (g.ppath[0]) {
            rank_path(g.ppath, path, sizeof path);
            f = fopen(path, "w");
            if (!f) {
                fprintf(stderr, "NB_PROFILE: cannot write %s: %s\n", path, strerror(errno));
                f = stderr;
            }
        }
        nb_profile_print(f, g.psort);
        if (f != stderr) fclose(f);
    }
    if (g.started_by_env) {
        if (nb_trace_stop() != NB_OK) fprintf(stderr, "NB_TRACE: %s\n", nb_last_error());
    }
}
