/*
 * core/runtime/log.c - the server's log: one line per call on stderr.
 *
 * Owns the log line format every component shares (core and plugins, through the host
 * table):
 *     2026-11-29T14:05:12.123Z atrium-a INFO  media [req 7f3a] message
 * UTC timestamp with milliseconds, the process's instance name once start-up set it
 * (server.instance_name: which of several processes sharing one database wrote the line),
 * the level padded to five columns, the origin (omitted when NULL), and the request id
 * when the calling thread's scope publishes ATRIUM_SCOPE_REQUEST_ID. A line is assembled in a stack buffer and written with a single
 * write(2), so lines from concurrent threads never interleave (stderr is unbuffered and
 * stdio would split a line into several writes). Line breaks inside a message become spaces
 * so one call is always one line; a line longer than RT_LOG_LINE_MAX_BYTES is cut and ends
 * in "...". This file also holds the crash report of RT_ASSERT, which is a last log line.
 *
 * Repeats are rate-limited: an ERROR or WARN line whose text (origin and message, the
 * request id left out) was already written less than the repeat interval ago is not
 * written again but counted, and the next copy written after the interval says how many
 * were left out ("(47 more like this in the last 10 s)"). A database outage that fails
 * every request thus costs a line per interval, not thousands, and the count still tells
 * how bad it was. INFO and DEBUG lines are never held back.
 * It deliberately does not rotate files, buffer or ship logs: the service manager does.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "core/runtime/runtime.h"

#define RT_LOG_LINE_MAX_BYTES 4096
#define RT_LOG_TRUNCATED_MARK "..."
#define RT_LOG_DEFAULT_LEVEL ATRIUM_LOG_INFO
#define RT_LOG_MS_PER_S 1000
#define RT_LOG_REPEAT_INTERVAL_MS 10000 /* one copy of a repeated ERROR/WARN line per this */
#define RT_LOG_REPEAT_SLOTS 128         /* distinct repeated lines tracked at once */
#define RT_LOG_INSTANCE_MAX_BYTES 65    /* an instance name and its terminator */

static const char *const rt_log_level_names[] = {
    [ATRIUM_LOG_ERROR] = "ERROR",
    [ATRIUM_LOG_WARN] = "WARN",
    [ATRIUM_LOG_INFO] = "INFO",
    [ATRIUM_LOG_DEBUG] = "DEBUG",
};

/* The one process-wide log setting: read on every call, set at start-up or on reload. */
static atomic_int rt_log_current_level = RT_LOG_DEFAULT_LEVEL;

/* The instance name, set once by the main thread before any other thread starts (so
 * reads need no lock); "" until then, and in unit tests, which then see no name column. */
static char rt_log_instance[RT_LOG_INSTANCE_MAX_BYTES];

/* Set once a thread is reporting a failed assertion, so a failure inside the report (a
 * broken clock) aborts at once instead of recursing. */
static atomic_bool rt_log_assert_failing = false;

/* The repeat registry: per slot the hash of a line's text, when it was last written and
 * how many copies were held back since. Guarded by rt_log_repeats_mu. */
typedef struct rt_log_repeat {
    uint64_t hash;
    int64_t written_ms;
    uint64_t held_back;
} rt_log_repeat;
static rt_log_repeat rt_log_repeats[RT_LOG_REPEAT_SLOTS];
static pthread_mutex_t rt_log_repeats_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int rt_log_repeat_interval_ms = RT_LOG_REPEAT_INTERVAL_MS;

void rt_log_set_repeat_interval_ms(int ms)
{
    atomic_store(&rt_log_repeat_interval_ms, ms < 0 ? 0 : ms);
}

static uint64_t text_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ? h : 1;
}

/* The one rule for repeated lines: may a line with this text be written now? When it
 * may, *held_back is how many copies were held back since it was last written. */
static bool repeat_admit(const char *text, size_t n, uint64_t *held_back)
{
    *held_back = 0;
    int interval = atomic_load(&rt_log_repeat_interval_ms);
    if (interval <= 0) return true;
    uint64_t h = text_hash(text, n);
    int64_t now = rt_now_ms();
    pthread_mutex_lock(&rt_log_repeats_mu);
    rt_log_repeat *slot = &rt_log_repeats[h % RT_LOG_REPEAT_SLOTS];
    bool write = true;
    if (slot->hash == h && now - slot->written_ms < interval) {
        slot->held_back++;
        write = false;
    } else {
        if (slot->hash == h) *held_back = slot->held_back;
        slot->hash = h;
        slot->written_ms = now;
        slot->held_back = 0;
    }
    pthread_mutex_unlock(&rt_log_repeats_mu);
    return write;
}

static bool level_valid(int level)
{
    return level >= ATRIUM_LOG_ERROR && level <= ATRIUM_LOG_DEBUG;
}

void rt_log_set_level(int level)
{
    RT_ASSERT(level_valid(level), "log level %d out of range", level);
    atomic_store(&rt_log_current_level, level);
}

void rt_log_set_instance(const char *name)
{
    snprintf(rt_log_instance, sizeof(rt_log_instance), "%s", name ? name : "");
}

const char *rt_log_instance_name(void)
{
    return rt_log_instance;
}

