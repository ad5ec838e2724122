/*
 * core/runtime/metrics.c - counters, gauges and histograms, rendered for /metrics.
 *
 * Owns the Prometheus text exposition of /metrics: metrics are grouped into families by
 * name, and each family is rendered as one `# HELP` and one `# TYPE` line followed by every
 * label set registered under that name (Prometheus rejects a repeated TYPE line). Families
 * appear in the order they were first registered, label sets likewise, so the output is
 * stable and testable. Updates are lock-free atomics, so a pool or a line can count on its
 * hot path; only registration and rendering take the registry lock. A histogram keeps one
 * counter per bucket plus an overflow counter and renders them cumulatively; its _count is
 * the sum of those, so `le="+Inf"` and `_count` always agree within one scrape.
 * Deliberately not here: unregistering (metrics live as long as the registry), label
 * parsing (the label string is the caller's, built with rt_metric_label), HTTP.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/runtime.h"

#define RT_METRIC_MAX_BUCKETS 64
#define RT_METRIC_NUMBER_MAX_BYTES 64 /* a formatted double or +Inf */
#define RT_METRICS_RENDER_INITIAL_BYTES 4096
#define RT_DOUBLE_MAX_DIGITS 17  /* enough for any double to round-trip */
#define RT_DOUBLE_PLAIN_DIGITS 6 /* below 1e6, no exponent: le="10", not le="1e+01" */

typedef struct rt_family {
    struct rt_family *next;
    char *name;
    char *help;
    enum rt_metric_type type;
    rt_metric *first, *last;
} rt_family;

struct rt_metric {
    rt_metric *next; /* within the family */
    rt_family *family;
    char *labels; /* "" when none */
    _Atomic int64_t value; /* counter, gauge */
    /* histogram */
    size_t n_buckets;
    double *bounds;           /* n_buckets upper bounds, ascending */
    _Atomic int64_t *counts;  /* n_buckets + 1: per bucket, then the overflow (+Inf) */
    _Atomic uint64_t sum_bits; /* the sum as the bits of a double, updated by CAS */
};

struct rt_metrics {
    pthread_mutex_t lock;
    rt_family *first, *last;
};

static bool name_valid(const char *name)
{
    if (name == NULL || name[0] == '\0')
        return false;
    for (const char *p = name; *p != '\0'; p++) {
        bool alpha = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_' ||
                     *p == ':';
        bool digit = *p >= '0' && *p <= '9';
        if (!alpha && !(digit && p != name))
            return false;
    }
    return true;
}

rt_metrics *rt_metrics_new(void)
{
    rt_metrics *reg = calloc(1, sizeof(*reg));
    if (reg == NULL)
        return NULL;
    if (pthread_mutex_init(&reg->lock, NULL) != 0) {
        free(reg);
        return NULL;
    }
    return reg;
}

static void metric_free(rt_metric *m)
{
    free(m->labels);
    free(m->bounds);
    free(m->counts);
    free(m);
}

void rt_metrics_free(rt_metrics *reg)
{
    if (reg == NULL)
        return;
    rt_family *f = reg->first;
    while (f != NULL) {
        rt_family *fnext = f->next;
        rt_metric *m = f->first;
        while (m != NULL) {
            rt_metric *mnext = m->next;
            metric_free(m);
            m = mnext;
        }
        free(f->name);
        free(f->help);
        free(f);
        f = fnext;
    }
    pthread_mutex_destroy(&reg->lock);
    free(reg);
}

static bool same_buckets(const rt_metric *m, const double *buckets, size_t n)
{
    if (m->n_buckets != n)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (m->bounds[i] != buckets[i])
            return false;
    }
    return true;
}

static rt_metric *metric_new(rt_family *f, const char *labels, const double *buckets,
                             size_t n_buckets)
{
    rt_metric *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->family = f;
    m->labels = strdup(labels);
    if (m->labels == NULL)
        goto fail;
    if (f->type == RT_HISTOGRAM) {
        m->n_buckets = n_buckets;
        m->bounds = calloc(n_buckets ? n_buckets : 1, sizeof(double));
        m->counts = calloc(n_buckets + 1, sizeof(*m->counts));
        if (m->bounds == NULL || m->counts == NULL)
            goto fail;
        if (n_buckets > 0)
            memcpy(m->bounds, buckets, n_buckets * sizeof(double));
    }
    return m;
fail:
    metric_free(m);
    return NULL;
}

