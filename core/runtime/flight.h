/*
 * core/runtime/flight.h - single flight: one piece of work per key, however many wait for
 * it (docs/adr/0029-single-flight.md).
 *
 * A table of flights, each named by a key. The first to join a key that has no flight
 * leads: a flight is created and the leader starts the work (a fetch, a render, a look-up)
 * and later ends it with rt_flight_finish, exactly once. Whoever joins the key meanwhile
 * only waits: its waiter is linked on the flight and told when the work ends. The result
 * (an int, and an optional value the flight owns) is handed to every waiter. A waiter that
 * stops waiting before the end (its deadline passed) leaves; the work goes on for the others
 * and rt_flight_wanted says whether anyone still waits.
 *
 * Released in two steps: work whose result is useful before its end (a file some may read
 * while it lands) publishes an early result once (rt_flight_publish). The waiters that
 * asked for it (RT_FLIGHT_EARLY) are done at once with it, the others wait for the end; a
 * join asking for it while it is out gets it at once (RT_FLIGHT_PUBLISHED, nothing
 * linked), until the work withdraws it (rt_flight_unpublish) or ends.
 *
 * Bounded: at most max_keys flights at once (so leaders) and max_waiters waiters in all on
 * work others lead; past either a join is refused at once (ATRIUM_E_LIMIT), never queued.
 * A join may also be one that never leads (RT_FLIGHT_JOIN_ONLY: ATRIUM_E_NOTFOUND when
 * nothing is under way), for a caller whose leaders pass a stricter rule than its waiters
 * (a per-user budget). Metrics (labels flights="<name>"): atrium_flights_in_flight,
 * atrium_flights_limit, atrium_flights_waiters (leaders not counted),
 * atrium_flights_refused_total, atrium_flights_shared_total (joins that found the work under
 * way), atrium_flights_left_total (waiters that left before the end).
 *
 * What this file does not do: park requests (core/http/suspend.c does, with a waiter whose
 * arm is susp_wait and whose done is susp_wake: susp_flight_join), run the work, remember
 * results after the end (a cache, if any, is its user's), or keep time (deadlines are the
 * waiters' own; the table only reads them for rt_flight_wanted).
 *
 * Threads: every function may be called from any thread. One mutex per table; a waiter's
 * `arm` runs under it (so it must only take locks that never wait for the table's), `done`
 * never does. Internal prefix: rt_flight.
 */
#ifndef ATRIUM_CORE_RUNTIME_FLIGHT_H
#define ATRIUM_CORE_RUNTIME_FLIGHT_H

#include <stdbool.h>
#include <stdint.h>

#include "core/runtime/runtime.h"

typedef struct rt_flights rt_flights;
typedef struct rt_flight rt_flight;

/* One waiter, in the joiner's memory, which must stay valid until `done` was called or
 * rt_flight_leave returned true. */
typedef struct rt_flight_waiter {
    /* Optional, set by the joiner: called under the table's lock once the join is admitted
     * (the limits passed), before the waiter is linked; a non-zero return refuses the join
     * with that value and nothing is linked (a request parks here, so the end of the work
     * cannot come before its park). */
    int (*arm)(void *arg);
    /* Called exactly once, without locks, when the flight ends - unless the waiter left
     * first. It must be quick (it runs on whichever thread finished the work) and must not
     * touch the waiter after it returns control to whoever owns it. */
    void (*done)(void *arg);
    void *arg;
    int64_t deadline_ms; /* monotonic; when the waiter stops waiting (0 = never) */
    /* private to the table */
    struct rt_flight_waiter *prev, *next;
    rt_flight *flight;
    bool linked;
    bool leads; /* the waiter that created the flight: not counted against max_waiters */
    bool early; /* joined with RT_FLIGHT_EARLY: done at the early result too */
    bool released_early; /* done (or answered at its join) with the early result */
} rt_flight_waiter;

/* What a successful join made of the caller. */
enum rt_flight_role {
    RT_FLIGHT_LEAD = 1,   /* no flight for the key: a new one; start the work, then finish */
    RT_FLIGHT_JOINED = 2, /* the work was under way: wait for its end */
    /* RT_FLIGHT_EARLY and the early result is out: nothing linked (arm not called, done
     * never called), the caller reads it at once (rt_flight_waiter_result) */
    RT_FLIGHT_PUBLISHED = 3,
};

/* Which result rt_flight_waiter_result handed over. */
enum rt_flight_result_kind {
    RT_FLIGHT_RESULT_END = 0,   /* the finish's */
    RT_FLIGHT_RESULT_EARLY = 1, /* the early one (rt_flight_publish) */
};

