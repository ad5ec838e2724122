/*
 * core/client/sync/ssync.h - Simplified Sliding Sync (MSC4186, unstable prefix
 * org.matrix.simplified_msc3575): what its files share.
 *
 *   ssync.c          the endpoint: one run, parking like /sync, the response's top level
 *   ssync_request.c  the request body, checked and bounded (400 at once for bad input)
 *   ssync_conn.c     the connection state in PostgreSQL: pos tokens and what each
 *                    connection has sent (docs/adr/0010-sliding-sync-connection-state.md)
 *   ssync_lists.c    the user's rooms: filters, activity order (bump_stamp), windows
 *   ssync_room.c     one room's result, built from /sync's readers (sync_rooms.h)
 *   ssync_facts.c    what those results read, read once for all the picked rooms
 *   ssync_reads.c    their timelines and required_state, read once for all of them
 *   ssync_ext.c      the extensions: to_device, e2ee, account_data, receipts, typing
 *   ssync_hits.c     joined rooms' first results taken kept when nothing of theirs changed
 *   ssync_cache.c    where they are kept (bounded by sliding_sync.cache_mb)
 *
 * Internal prefix: ssync_.
 */
#ifndef ATRIUM_CORE_SSYNC_H
#define ATRIUM_CORE_SSYNC_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/client/sync/sync.h"
#include "core/client/sync/sync_rooms.h"
#include "core/runtime/core_runtime.h"

/* The endpoint's route, metrics and /versions flag (called by the sync module's init),
 * and its tables (migrations of the sync module). */
int ssync_init(core_runtime *rt);
#define SSYNC_N_MIGRATIONS 5
/* The event types that bump a room in activity order (Synapse's list), as SQL. */
#define SSYNC_BUMP_TYPES_SQL                                                                   \
    "('m.room.create', 'm.room.message', 'm.room.encrypted', 'm.sticker', 'm.call.invite',"      \
    " 'm.poll.start', 'm.beacon_info')"
extern const atrium_migration SSYNC_MIGRATIONS[SSYNC_N_MIGRATIONS];

/* Documented limits of a request (README.md, "Simplified Sliding Sync"). Past a MAX_*
 * count the request is refused 400; values past a CLAMP are lowered to it. */
#define SSYNC_MAX_LISTS 100            /* lists per request */
#define SSYNC_MAX_RANGES 10            /* ranges per list */
#define SSYNC_MAX_SUBSCRIPTIONS 100    /* room_subscriptions per request */
#define SSYNC_MAX_REQUIRED_STATE 100   /* [type, state_key] pairs per list or subscription */
#define SSYNC_MAX_FILTER_ITEMS 100     /* entries of spaces / room_types / not_room_types */
#define SSYNC_MAX_EXT_NAMES 100        /* lists / rooms an extension is limited to */
#define SSYNC_CLAMP_TIMELINE_LIMIT 100 /* timeline events per room */
#define SSYNC_CLAMP_RANGE_END 100000   /* a range's last index */
#define SSYNC_MAX_TIMEOUT_MS (5 * 60 * 1000)
#define SSYNC_MAX_CONN_ID_BYTES 255
#define SSYNC_MAX_KEY_BYTES 255        /* list names, room IDs, types */

/* What one list or subscription asks for each of its rooms. */
typedef struct ssync_config {
    int64_t timeline_limit;
    const json_t *required_state; /* the request's array of [type, state_key] (checked) */
} ssync_config;

/* A list's filters; -1 = unset for the three-valued flags. */
typedef struct ssync_filters {
    int is_dm, is_encrypted, is_invite;
    const json_t *room_types, *not_room_types, *spaces, *tags, *not_tags; /* arrays or NULL */
} ssync_filters;

typedef struct ssync_list {
    const char *name;
    ssync_config cfg;
    ssync_filters f;
    int n_ranges; /* -1: no ranges, the whole list */
    int64_t ranges[SSYNC_MAX_RANGES][2];
} ssync_list;

typedef struct ssync_sub {
    const char *room_id;
    ssync_config cfg;
} ssync_sub;