/* The one registration path: find or create the family, then the label set. */
static rt_metric *metric_register(rt_metrics *reg, const char *name, const char *labels,
                                  const char *help, enum rt_metric_type type,
                                  const double *buckets, size_t n_buckets)
{
    if (reg == NULL)
        return NULL; /* no registry: no metrics, every update is a no-op */
    RT_ASSERT(name_valid(name), "invalid metric name \"%s\"", name ? name : "(null)");
    if (labels == NULL)
        labels = "";
    RT_ASSERT(strchr(labels, '\n') == NULL, "metric %s: newline in labels", name);
    if (help == NULL)
        help = "";
    if (type == RT_HISTOGRAM) {
        RT_ASSERT(n_buckets <= RT_METRIC_MAX_BUCKETS, "histogram %s: %zu buckets > %d", name,
                  n_buckets, RT_METRIC_MAX_BUCKETS);
        RT_ASSERT(n_buckets == 0 || buckets != NULL, "histogram %s: NULL buckets", name);
        for (size_t i = 0; i < n_buckets; i++) {
            RT_ASSERT(isfinite(buckets[i]) && (i == 0 || buckets[i] > buckets[i - 1]),
                      "histogram %s: bucket bounds must be finite and ascending", name);
        }
    }

    rt_metric *result = NULL;
    pthread_mutex_lock(&reg->lock);
    rt_family *f = reg->first;
    while (f != NULL && strcmp(f->name, name) != 0)
        f = f->next;
    if (f != NULL) {
        if (f->type != type)
            goto out; /* one name, one type: the exposition format has no other way */
        for (rt_metric *m = f->first; m != NULL; m = m->next) {
            if (strcmp(m->labels, labels) == 0) {
                if (type != RT_HISTOGRAM || same_buckets(m, buckets, n_buckets))
                    result = m;
                goto out;
            }
        }
    } else {
        f = calloc(1, sizeof(*f));
        if (f == NULL)
            goto out;
        f->name = strdup(name);
        f->help = strdup(help);
        f->type = type;
        if (f->name == NULL || f->help == NULL) {
            free(f->name);
            free(f->help);
            free(f);
            goto out;
        }
        if (reg->last != NULL)
            reg->last->next = f;
        else
            reg->first = f;
        reg->last = f;
    }
    result = metric_new(f, labels, buckets, n_buckets);
    if (result != NULL) {
        if (f->last != NULL)
            f->last->next = result;
        else
            f->first = result;
        f->last = result;
    }
out:
    pthread_mutex_unlock(&reg->lock);
    return result;
}

rt_metric *rt_metric_counter(rt_metrics *reg, const char *name, const char *labels,
                             const char *help)
{
    return metric_register(reg, name, labels, help, RT_COUNTER, NULL, 0);
}

rt_metric *rt_metric_gauge(rt_metrics *reg, const char *name, const char *labels,
                           const char *help)
{
    return metric_register(reg, name, labels, help, RT_GAUGE, NULL, 0);
}

rt_metric *rt_metric_histogram(rt_metrics *reg, const char *name, const char *labels,
                               const char *help, const double *buckets, size_t n_buckets)
{
    return metric_register(reg, name, labels, help, RT_HISTOGRAM, buckets, n_buckets);
}

void rt_metric_add(rt_metric *m, int64_t delta)
{
    if (m == NULL)
        return;
    RT_ASSERT(m->family->type != RT_HISTOGRAM, "rt_metric_add on histogram %s",
              m->family->name);
    RT_ASSERT(m->family->type != RT_COUNTER || delta >= 0,
              "counter %s{%s} decremented by %lld", m->family->name, m->labels,
              (long long)delta);
    atomic_fetch_add_explicit(&m->value, delta, memory_order_relaxed);
}

void rt_metric_set(rt_metric *m, int64_t value)
{
    if (m == NULL)
        return;
    RT_ASSERT(m->family->type == RT_GAUGE, "rt_metric_set on non-gauge %s", m->family->name);
    atomic_store_explicit(&m->value, value, memory_order_relaxed);
}

void rt_metric_observe(rt_metric *m, double value)
{
    if (m == NULL || isnan(value))
        return; /* a NaN would poison _sum forever */
    RT_ASSERT(m->family->type == RT_HISTOGRAM, "rt_metric_observe on non-histogram %s",
              m->family->name);
    size_t i = 0;
    while (i < m->n_buckets && value > m->bounds[i])
        i++;
    atomic_fetch_add_explicit(&m->counts[i], 1, memory_order_relaxed);
    uint64_t old_bits = atomic_load_explicit(&m->sum_bits, memory_order_relaxed);
    for (;;) {
        double sum;
        memcpy(&sum, &old_bits, sizeof(sum));
        sum += value;
        uint64_t new_bits;
        memcpy(&new_bits, &sum, sizeof(sum));
        if (atomic_compare_exchange_weak_explicit(&m->sum_bits, &old_bits, new_bits,
                                                  memory_order_relaxed, memory_order_relaxed))
            break;
    }
}

int64_t rt_metric_value(const rt_metric *m)
{
    if (m == NULL)
        return 0;
    if (m->family->type != RT_HISTOGRAM)
        return atomic_load_explicit(&m->value, memory_order_relaxed);
    int64_t count = 0;
    for (size_t i = 0; i <= m->n_buckets; i++)
        count += atomic_load_explicit(&m->counts[i], memory_order_relaxed);
    return count;
}

