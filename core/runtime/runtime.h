/*
 * core/runtime/runtime.h - the runtime's building blocks, one small module each:
 * clock, log, arena, metrics, scope, pool, budget, admission line, rate limiter.
 *
 * These are the mechanisms of docs/architecture.md without any HTTP in them, so each can be unit
 * tested alone. core/http glues them to libmicrohttpd (suspend/resume, holds) and the host
 * table exposes them to plugins. Internal prefix: rt_. Functions that can fail return a
 * negative enum atrium_err (include/atrium/abi.h) or NULL. The runtime object, which holds
 * the running instances of these for the whole process, is core_runtime.h.
 */
#ifndef ATRIUM_CORE_RUNTIME_H
#define ATRIUM_CORE_RUNTIME_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "atrium/abi.h"

/* A function whose result must be looked at: its failure (a database statement or commit,
 * a token issued, a hash, memory returned) has to be handled, so the compiler refuses a
 * call that drops the result. A caller that may rightly ignore one says why in a comment
 * and writes RT_IGNORE(call): with GCC a cast to void alone does not quiet the warning. */
#define RT_MUST_CHECK __attribute__((warn_unused_result))
#define RT_IGNORE(call) ((void)!(call))

/* ---- clock ---------------------------------------------------------------------------- */
int64_t rt_now_ms(void);  /* CLOCK_MONOTONIC in milliseconds: for deadlines */
int64_t rt_wall_ms(void); /* CLOCK_REALTIME in milliseconds: for timestamps */

/* ---- hashing -------------------------------------------------------------------------- */

/* FNV-1a (64-bit) of a NUL-terminated text, for keys this process chooses (SQL texts,
 * route segments); keys others choose go through keytab.c's keyed SipHash instead. */
uint64_t rt_text_hash(const char *s);

/* ---- log ------------------------------------------------------------------------------ */
/* One line per call on stderr, written with a single write(2) so lines never interleave:
 *   2026-11-29T14:05:12.123Z atrium-a INFO  [req 7f3a] message
 * The request id comes from the scope (ATRIUM_SCOPE_REQUEST_ID) when one is published.
 * `origin` names the writer ("core", a plugin name); may be NULL. Any thread. */
void rt_log_set_level(int level); /* enum atrium_log_level */
int rt_log_level(void);
/* The instance name every later line carries after its timestamp (server.instance_name;
 * at most 64 bytes kept). Main thread, at start-up before other threads exist. */
void rt_log_set_instance(const char *name);
/* That name ("" before it is set). Any thread. */
const char *rt_log_instance_name(void);
int rt_log_level_parse(const char *name); /* "error|warn|info|debug" -> level, or -1 */
void rt_log(int level, const char *origin, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void rt_vlog(int level, const char *origin, const char *fmt, va_list ap);
/* ERROR and WARN lines whose text repeats within this interval are counted, not written
 * (log.c); 0 writes every line. Default 10 s. Any thread. */
void rt_log_set_repeat_interval_ms(int ms);
/* Invariant checks that stay on in every build type (CMake's RelWithDebInfo defines NDEBUG,
 * which silences assert(3)). On failure: one ERROR log line naming the file, line, the
 * condition and the formatted context, then abort(). Any thread. */
#define RT_ASSERT(cond, ...)                                                             \
    do {                                                                                 \
        if (__builtin_expect(!(cond), 0))                                                \
            rt_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                      \
    } while (0)
_Noreturn void rt_assert_fail(const char *file, int line, const char *cond, const char *fmt,
                              ...) __attribute__((format(printf, 4, 5)));

/* ---- arena ---------------------------------------------------------------------------- */
/* Bump allocator for memory that lives as long as a request. Not thread-safe: one owner at
 * a time (the thread that owns the request). Freed whole, never piecemeal. */
typedef struct rt_arena rt_arena;
rt_arena *rt_arena_new(size_t chunk_bytes);
/* 16-byte aligned, zeroed; NULL on OOM. */
void *rt_arena_alloc(rt_arena *a, size_t size) RT_MUST_CHECK;
char *rt_arena_strdup(rt_arena *a, const char *s) RT_MUST_CHECK;
char *rt_arena_strndup(rt_arena *a, const char *s, size_t n) RT_MUST_CHECK;
char *rt_arena_printf(rt_arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3))) RT_MUST_CHECK;
size_t rt_arena_used(const rt_arena *a);
void rt_arena_free(rt_arena *a);
/* Take back everything a handed out, keeping one chunk, for the next owner to reuse
 * (request.c keeps a few reset arenas instead of freeing them). Afterwards check
 * rt_arena_usable: false when no chunk could be kept (out of memory), and the arena is
 * then only for rt_arena_free. */
