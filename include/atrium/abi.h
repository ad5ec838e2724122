/*
 * atrium/abi.h - version numbers, build signature, error codes and scope keys of the
 * Atrium plugin ABI.
 *
 * This is the smallest header of the public seam: every other public header includes it.
 * It owns the two compatibility questions the loader asks of a plugin ("same contract
 * version?" and "same build-time layout?") and the error vocabulary every host function
 * returns. It deliberately says nothing about HTTP or the core's libraries: a plugin
 * compiles against include/atrium/ plus libc, jansson and libpq, nothing else.
 */
#ifndef ATRIUM_ABI_H
#define ATRIUM_ABI_H

#include <stdint.h>
#include <jansson.h>

/* The contract version these headers describe. A plugin built for another major is
 * refused; a plugin that needs a newer minor than the host offers is refused. The host
 * table only grows within a major (members are appended), so an old plugin keeps working
 * on a newer host of the same major.
 *
 * These two are facts about the headers, not settings: a plugin says which contract it
 * targets with ATRIUM_TARGET_ABI_MAJOR and ATRIUM_TARGET_ABI_MINOR (atrium/plugin.h),
 * defined before including any atrium/ header (or with -D). Defining ATRIUM_ABI_MAJOR or
 * ATRIUM_ABI_MINOR yourself is an error, so a stray -DATRIUM_ABI_MAJOR=2 cannot silently
 * build a plugin for a contract these headers do not describe. */