int rt_log_level(void)
{
    return atomic_load(&rt_log_current_level);
}

int rt_log_level_parse(const char *name)
{
    if (name == NULL)
        return -1;
    for (int l = ATRIUM_LOG_ERROR; l <= ATRIUM_LOG_DEBUG; l++) {
        if (strcasecmp(name, rt_log_level_names[l]) == 0)
            return l;
    }
    return -1;
}

/* Append printf output at buf[*pos], never past cap - 1; returns false when it was cut. */
static bool append(char *buf, size_t cap, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool append(char *buf, size_t cap, size_t *pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *pos, cap - *pos, fmt, ap);
    va_end(ap);
    if (n < 0)
        return false;
    if ((size_t)n >= cap - *pos) {
        *pos = cap - 1;
        return false;
    }
    *pos += (size_t)n;
    return true;
}

/* Write the ISO-8601 UTC timestamp with milliseconds, e.g. 2026-11-29T14:05:12.123Z. */
static void append_timestamp(char *buf, size_t cap, size_t *pos)
{
    int64_t ms = rt_wall_ms();
    time_t secs = (time_t)(ms / RT_LOG_MS_PER_S);
    struct tm tm;
    if (gmtime_r(&secs, &tm) == NULL) {
        append(buf, cap, pos, "0000-00-00T00:00:00.000Z");
        return;
    }
    append(buf, cap, pos, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
           tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
           (int)(ms % RT_LOG_MS_PER_S));
}

/* Write all of buf to stderr; write(2) of a few KiB to a pipe or tty is one call, the loop
 * only covers signals and short writes. */
static void write_line(const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(STDERR_FILENO, buf, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* nowhere left to report it */
        buf += n;
        len -= (size_t)n;
    }
}

void rt_vlog(int level, const char *origin, const char *fmt, va_list ap)
{
    if (!level_valid(level))
        level = ATRIUM_LOG_ERROR; /* a wrong level is still worth seeing */
    if (level > rt_log_level())
        return;
    int saved_errno = errno; /* callers often log and then look at errno */

    char line[RT_LOG_LINE_MAX_BYTES];
    /* Keep room for the truncation mark and the newline. */
    const size_t cap = sizeof(line) - sizeof(RT_LOG_TRUNCATED_MARK);
    size_t pos = 0;
    append_timestamp(line, cap, &pos);
    if (rt_log_instance[0] != '\0')
        append(line, cap, &pos, " %s", rt_log_instance);
    append(line, cap, &pos, " %-5s ", rt_log_level_names[level]);
    size_t body = pos;
    if (origin != NULL)
        append(line, cap, &pos, "%s ", origin);
    const char *req_id = rt_scope_get(ATRIUM_SCOPE_REQUEST_ID);
    if (req_id != NULL)
        append(line, cap, &pos, "[req %s] ", req_id);

    bool whole = true;
    size_t msg = pos;
    int n = vsnprintf(line + pos, cap - pos, fmt, ap);
    if (n < 0) {
        whole = append(line, cap, &pos, "(unformattable log message: %s)", fmt);
    } else if ((size_t)n >= cap - pos) {
        pos = cap - 1;
        whole = false;
    } else {
        pos += (size_t)n;
    }
    if (level <= ATRIUM_LOG_WARN) {
        /* The text that makes a line "the same": level, origin and message. */
        char key[RT_LOG_LINE_MAX_BYTES];
        int kn = snprintf(key, sizeof(key), "%d %s %.*s", level, origin ? origin : "",
                          (int)(pos - msg), line + msg);
        uint64_t held_back = 0;
        if (!repeat_admit(key, kn < 0 ? 0 : (size_t)kn < sizeof(key) ? (size_t)kn : sizeof(key) - 1,
                          &held_back)) {
            errno = saved_errno;
            return;
        }
        if (held_back > 0)
            whole = append(line, cap, &pos, " (%llu more like this in the last %d s)",
                           (unsigned long long)held_back,
                           (atomic_load(&rt_log_repeat_interval_ms) + RT_LOG_MS_PER_S - 1) /
                               RT_LOG_MS_PER_S) && whole;
    }
    for (size_t i = body; i < pos; i++) {
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    }
    if (!whole) {
        memcpy(line + pos, RT_LOG_TRUNCATED_MARK, strlen(RT_LOG_TRUNCATED_MARK));
        pos += strlen(RT_LOG_TRUNCATED_MARK);
    }
    line[pos++] = '\n';
    write_line(line, pos);
    errno = saved_errno;
}

void rt_log(int level, const char *origin, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_vlog(level, origin, fmt, ap);
    va_end(ap);
}

void rt_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    if (atomic_exchange(&rt_log_assert_failing, true))
        abort(); /* failed while reporting a failure */
    char context[RT_LOG_LINE_MAX_BYTES / 2];
    va_list ap;
    va_start(ap, fmt);
    if (vsnprintf(context, sizeof(context), fmt, ap) < 0)
        context[0] = '\0';
    va_end(ap);
    rt_log(ATRIUM_LOG_ERROR, "core", "assertion failed at %s:%d: %s: %s", file, line, cond,
           context);
    abort();
}