/* An extension that applies to some lists and rooms ("*" or absent: all of them). */
typedef struct ssync_ext_scope {
    bool enabled;
    const json_t *lists, *rooms; /* arrays of strings, or NULL for all */
} ssync_ext_scope;

typedef struct ssync_request {
    const char *conn_id;      /* "" when absent */
    const json_t *txn_id;     /* echoed, or NULL */
    const char *pos;          /* the query's pos, or NULL */
    int64_t timeout_ms;
    ssync_list *lists;
    size_t n_lists;
    ssync_sub *subs;
    size_t n_subs;
    bool to_device;
    const char *to_device_since; /* NULL: from the start */
    bool e2ee;
    ssync_ext_scope account_data, receipts, typing;
} ssync_request;

/* Parse and check the request of r (body and query) into q, in r's arena; the body's
 * JSON stays r's. false after answering 400. [req] */
bool ssync_request_parse(atrium_req *r, ssync_request *q);

/* ---- connection state (ssync_conn.c) ---------------------------------------------- */

/* What a pos token stands for: the stream position it was computed up to, and per room
 * what the connection sent: {room_id: [sent_upto, membership, timeline_limit,
 * required_state key]}; the lists' counts. */
typedef struct ssync_pos {
    int64_t conn_key;  /* 0: a new connection (no pos) */
    int64_t pos;       /* the position's number (its token, written canonically) */
    int64_t stream_pos;
    json_t *rooms;     /* owned */
    json_t *counts;    /* owned: {list: count} */
    int64_t upto;      /* stream_upto() when it was loaded (a request with pos reads it so) */
    /* The connection's plan_cache_mode before the run set generic plans (ssync.c,
     * "Generic plans"), to be restored before the connection goes back; "" when the run
     * has not set them or has restored it already. */
    char plan_mode[SYNC_PLAN_MODE_MAX];
    char *account_data; /* SSYNC_ACCOUNT_DATA_SQL's text, read with the position (owned) */
} ssync_pos;

/* The account data the lists read (ssync_lists.c: the ignore list, m.direct, the rooms'
 * tags), as one column of the statement that starts a run (user: the SQL of its user
 * parameter), so it costs no round trip of its own: a JSON array of [room_id, type,
 * value as text]. */
#define SSYNC_ACCOUNT_DATA_SQL(user)                                                           \
    "(SELECT coalesce(json_agg(json_build_array(ad.room_id, ad.type, ad.v)), '[]')::text FROM" \
    " (SELECT room_id, type, CASE WHEN type = 'm.ignored_user_list' THEN "                     \
    ROOMS_IGNORED_USERS_SQL("content") " WHEN type = 'm.tag' THEN (content -> 'tags')::text"  \
    " ELSE content::text END AS v FROM account_data WHERE user_id = " user                      \
    " AND ((room_id = '' AND type IN ('m.direct', 'm.ignored_user_list'))"                     \
    " OR (room_id <> '' AND type = 'm.tag' AND jsonb_typeof(content -> 'tags') = 'object'))) ad)"

/* Load the state of pos for (user, device, conn_id), with stream_upto() read after it,
 * and drop the connection's positions older than it (the client has seen pos); in the
 * same statement, generic plans for the run (out->plan_mode set) and the user's account
 * data (out->account_data) when it is found. 1 found, 0 unknown or expired, -1 database. */
int ssync_conn_load(PGconn *c, const char *user, const char *device, const char *conn_id,
                    const char *pos, ssync_pos *out);
/* Who a new connection is (ssync_conn_save starts it). */
typedef struct ssync_conn_new {
    const char *user, *device, *conn_id;
} ssync_conn_new;
/* Store a new position of conn_key (committed before it returns): its token into
 * `token` (at least 24 bytes). With `fresh` (conn_key unused), the connection (user,
 * device, conn_id) is started afresh in the same statement (replacing one of that name),
 * dropping the device's least recently used connections past SSYNC_MAX_CONNECTIONS
 * (counted in atrium_sliding_sync_connections_dropped_total). When it is stored, the
 * connection's plan_cache_mode is set back to plan_mode (unless "") in the same statement
 * and plan_mode emptied. 0, or -1 (the connection was dropped meanwhile, or the database
 * failed). */
