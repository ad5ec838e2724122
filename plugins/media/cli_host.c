/*
 * plugins/media/cli_host.c - what the plugin's commands (atrium-media-verify,
 * atrium-media-migrate) stand on instead of a server: the settings the core hands them on
 * stdin (include/atrium/plugin.h, "Plugin commands"), read through the plugin's own
 * settings table (media_settings.c), and a small host table for the code they share with
 * the plugin (s3.c, store.c): log lines go to stderr, metrics are counted nowhere, clocks
 * and condition variables are the system's. Members a command never reaches stay NULL: a
 * call to one is a bug that crashes at once, not a silent no-op.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include "cli_host.h"
#include "s3.h"

#define CLI_SETTINGS_MAX_BYTES (1024 * 1024)

const atrium_host *media_host; /* the plugin's global; the commands use m->h */

/* The settings object the strings of media_config point into, from cli_media_open to
 * cli_media_close: a command program's one piece of state outside its plugin object. */
static json_t *cli_settings;

static void cli_log(atrium_plugin *self, int level, const char *fmt, ...)
{
    static const char *const LEVELS[] = {"error", "warn", "info", "debug"};
    (void)self;
    if (level > ATRIUM_LOG_INFO) return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", LEVELS[level < 0 ? 0 : level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static int64_t clock_ms(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t cli_now_ms(void)
{
    return clock_ms(CLOCK_MONOTONIC);
}

static int64_t cli_wall_ms(void)
{
    return clock_ms(CLOCK_REALTIME);
}

static int cli_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    if (pthread_condattr_init(&a) != 0) return ATRIUM_E_NOMEM;
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    return rc == 0 ? 0 : ATRIUM_E_NOMEM;
}

/* Metrics go nowhere: every metric is this one placeholder. */
static struct atrium_metric {
    int unused;
} NO_METRIC;

static atrium_metric *cli_metric(atrium_plugin *self, const char *name, const char *labels,
                                 const char *help)
{
    (void)self, (void)name, (void)labels, (void)help;
    return &NO_METRIC;
}

static void cli_metric_change(atrium_metric *m, int64_t v)
{
    (void)m, (void)v;
}

static const atrium_host CLI_HOST = {
    .size = sizeof(atrium_host),
    .abi_major = ATRIUM_ABI_MAJOR,
    .abi_minor = ATRIUM_ABI_MINOR,
    .log = cli_log,
    .now_ms = cli_now_ms,
    .cond_init = cli_cond_init,
    .metric_counter = cli_metric,
    .metric_gauge = cli_metric,
    .metric_add = cli_metric_change,
    .metric_set = cli_metric_change,
    .wall_ms = cli_wall_ms,
};

/* One row's value from the JSON object into the settings struct. */
static int apply_row(const atrium_setting *r, json_t *v, media_config *c, char *err,
                     size_t errlen)
{
    char *field = (char *)c + r->offset;
    switch (r->type) {
    case ATRIUM_SETTING_INT:
    case ATRIUM_SETTING_INT64:
        if (!json_is_integer(v)) break;
        if (r->type == ATRIUM_SETTING_INT) *(int *)(void *)field = (int)json_integer_value(v);
        else *(int64_t *)(void *)field = json_integer_value(v);
        return 0;
    case ATRIUM_SETTING_BOOL:
        if (!json_is_boolean(v)) break;
        *(bool *)(void *)field = json_is_true(v);
        return 0;
    case ATRIUM_SETTING_STRING:
        if (!json_is_string(v)) break;
        *(const char **)(void *)field = json_string_value(v); /* kept until cli_media_close */
        return 0;
    default:
        break;
    }
    snprintf(err, errlen, "the setting %s is not what its row says", r->key);
    return ATRIUM_E_INVAL;
}

int cli_media_open(media *m, FILE *settings, char *err, size_t errlen)
{
    memset(m, 0, sizeof(*m));
    m->h = &CLI_HOST;
    media_host = &CLI_HOST;
    media_config *c = &m->cfg;
    for (size_t i = 0; i < MEDIA_N_SETTINGS; i++) { /* the defaults first */
        const atrium_setting *r = &MEDIA_SETTINGS[i];
        char *field = (char *)c + r->offset;
        if (r->type == ATRIUM_SETTING_INT) *(int *)(void *)field = (int)r->def;
        else if (r->type == ATRIUM_SETTING_INT64) *(int64_t *)(void *)field = r->def;
        else if (r->type == ATRIUM_SETTING_BOOL) *(bool *)(void *)field = r->def != 0;
        else if (r->type == ATRIUM_SETTING_STRING) *(const char **)(void *)field = r->def_string;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) { /* the host's part (s3.c) */
        snprintf(err, errlen, "libcurl cannot start");
        return ATRIUM_E_NOMEM;
    }
    if (!settings) return 0;
    json_error_t jerr;
    json_t *obj = json_loadf(settings, JSON_DISABLE_EOF_CHECK, &jerr);
    if (!json_is_object(obj)) {
        snprintf(err, errlen, "the settings on stdin are not a JSON object: %s", jerr.text);
        json_decref(obj);
        return ATRIUM_E_INVAL;
    }
    int rc = 0;
    for (size_t i = 0; i < MEDIA_N_SETTINGS && rc == 0; i++) {
        json_t *v = json_object_get(obj, MEDIA_SETTINGS[i].key);
        if (v) rc = apply_row(&MEDIA_SETTINGS[i], v, c, err, errlen);
    }
    json_decref(cli_settings);
    cli_settings = obj;
    return rc;
}

void cli_media_close(media *m)
{
    s3_fini(m);
    json_decref(cli_settings);
    cli_settings = NULL;
    curl_global_cleanup();
}

int cli_media_connect(const char *conninfo, const char *program, PGconn **out)
{
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "%s: cannot connect to PostgreSQL: %s", program, PQerrorMessage(c));
        PQfinish(c);
        return -1;
    }
    *out = c;
    return 0;
}
