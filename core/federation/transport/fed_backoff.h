/*
 * core/federation/transport/fed_backoff.h - per-destination backoff: a server that failed is not
 * contacted again until a delay has passed, the delay grows with each further failure, and
 * one success resets it.
 *
 * The question "may I contact this destination now?" is asked before every outbound
 * federation request, so it is answered from memory (one hash look-up under a mutex); the
 * table is written through to PostgreSQL (federation_destinations, see fed_migrations.h)
 * so the state survives a restart, and read back at start. Writes never run on the
 * caller's thread (the outbound client's I/O thread, or a request thread): they go to a
 * one-thread pool of their own; when its queue is full a write is dropped with a log line
 * and the memory state, which decides, stays right.
 *
 * This module only keeps the state: callers decide what counts as a failure (a timeout, a
 * refused connection, a 5xx; not a 4xx) and whether to honour the delay (a user's explicit
 * join may ignore it). Internal prefix: fed_backoff_. Any thread once started.
 */
#ifndef ATRIUM_CORE_FED_BACKOFF_H
#define ATRIUM_CORE_FED_BACKOFF_H

#include <stdbool.h>
#include <stdint.h>

#include "core/runtime/runtime.h"
#include "core/store/db.h"

#define FED_BACKOFF_DEFAULT_MIN_INTERVAL_MS (10 * 60 * 1000LL)      /* 10 minutes */
#define FED_BACKOFF_DEFAULT_MULTIPLIER 2.0
#define FED_BACKOFF_DEFAULT_MAX_INTERVAL_MS (24 * 60 * 60 * 1000LL) /* 24 hours */
#define FED_BACKOFF_DEFAULT_JITTER 0.1 /* up to 10% longer, so retries spread out */
#define FED_BACKOFF_DEFAULT_MAX_DESTINATIONS 100000
#define FED_BACKOFF_DEFAULT_WRITE_QUEUE 1024

typedef struct fed_backoff fed_backoff;

/* Zero/negative fields take the defaults above. */
typedef struct fed_backoff_settings {
    int64_t min_interval_ms; /* the delay after a first failure */
    double multiplier;       /* each further failure multiplies the delay by this (>= 1) */
    int64_t max_interval_ms; /* the delay never passes this */
    double jitter;           /* a delay is lengthened by a random fraction in [0, jitter) */
    int max_destinations;    /* destinations in backoff remembered; more are not delayed */
    int write_queue_depth;   /* database writes waiting for the writer thread */
} fed_backoff_settings;

/* The delay after a failure when the previous delay was prev_interval_ms (0: none, a
 * first failure), for u in [0, 1) drawn at random: base = min_interval (first failure)
 * or prev * multiplier, lengthened by base * jitter * u, capped at max_interval. Pure;
 * `s` must have its defaults applied (fed_backoff_settings_defaults). */
int64_t fed_backoff_next_interval_ms(const fed_backoff_settings *s, int64_t prev_interval_ms,
                                     double u);
/* Fill the zero/negative fields of s with the defaults. */
void fed_backoff_settings_defaults(fed_backoff_settings *s);

/* The table, empty, its writer not started. `db` may be NULL (memory only: tests, or a
 * process without a database); it must outlive the table. Metric:
 * atrium_federation_backoff_destinations (gauge). NULL on failure (logged). */
fed_backoff *fed_backoff_new(const fed_backoff_settings *s, db_pool *db, rt_metrics *metrics);
/* Read the destinations in backoff from PostgreSQL (at start, before requests flow; it
 * blocks on the database). 0, or ATRIUM_E_DB (logged; the table stays empty). */
int fed_backoff_load(fed_backoff *b);
/* Start the writer thread: 0 or ATRIUM_E_IO. Before it starts, writes are queued. */
int fed_backoff_start(fed_backoff *b);

/* 0 when dest may be contacted at now_wall_ms (rt_wall_ms), else the milliseconds left of
 * its delay. Any thread; never blocks on I/O. */
int64_t fed_backoff_retry_in_ms(fed_backoff *b, const char *dest, int64_t now_wall_ms);
/* Record a failed attempt at dest now (rt_wall_ms): its delay starts or grows. Any thread;
 * the database write is queued. */
void fed_backoff_failure(fed_backoff *b, const char *dest);
/* Record a success: dest's backoff is forgotten (in memory and, if it had any, in the
 * database). Nothing is written when dest was not in backoff. true when it was. Any
 * thread. */
bool fed_backoff_success(fed_backoff *b, const char *dest);
/* Destinations in backoff now (in the table). */
int fed_backoff_count(fed_backoff *b);

/* Finish the queued writes (waiting at most drain_ms), then stop and join the writer. */
void fed_backoff_stop(fed_backoff *b, int64_t drain_ms);
void fed_backoff_free(fed_backoff *b); /* after stop */

#endif