int ssync_conn_save(PGconn *c, const ssync_conn_new *fresh, int64_t conn_key, int64_t stream_pos,
                    const json_t *rooms, const json_t *counts, char plan_mode[SYNC_PLAN_MODE_MAX],
                    char *token, size_t len);
void ssync_pos_clear(ssync_pos *p);
/* The metric, registered once at start-up. */
void ssync_conn_metrics(rt_metrics *metrics);
/* The counters of ssync_lists.c (list reads by way). Start-up. */
void ssync_lists_metrics(rt_metrics *metrics);

/* ---- the user's rooms (ssync_lists.c) --------------------------------------------- */

/* What a kept result was made from (ssync_hits.c says what each is); compared whole. Read
 * by SSYNC_ROOM_STAMP_SQL (a room's three, `room` its room ID, `upto` the run's position,
 * `user` the user) and SSYNC_USER_STAMP_SQL (the user's two), as columns in this order. */
typedef struct ssync_stamp {
    int64_t room_max, room_min, receipt, account_data, erased;
} ssync_stamp;
#define SSYNC_ROOM_STAMP_SQL(room, upto, user)                                                 \
    "coalesce((SELECT max(e.stream_pos) FROM events e WHERE e.room_id = " room                 \
    "  AND e.stream_pos <= " upto "), -9223372036854775808),"                                  \
    " coalesce((SELECT min(e.stream_pos) FROM events e WHERE e.room_id = " room "),"           \
    "  -9223372036854775808),"                                                                 \
    " coalesce((SELECT max(rc.stream_pos) FROM receipts rc WHERE rc.room_id = " room           \
    "  AND rc.user_id = " user "), 0)"
#define SSYNC_USER_STAMP_SQL(user)                                                             \
    "coalesce((SELECT max(a.stream_pos) FROM account_data a WHERE a.user_id = " user "), 0),"  \
    " coalesce((SELECT max(er.erased_ts) FROM erased_users er), 0)"

/* A room of the user, as lists see it. */
typedef struct ssync_room_row {
    const char *room_id, *membership, *event_id, *sender;
    int64_t membership_pos, bump_stamp;
    bool encrypted, is_dm;
    const char *room_type; /* NULL: no type */
    const json_t *tags;    /* the room's m.tag `tags` object, or NULL (owned by ssync_rooms) */
    bool stamped;          /* stamp read with the list (ssync_rooms_load's want_stamps) */
    ssync_stamp stamp;
} ssync_room_row;

typedef struct ssync_rooms {
    PGresult *res;            /* owns the strings of rows */
    ssync_room_row *rows;     /* activity order, newest first (the first n_ordered) */
    int n;
    /* Only the top of the order was read (no list filters; ssync_lists.c): rows
     * [0, n_ordered) are the first of the order, the rest the other rooms the request or
     * the connection names, in no order; `total` is the count of the whole order. Else
     * n_ordered == n and every room is there. */
    int n_ordered;
    int64_t total;
    json_t *tags;             /* {room_id: tags object} */
} ssync_rooms;

/* The rooms lists may hold, as of upto: joined, invited, knocked, and those left or
 * banned after `prev` (0: none), newest activity first; encryption and room type only when
 * one of q's lists filters on them. When no list filters, only the top of that order
 * (as far as the lists' ranges reach) and the rooms named by q's subscriptions or by
 * `sent` (the connection's room map, or NULL). Sets s->timeline.ignored (the user's
 * ignore list, from account_data: SSYNC_ACCOUNT_DATA_SQL's text). With want_stamps, the
 * rows of the top of the order read the short way carry their stamps (ssync_stamp: a
 * round trip fewer for a new connection's kept results). ROOMS_OK or ROOMS_E_DB. */
int ssync_rooms_load(sync_ctx *s, const ssync_request *q, int64_t prev, const json_t *sent,
                     const char *account_data, bool want_stamps, ssync_rooms *out);
void ssync_rooms_free(ssync_rooms *rs);
/* Apply every list to rs: counts into `counts` ({list: count}), and for each room in a
 * list's window its combined config and list names into `picked`
 * ({room_id: {"i": row index, "tl": limit, "rs": [pairs...], "lists": [...]}}). */