void rt_arena_reset(rt_arena *a);
bool rt_arena_usable(const rt_arena *a);

/* ---- metrics -------------------------------------------------------------------------- */
/* A registry of counters, gauges and histograms rendered in Prometheus text format.
 * Registration: any thread (takes the registry lock). Updates: any thread, lock-free
 * (atomics). A metric is identified by name + label string ("pool=\"media\""); registering
 * the same pair twice returns the existing metric when the type matches, else NULL. */
typedef struct rt_metrics rt_metrics;
typedef struct rt_metric rt_metric;
enum rt_metric_type { RT_COUNTER, RT_GAUGE, RT_HISTOGRAM };
rt_metrics *rt_metrics_new(void);
void rt_metrics_free(rt_metrics *reg);
rt_metric *rt_metric_counter(rt_metrics *reg, const char *name, const char *labels,
                             const char *help);
rt_metric *rt_metric_gauge(rt_metrics *reg, const char *name, const char *labels,
                           const char *help);
/* Histogram in milliseconds with fixed buckets (upper bounds, ascending, +Inf implied). */
rt_metric *rt_metric_histogram(rt_metrics *reg, const char *name, const char *labels,
                               const char *help, const double *buckets, size_t n_buckets);
void rt_metric_add(rt_metric *m, int64_t delta); /* counter or gauge; NULL m is a no-op */
void rt_metric_set(rt_metric *m, int64_t value); /* gauge */
void rt_metric_observe(rt_metric *m, double value);
int64_t rt_metric_value(const rt_metric *m); /* counter/gauge value; histogram count */
/* Render every metric; the caller frees the result with free(). */
char *rt_metrics_render(rt_metrics *reg, size_t *len);
/* Format one label pair `name="value"` into buf (size bytes), escaping backslash, double
 * quote and newline in value as the exposition format requires. Returns the length written,
 * or ATRIUM_E_LIMIT when it does not fit (buf then holds ""). Any thread. */
int rt_metric_label(char *buf, size_t size, const char *name, const char *value);
#define RT_METRIC_LABELS_MAX_BYTES 256 /* room for the label string of a pool, line, ... */

/* ---- scope ---------------------------------------------------------------------------- */
/* Thread-local frames with typed keys (enum atrium_scope_key). A frame is a stack object
 * pushed by RT_SCOPE and popped by its cleanup attribute, so no path can leak one. Frames
 * nest; a lookup returns the innermost value for the key. */
typedef struct rt_scope_frame {
    struct rt_scope_frame *outer;
    int key;
    void *value;
} rt_scope_frame;
void rt_scope_push(rt_scope_frame *f, int key, void *value);
void rt_scope_pop(rt_scope_frame *f); /* asserts f is the innermost frame */
void *rt_scope_get(int key);          /* innermost value, or NULL */
bool rt_scope_has(int key);
#define RT_SCOPE_CAT_(a, b) a##b
#define RT_SCOPE_CAT(a, b) RT_SCOPE_CAT_(a, b)
#define RT_SCOPE(key, value)                                                            \
    rt_scope_frame RT_SCOPE_CAT(rt_scope_f_, __LINE__) __attribute__((cleanup(rt_scope_pop))); \
    rt_scope_push(&RT_SCOPE_CAT(rt_scope_f_, __LINE__), (key), (void *)(value))