/* A table of at most max_keys flights at once (>= 1) and max_waiters waiters in all on
 * flights others lead (>= 1). NULL on a bad bound (logged) or out of memory. metrics may be
 * NULL. */
rt_flights *rt_flights_new(const char *name, int max_keys, int max_waiters,
                           rt_metrics *metrics);
/* The owner lets go of the table. Flights still in flight keep it until they finish (a
 * worker the core cancelled at shutdown may finish late); the last frees it. */
void rt_flights_free(rt_flights *t);

/* Join the flight of key (1 to RT_FLIGHT_KEY_MAX_BYTES - 1 bytes) with w (arm, done, arg,
 * deadline_ms set). RT_FLIGHT_LEAD or RT_FLIGHT_JOINED, with *out the flight and one
 * reference to it for the caller (rt_flight_unref when done with its result); w is then
 * linked, and done(arg) will be called once unless w leaves first. RT_FLIGHT_PUBLISHED
 * (flags has RT_FLIGHT_EARLY and the key's early result is out): *out and a reference as
 * above, but w is not linked and nothing will be called: read the result now. Otherwise
 * nothing happened: ATRIUM_E_LIMIT (max_keys flights, or max_waiters waiters),
 * ATRIUM_E_NOTFOUND (RT_FLIGHT_JOIN_ONLY and no flight for key, or RT_FLIGHT_EARLY_ONLY and
 * no early result out), ATRIUM_E_INVAL (a bad key or flag), ATRIUM_E_NOMEM, or arm's
 * non-zero return. */
int rt_flight_join(rt_flights *t, const char *key, unsigned flags, rt_flight_waiter *w,
                   rt_flight **out);
#define RT_FLIGHT_JOIN_ONLY 0x1u /* never lead: only wait for work under way */
#define RT_FLIGHT_EARLY 0x2u     /* be done at the early result too, when the work has one */
#define RT_FLIGHT_EARLY_ONLY 0x4u /* only take an early result that is out now (no wait) */
#define RT_FLIGHT_KEY_MAX_BYTES 4096

/* w stops waiting before the end (its deadline passed): unlinked, done is never called,
 * and true is returned. False when the flight ended first: done has been or is being
 * called (the result is there to read). */
bool rt_flight_leave(rt_flight_waiter *w);

/* The work ended: the key is free for a new flight from now on, result and value (owned by
 * the flight from here: free_value(value) when the last reference goes; both may be
 * NULL) are published, and every waiter's done is called, on this thread. Exactly once
 * per flight, by its leader or whoever it gave the work to. */
void rt_flight_finish(rt_flight *f, int result, void *value, void (*free_value)(void *));

/* The work has a result before its end: result and value (owned by the flight like the
 * finish's, freed with it; either may be NULL) are published. Every linked waiter that
 * joined with RT_FLIGHT_EARLY is unlinked and done, on this thread; the others wait for
 * the end. Joins with RT_FLIGHT_EARLY get it at once (RT_FLIGHT_PUBLISHED) until
 * rt_flight_unpublish or the finish. At most once per flight (a second call is refused:
 * false, value untouched); by whoever does the work, before rt_flight_finish. */
bool rt_flight_publish(rt_flight *f, int result, void *value, void (*free_value)(void *));
/* Joins from now on wait for the end again (the early result went stale: the work starts
 * over); waiters already released keep what they read. */
void rt_flight_unpublish(rt_flight *f);
/* After w's done (or rt_flight_leave returned false, or the join said
 * RT_FLIGHT_PUBLISHED): the result w was released with, into *result and *value (either
 * may be NULL), and which one it was (enum rt_flight_result_kind). */
int rt_flight_waiter_result(rt_flight_waiter *w, int *result, void **value);

/* True once the flight finished; then *result and *value (either may be NULL) are its
 * result. The caller holds a reference. */
bool rt_flight_ended(rt_flight *f, int *result, void **value);
/* Waiters still linked whose deadline has not passed (the leader decides from it whether
 * work not yet begun is still worth beginning). */
int rt_flight_wanted(rt_flight *f);
const char *rt_flight_key(const rt_flight *f); /* valid while a reference is held */
void rt_flight_ref(rt_flight *f);
void rt_flight_unref(rt_flight *f);

/* Flights in flight and waiters on flights others lead, now (tests, metrics). */
int rt_flights_in_flight(rt_flights *t);
int rt_flights_waiting(rt_flights *t);

#endif