int ssync_lists_apply(sync_ctx *s, const ssync_request *q, const ssync_rooms *rs,
                      json_t *counts, json_t *picked);
/* Add the subscriptions to picked (rooms the user has a membership in only). */
void ssync_subs_apply(const ssync_request *q, const ssync_rooms *rs, json_t *picked);

/* ---- the picked rooms' facts (ssync_facts.c) --------------------------------------- */

/* What a room's result reads besides its timeline and required_state. */
typedef struct ssync_facts {
    rooms_vis vis;                 /* what the user may see of it */
    bool has_name, has_avatar;     /* a current m.room.name / m.room.avatar exists */
    int64_t name_pos, avatar_pos;  /* their positions */
    const char *name, *avatar;     /* their values (r's arena); NULL: unset or empty */
    json_int_t joined, invited;    /* member counts */
    json_t *heroes;                /* [{user_id, displayname?, avatar_url?}] (owned) */
    json_int_t notification_count, highlight_count;
} ssync_facts;

/* A read of facts under way: the second connection it borrowed, if any. */
typedef struct ssync_facts_read {
    PGconn *c2; /* NULL: none, everything is read on s->c */
} ssync_facts_read;

/* The facts of each room of the array ids (strings) into out[i], in two calls around the
 * reads of the window's timelines and required_state (ssync_reads.c), which need the
 * first call's visibility: start reads it on s->c, after sending the push rules, the
 * unread events and the names as one pipeline on a second connection the pool can spare
 * (db_acquire_spare; none: none); finish (after the reads; `ok` false when they failed:
 * it only gives the connection back) takes those results and judges the unread events,
 * or without a second connection reads them on s->c.
 * docs/adr/0044-sliding-sync-reads-on-two-connections.md. ROOMS_OK or ROOMS_E_DB;
 * finish called whenever start was, ssync_facts_free(out, n) either way. */
int ssync_facts_start(sync_ctx *s, const json_t *ids, ssync_facts *out, ssync_facts_read *fr);
int ssync_facts_finish(sync_ctx *s, const json_t *ids, ssync_facts *out, ssync_facts_read *fr, bool ok);
void ssync_facts_free(ssync_facts *f, size_t n);
/* The counters of runs that read on a second connection or found none. Start-up. */
void ssync_facts_metrics(rt_metrics *metrics);

/* ---- one room (ssync_room.c) and the window's reads (ssync_reads.c) --------------- */

/* What a picked room's result reads, decided by ssync_room_plan before anything is read,
 * then read for every room of the window at once by ssync_reads_load. */
typedef struct ssync_plan {
    bool member;             /* joined, or was when last sent: timeline and required_state */
    bool initial, expand, new_state;
    int64_t sent_upto;
    const char *room_id;
    const rooms_vis *vis;    /* the room's facts' */
    int64_t tl_lo, limit;    /* the timeline: the newest `limit` visible events of (tl_lo, upto] */
    const json_t *pairs;     /* the required_state pairs */
    int64_t state_after;     /* required_state: the changes after it (0: the current state) */
    int64_t prev;            /* the previous pos's stream position (num_live), 0 first */
    sync_timeline t;         /* read: events owned */
    json_t *state;           /* read: the required_state events (owned) */
    json_int_t num_live;     /* read */
} ssync_plan;

/* The plan of one picked room (facts: its ssync_facts; sent: the connection's
 * [sent_upto, membership, timeline_limit, required_state key] for it, or NULL; prev: the
 * previous pos's stream position, 0 first). */
void ssync_room_plan(const ssync_room_row *row, const ssync_facts *facts, const json_t *pick,
                     const json_t *sent, int64_t prev, ssync_plan *out);
/* The timelines (bundles included), required_state and num_live of every member plan,
 * with a few queries for all of them (ssync_reads.c). ROOMS_OK or ROOMS_E_DB;
 * ssync_plans_free either way. */
int ssync_reads_load(sync_ctx *s, ssync_plan *plans, size_t n);
void ssync_plans_free(ssync_plan *plans, size_t n);
/* The result of one picked room into *out (NULL when nothing changed since it was last
 * sent), from its facts and its plan's reads. ROOMS_OK or ROOMS_E_DB. */