/* Save/restore the whole chain (a pool runs each task with an empty chain). */
rt_scope_frame *rt_scope_current(void);
void rt_scope_set_current(rt_scope_frame *top);
/* Wait on cv (whose mutex m the caller holds) until signalled or deadline_ms (monotonic;
 * <= 0 = no deadline). While waiting, the lock published as ATRIUM_SCOPE_LOCK (if any and
 * if it is not m) is released, and re-acquired before returning. Returns 0 when signalled,
 * ATRIUM_E_TIMEOUT at the deadline. The cv must use CLOCK_MONOTONIC (rt_cond_init). */
int rt_scope_wait(pthread_cond_t *cv, pthread_mutex_t *m, int64_t deadline_ms);
int rt_cond_init(pthread_cond_t *cv); /* condattr with CLOCK_MONOTONIC */

/* ---- pool ----------------------------------------------------------------------------- */
/* A named thread pool of at most `threads` workers, started as tasks arrive and kept
 * (ADR-0036), with a bounded queue. Submission never blocks: it fails at once when the
 * queue is full or the pool stopped (or could not start its first worker). A caller that
 * must not fail after a point (the handoff: suspend, then enqueue) reserves a queue slot
 * first. */
typedef struct rt_pool rt_pool;
/* `cancelled` is true when the pool stopped before the task ran: the task must then only
 * clean up (for a handoff: answer 503). Every submitted task runs exactly once. */
typedef void (*rt_task_fn)(void *arg, bool cancelled);
rt_pool *rt_pool_new(const char *name, int threads, int queue_depth, rt_metrics *metrics);
int rt_pool_start(rt_pool *p); /* tasks start workers from now; E_IO if one fails */
int rt_pool_submit(rt_pool *p, rt_task_fn fn, void *arg);   /* 0, E_LIMIT, E_STOPPED, E_IO */
int rt_pool_reserve(rt_pool *p);                            /* 0, E_LIMIT, E_STOPPED, E_IO */
void rt_pool_submit_reserved(rt_pool *p, rt_task_fn fn, void *arg); /* never fails */
void rt_pool_unreserve(rt_pool *p);
/* Refuse new work; queued tasks run with cancelled=true; running tasks finish. */
void rt_pool_stop(rt_pool *p);
void rt_pool_join(rt_pool *p); /* after stop: wait for every thread to exit */
void rt_pool_free(rt_pool *p); /* after join */
bool rt_pool_stopped(rt_pool *p);
bool rt_pool_on_worker(const rt_pool *p); /* is the calling thread one of p's workers? */
const char *rt_pool_name(const rt_pool *p);
int rt_pool_threads(const rt_pool *p); /* the most it may start */
int rt_pool_queued(rt_pool *p);
int rt_pool_busy(rt_pool *p);
/* Metrics (labels pool="<name>"): atrium_pool_threads (started), atrium_pool_threads_limit,
 * atrium_pool_busy,
 * atrium_pool_queued, atrium_pool_queue_limit, atrium_pool_refused_total. */

/* ---- budget --------------------------------------------------------------------------- */
/* An in-flight counter keyed by client key: a global cap and a per-key cap. try_acquire
 * never blocks. The per-key table holds only keys with something in flight, so it is
 * bounded by the global cap. Any thread. */
typedef struct rt_budget rt_budget;
rt_budget *rt_budget_new(const char *name, int global_cap, int per_key_cap, rt_metrics *metrics);
/* 0 when a slot was taken; ATRIUM_E_LIMIT when either cap is reached (*which, if non-NULL,
 * is set to 'g' for the global cap, 'k' for the per-key cap). */
int rt_budget_try_acquire(rt_budget *b, const char *key, char *which);
void rt_budget_release(rt_budget *b, const char *key); /* asserts the key holds a slot */
int rt_budget_in_use(rt_budget *b);
int rt_budget_in_use_key(rt_budget *b, const char *key);
int rt_budget_keys(rt_budget *b); /* client keys in the table (those with a slot) */
void rt_budget_free(rt_budget *b);
/* Metrics (labels budget="<name>"): atrium_budget_in_use, atrium_budget_limit,
 * atrium_budget_refused_total. */