#if defined(ATRIUM_ABI_MAJOR) || defined(ATRIUM_ABI_MINOR)
#error "ATRIUM_ABI_MAJOR/MINOR belong to atrium/abi.h: define ATRIUM_TARGET_ABI_MAJOR/MINOR"
#endif
#define ATRIUM_ABI_MAJOR 1
#define ATRIUM_ABI_MINOR 9 /* 1.1: settings tables (atrium_setting, config_load), db_wait_ms;
                              federation (req_origin, fed_request, req_wait, ...);
                              interfaces (iface_provide, iface_get).
                              1.2: ATRIUM_ROUTE_HEADERS_FIRST (refuse a streamed body
                              before it is read); the media/1 contract (atrium/media.h).
                              1.3: several processes (instance_name, notify_subscribe,
                              notify_publish, notify_live, lease_create, lease_held);
                              respond_stream_wait (a stream that waits for its bytes).
                              1.4: server_name_valid (the core's server-name grammar).
                              1.5: wall_ms (the wall clock); sha256_init, sha256_update,
                              sha256_final (SHA-256 chunk by chunk); ATRIUM_CONTINUE (a
                              handler step's "go on", atrium/host.h).
                              1.6: application services (req_appservice, alias_exclusive,
                              alias_query).
                              1.7: plugin commands (atrium <plugin> <command>: a program
                              the plugin ships, given its settings on stdin; plugin.h);
                              media/1 version 1 (atrium media migrate)
                              1.8: single flight (flights_create, flight_join,
                              flight_finish, flight_result, flight_wanted)
                              1.9: a flight's early result (flight_publish,
                              flight_unpublish, ATRIUM_FLIGHT_EARLY, _EARLY_ONLY) */

#define ATRIUM_PLUGIN_MAGIC 0x41545250u /* "ATRP" */

#define ATRIUM_STR_(x) #x
#define ATRIUM_STR(x) ATRIUM_STR_(x)

/* The build-time layout a plugin was compiled with: pointer and long widths (off_t and time_t
 * follow long on the LP64 targets Atrium supports) and the jansson major version (jansson
 * objects cross the seam). Compared as a string. */
#define ATRIUM_BUILD_SIG                                                                   \
    "ptr" ATRIUM_STR(__SIZEOF_POINTER__) ",long" ATRIUM_STR(__SIZEOF_LONG__) ",jansson" ATRIUM_STR( \
        JANSSON_MAJOR_VERSION)

#define ATRIUM_EXPORT __attribute__((visibility("default")))

/* Error codes. Every host function that can fail returns 0 (or a non-negative value) on
 * success and one of these negative values on failure. */
enum atrium_err {
    ATRIUM_OK = 0,
    ATRIUM_E_INVAL = -1,    /* an argument is wrong (a bug in the caller) */
    ATRIUM_E_NOMEM = -2,    /* out of memory */
    ATRIUM_E_LIMIT = -3,    /* a cap, budget or queue is full: answer 429 or 503 */
    ATRIUM_E_STOPPED = -4,  /* the pool or the server is stopping: answer 503 */
    ATRIUM_E_TIMEOUT = -5,  /* a deadline passed */
    ATRIUM_E_EXPIRED = -6,  /* the request was already answered (deadline, shutdown) */
    ATRIUM_E_STATE = -7,    /* called in the wrong phase or on the wrong thread */
    ATRIUM_E_DB = -8,       /* PostgreSQL failed or no connection could be had in time */
    ATRIUM_E_IO = -9,       /* a system call failed (errno tells more) */
    ATRIUM_E_NOTFOUND = -10,
    ATRIUM_E_EXISTS = -11,  /* already registered (route, interface, metric) */
    ATRIUM_E_GONE = -12,    /* the client went away */
};

/* The name of an error code ("ATRIUM_E_EXISTS") followed by what it means, for log
 * lines; "unknown error" for anything else. Any thread. */
static inline const char *atrium_err_name(int err)
{
    switch (err) {
    case ATRIUM_OK: return "ATRIUM_OK";
    case ATRIUM_E_INVAL: return "ATRIUM_E_INVAL (an argument is wrong)";
    case ATRIUM_E_NOMEM: return "ATRIUM_E_NOMEM (out of memory)";
    case ATRIUM_E_LIMIT: return "ATRIUM_E_LIMIT (a cap, budget or queue is full)";
    case ATRIUM_E_STOPPED: return "ATRIUM_E_STOPPED (stopping)";
    case ATRIUM_E_TIMEOUT: return "ATRIUM_E_TIMEOUT (a deadline passed)";
    case ATRIUM_E_EXPIRED: return "ATRIUM_E_EXPIRED (the request was already answered)";
    case ATRIUM_E_STATE: return "ATRIUM_E_STATE (wrong phase or thread)";
    case ATRIUM_E_DB: return "ATRIUM_E_DB (PostgreSQL failed)";
    case ATRIUM_E_IO: return "ATRIUM_E_IO (a system call failed)";
    case ATRIUM_E_NOTFOUND: return "ATRIUM_E_NOTFOUND (not found)";
    case ATRIUM_E_EXISTS: return "ATRIUM_E_EXISTS (already registered)";
    case ATRIUM_E_GONE: return "ATRIUM_E_GONE (the client went away)";
    default: return "unknown error";
    }
}

/* Scope keys: thread-local values the core publishes for the duration of a handler call
 * (see atrium/host.h, scope_get). A handoff republishes them on the receiving thread. */
enum atrium_scope_key {
    ATRIUM_SCOPE_REQUEST = 1,   /* atrium_req *: the request this thread works for */
    ATRIUM_SCOPE_REQUEST_ID,    /* const char *: id printed on every log line */
    ATRIUM_SCOPE_CLIENT_KEY,    /* const char *: user ID once authenticated, else address */
    ATRIUM_SCOPE_DEADLINE,      /* intptr_t: monotonic ms by which the request must answer */
    ATRIUM_SCOPE_USER,          /* const char *: authenticated user ID, or absent */
    ATRIUM_SCOPE_LOCK,          /* pthread_mutex_t *: the lock the request holds, if any */
    ATRIUM_SCOPE_FETCH_MODE,    /* intptr_t: enum atrium_fetch_mode */
    ATRIUM_SCOPE_RATE_ADMITTED, /* intptr_t: non-zero = the rate limiter already counted it */
    ATRIUM_SCOPE__COUNT
};

/* How a remote fetch may run on this thread (docs/adr/0005-remote-media-fetch-pool.md;
 * plugins/media/remote.c). */
enum atrium_fetch_mode {
    ATRIUM_FETCH_INLINE = 0, /* no fetch pool: fetch here under the outbound budget */
    ATRIUM_FETCH_DEFER = 1,  /* request pool: do the quick part, then defer to the pool */
    ATRIUM_FETCH_ADMITTED = 2, /* fetch pool: admitted, fetch now */
};

/* Log levels for host->log. */
enum atrium_log_level {
    ATRIUM_LOG_ERROR = 0,
    ATRIUM_LOG_WARN = 1,
    ATRIUM_LOG_INFO = 2,
    ATRIUM_LOG_DEBUG = 3,
};

#endif