int ssync_room_result(sync_ctx *s, const ssync_room_row *row, const ssync_facts *facts,
                      const json_t *pick, const json_t *sent, const ssync_plan *plan, json_t **out);

/* Does the room's pick ask for more timeline than the connection sent it with (sent:
 * [sent_upto, membership, timeline_limit])? */
bool ssync_room_expanded(const json_t *pick, const json_t *sent);
/* A key of a set of [type, state_key] pairs (order and repeats do not matter), in r's
 * arena; and does the room's pick ("rsk") differ from the one it was sent with? */
const char *ssync_required_state_key(atrium_req *r, const json_t *pairs);
bool ssync_room_state_changed(const json_t *pick, const json_t *sent);
/* The timeline_limit to remember for a room sent as `result`: the new one after a gap
 * (limited) or a fresh start, else the larger of the two. */
int64_t ssync_room_sent_limit(const json_t *pick, const json_t *sent, const json_t *result);

/* ---- kept first results (ssync_cache.c, ssync_hits.c) ---------------------------- */

#define SSYNC_CACHE_SET_BYTES (64 * 1024) /* a set's share of the budget, about */
#define SSYNC_CACHE_WAYS 32               /* entries per set at most (2 KiB each fill it) */

typedef struct ssync_cache ssync_cache;
/* A store of at most `budget` bytes of keys and texts (NULL below SSYNC_CACHE_SET_BYTES or
 * on OOM), counted in atrium_sliding_sync_cache_* metrics. */
ssync_cache *ssync_cache_new(rt_metrics *metrics, size_t budget);
void ssync_cache_free(ssync_cache *c);
/* A copy of the text kept for key at this stamp (the caller frees it), or NULL (counted
 * as a miss; an entry of another stamp is removed). c NULL: NULL, not counted. */
char *ssync_cache_get(ssync_cache *c, const char *key, const ssync_stamp *stamp);
/* Keep text for key at stamp (replacing key's entry), pushing out the least recently
 * read entries of its set as needed; one larger than a set's share is not kept. */
void ssync_cache_put(ssync_cache *c, const char *key, const ssync_stamp *stamp, const char *text);
size_t ssync_cache_bytes(ssync_cache *c);
/* The process's store (ssync_init makes it; NULL: none, nothing kept). */
ssync_cache *ssync_cache_global(void);
void ssync_cache_set_global(ssync_cache *c);

/* The rooms of a run that may be taken kept, with their keys and stamps (r's arena). */
typedef struct ssync_hits {
    size_t n;
    const char **room_id, **key;
    ssync_stamp *stamp;
    bool *stamped;   /* stamp read, and not taken: keep the room's result */
    json_t *to_keep; /* {room_id: index} of those (owned: ssync_hits_free) */
} ssync_hits;

/* Of the rooms of ids (picked, to be read), those joined and new to the connection: read
 * their stamps, and send those kept at the same stamp from the store (into rooms, and the
 * connection's map `sent`), removing them from ids. ROOMS_OK or ROOMS_E_DB;
 * ssync_hits_free either way. */
int ssync_hits_take(sync_ctx *s, const ssync_rooms *rs, const json_t *picked, const ssync_pos *prev, json_t *ids,
                    json_t *rooms, json_t *sent, ssync_hits *h);
/* Keep the result a run read for room_id when h stamped it. */
void ssync_hits_keep(const ssync_hits *h, const char *room_id, const json_t *result, const ssync_plan *plan);
void ssync_hits_free(ssync_hits *h);

/* ---- extensions (ssync_ext.c) ----------------------------------------------------- */

/* The enabled extensions into `ext` for the window (prev, upto]; `picked` names the rooms
 * of the lists and subscriptions (receipts, typing and room account data are limited to
 * those the extension's scope names). *has_new set when one has news. ROOMS_OK or
 * ROOMS_E_DB. */
int ssync_extensions(sync_ctx *s, const ssync_request *q, const json_t *picked, int64_t prev,
                     json_t *ext, bool *has_new);

#endif