/* ---- admission line ------------------------------------------------------------------- */
/* Slots plus a waiting line that is fair across client keys: when a slot frees, it goes to
 * the next key in round-robin order (each key's own waiters in arrival order). The line
 * knows nothing of HTTP: a waiter is an intrusive record the caller embeds and wakes. Any
 * thread; the line has its own lock, never held while calling out. */
typedef struct rt_line rt_line;
typedef struct rt_line_waiter {
    const char *key; /* client key; must stay valid while the waiter is linked */
    void *ctx;       /* the caller's (e.g. the parked request) */
    /* private to the line */
    struct rt_line_waiter *next;
    struct rt_line_key *lkey;
    int state;
} rt_line_waiter;
enum rt_line_outcome { RT_LINE_ADMITTED = 1, RT_LINE_QUEUED = 2 };
/* max_waiting: total waiters (0 = no waiting: refuse at once when no slot);
 * max_waiting_per_key: per client key (0 = only the total applies). */
rt_line *rt_line_new(const char *name, int slots, int max_waiting, int max_waiting_per_key,
                     rt_metrics *metrics);
/* RT_LINE_ADMITTED: a slot was taken now. RT_LINE_QUEUED: w is linked and will be returned
 * by a later rt_line_release (then it owns a slot). ATRIUM_E_LIMIT: refused, w untouched. */
int rt_line_enter(rt_line *l, rt_line_waiter *w);
/* Give a slot back. If someone waits, the slot passes to the next waiter (fair order), which
 * is unlinked and returned: the caller must wake it. Otherwise NULL. Only for a line whose
 * holding is not bounded (asserted); otherwise rt_line_release_for. */
rt_line_waiter *rt_line_release(rt_line *l);
/* The same, naming the key of the request that held the slot (its waiter's key). */
rt_line_waiter *rt_line_release_for(rt_line *l, const char *holder);
/* Before first use: no key holds more than max_holding_per_key slots at once (0 = no such
 * bound). A key at the bound waits for its next slot although slots are free, and a
 * released slot goes to the next key in the fair order that is below it. */
void rt_line_limit_holding(rt_line *l, int max_holding_per_key);
/* Remove a waiting w (deadline, shutdown). true: it was waiting and is now unlinked, holds
 * nothing. false: it was already granted a slot (the caller now owns that slot). */
bool rt_line_cancel(rt_line *l, rt_line_waiter *w);
int rt_line_in_use(rt_line *l);
int rt_line_waiting(rt_line *l);
int rt_line_slots(const rt_line *l);
void rt_line_free(rt_line *l);
/* Metrics (labels line="<name>"): atrium_line_slots, atrium_line_in_use,
 * atrium_line_waiting, atrium_line_refused_total, atrium_line_timed_out_total (the
 * caller counts timeouts through rt_line_count_timeout). */
void rt_line_count_timeout(rt_line *l);

/* ---- rate limiter --------------------------------------------------------------------- */
/* Token buckets per client key: `per_second` tokens refill continuously up to `burst`.
 * The table of keys is bounded (max_keys); when full, buckets that are back to full are
 * dropped first (they carry no state), and only if none can be dropped the request is
 * refused. Any thread. */
typedef struct rt_ratelimit rt_ratelimit;
rt_ratelimit *rt_ratelimit_new(const char *name, double per_second, double burst,
                               int max_keys, rt_metrics *metrics);
/* 0 = allowed (a token was taken); > 0 = refused, milliseconds until a token is there. */
int64_t rt_ratelimit_check(rt_ratelimit *rl, const char *key, int64_t now_ms);
int rt_ratelimit_keys(rt_ratelimit *rl); /* client keys in the table now (<= max_keys) */
void rt_ratelimit_free(rt_ratelimit *rl);
/* Metrics (labels action="<name>"): atrium_ratelimit_refused_total, atrium_ratelimit_keys. */

#endif