int rt_metric_label(char *buf, size_t size, const char *name, const char *value)
{
    RT_ASSERT(buf != NULL && size > 0 && name_valid(name) && value != NULL,
              "rt_metric_label: bad arguments");
    size_t pos = 0;
    int n = snprintf(buf, size, "%s=\"", name);
    if (n < 0 || (size_t)n >= size)
        goto too_long;
    pos = (size_t)n;
    for (const char *p = value; *p != '\0'; p++) {
        const char *esc = *p == '\\' ? "\\\\" : *p == '"' ? "\\\"" : *p == '\n' ? "\\n" : NULL;
        size_t add = esc ? 2 : 1;
        if (pos + add >= size)
            goto too_long;
        if (esc)
            memcpy(buf + pos, esc, 2);
        else
            buf[pos] = *p;
        pos += add;
    }
    if (pos + 2 > size)
        goto too_long;
    buf[pos++] = '"';
    buf[pos] = '\0';
    return (int)pos;
too_long:
    buf[0] = '\0';
    return ATRIUM_E_LIMIT;
}

/* ---- rendering ------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool failed;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 > b->len + (size_t)n + 1 ? b->cap * 2 : b->len + (size_t)n + 1;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* The shortest decimal form that reads back as the same double, printed as Prometheus' own
 * (Go) clients do: 0.5, 10, 100000, 2.5e+06. %g switches to an exponent at the precision, so
 * the precision is at least RT_DOUBLE_PLAIN_DIGITS (trailing zeros are dropped anyway). */
static void format_double(char *out, size_t size, double v)
{
    int prec = 1;
    for (; prec < RT_DOUBLE_MAX_DIGITS; prec++) {
        snprintf(out, size, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            break;
    }
    snprintf(out, size, "%.*g", prec > RT_DOUBLE_PLAIN_DIGITS ? prec : RT_DOUBLE_PLAIN_DIGITS,
             v);
}

static void render_help(sbuf *b, const rt_family *f)
{
    sb_printf(b, "# HELP %s ", f->name);
    for (const char *p = f->help; *p != '\0'; p++) {
        if (*p == '\\')
            sb_printf(b, "\\\\");
        else if (*p == '\n')
            sb_printf(b, "\\n");
        else
            sb_printf(b, "%c", *p);
    }
    sb_printf(b, "\n");
}

static void render_histogram(sbuf *b, const char *name, const rt_metric *m)
{
    const char *sep = m->labels[0] != '\0' ? "," : "";
    char num[RT_METRIC_NUMBER_MAX_BYTES];
    int64_t cumulative = 0;
    for (size_t i = 0; i <= m->n_buckets; i++) {
        cumulative += atomic_load_explicit(&m->counts[i], memory_order_relaxed);
        if (i < m->n_buckets)
            format_double(num, sizeof(num), m->bounds[i]);
        else
            snprintf(num, sizeof(num), "+Inf");
        sb_printf(b, "%s_bucket{%s%sle=\"%s\"} %lld\n", name, m->labels, sep, num,
                  (long long)cumulative);
    }
    uint64_t bits = atomic_load_explicit(&m->sum_bits, memory_order_relaxed);
    double sum;
    memcpy(&sum, &bits, sizeof(sum));
    format_double(num, sizeof(num), sum);
    const char *open = m->labels[0] != '\0' ? "{" : "";
    const char *close = m->labels[0] != '\0' ? "}" : "";
    sb_printf(b, "%s_sum%s%s%s %s\n", name, open, m->labels, close, num);
    sb_printf(b, "%s_count%s%s%s %lld\n", name, open, m->labels, close,
              (long long)cumulative);
}

char *rt_metrics_render(rt_metrics *reg, size_t *len)
{
    static const char *const type_names[] = {
        [RT_COUNTER] = "counter", [RT_GAUGE] = "gauge", [RT_HISTOGRAM] = "histogram"};
    sbuf b = {.p = malloc(RT_METRICS_RENDER_INITIAL_BYTES),
              .cap = RT_METRICS_RENDER_INITIAL_BYTES};
    if (b.p == NULL)
        return NULL;
    b.p[0] = '\0';
    if (reg != NULL) {
        pthread_mutex_lock(&reg->lock);
        for (const rt_family *f = reg->first; f != NULL; f = f->next) {
            render_help(&b, f);
            sb_printf(&b, "# TYPE %s %s\n", f->name, type_names[f->type]);
            for (const rt_metric *m = f->first; m != NULL; m = m->next) {
                if (f->type == RT_HISTOGRAM) {
                    render_histogram(&b, f->name, m);
                } else {
                    long long v = (long long)atomic_load_explicit(&m->value,
                                                                  memory_order_relaxed);
                    if (m->labels[0] != '\0')
                        sb_printf(&b, "%s{%s} %lld\n", f->name, m->labels, v);
                    else
                        sb_printf(&b, "%s %lld\n", f->name, v);
                }
            }
        }
        pthread_mutex_unlock(&reg->lock);
    }
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    if (len != NULL)
        *len = b.len;
    return b.p;
}
