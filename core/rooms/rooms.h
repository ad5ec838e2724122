/*
 * core/rooms/rooms.h - the room model: the tables of the persisted event graph, its
 * failures, reading stored events back (events_store.c), membership and history
 * visibility (rooms_vis.c), and room event filters. Nothing here knows about HTTP: the
 * client API's room endpoints (core/client/rooms/) use it now, the federation API next.
 *
 * The model's other parts have their own headers: canonical_json.h (canonical JSON,
 * hashes, base64), events.h (room versions, event IDs, building and redacting events,
 * the client format) and room_auth.h (the authorization rules). The write path that turns
 * a client's intent into a stored event is the client's (core/rooms/rooms_tx.c).
 *
 * The data model (migrations of owner "rooms", ROOMS_MIGRATIONS in rooms.c: 1 the tables;
 * 2 adds event_relations, the index of m.relates_to filled at write time; 3 adds
 * events.search_tsv, the full-text column of POST /search; 4 the event graph of federated
 * rooms, events_graph.h: prev/auth edges, forward extremities, outliers, soft-failed and
 * rejected events, state snapshots; 5 positions for backfilled history; 6 remote_knocks,
 * the stripped state of rooms of other servers a local user knocked on; 7 the index
 * timestamp_to_event reads, rooms_jump.c):
 *   rooms         one row per room: version, creator, the newest event and the greatest
 *                 depth. Its row lock serializes writes to one room, whoever created the
 *                 event (the forward extremities, several after concurrent sends, are
 *                 room_extremities: events_graph.h).
 *   events        every accepted event, ours or another server's: its stream position
 *                 (stream_seq), ID, PDU text, the state event it replaced, the redaction
 *                 that redacted it, the sender's device + transaction ID, and the server
 *                 that delivered it (origin; NULL for ours).
 *   current_state (room_id, type, state_key) -> event_id, membership: the contract other
 *                 modules read (notifier_wake_room).
 *   memberships   the history of every user's membership per room, by stream position:
 *                 "what was U's membership in R at position P" is one index probe. The
 *                 newest row carries `forgotten`.
 *   event_txns    (user, device, txn_id) -> event_id: send idempotency.
 *   receipts, typing: ephemeral data with stream positions.
 * State at a position P of a room is, per (type, state_key), the newest state event with
 * stream_pos <= P: what client readers use. Where federated forks meet, current_state is
 * their resolution (core/federation/rooms/fed_rooms_recv.c) and the state each federated
 * event was authorized against is a snapshot (events_graph.h).
 *
 * Stream positions: rows take them with the SQL function stream_next() (a shared advisory
 * lock, then nextval), and /sync reads the newest safe position with stream_upto() (the
 * exclusive lock, then the sequence), so a sync never hands out a token past a position
 * whose transaction has not committed. Internal prefix: rooms_.
 */
#ifndef ATRIUM_CORE_ROOMS_ROOMS_H
#define ATRIUM_CORE_ROOMS_ROOMS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/rooms/events.h"
#include "core/rooms/room_auth.h"
#include "core/store/db.h"

/* The migrations of owner "rooms" (rooms.c), applied by the rooms module (core/client/rooms/). */
#define ROOMS_N_MIGRATIONS 10
extern const atrium_migration ROOMS_MIGRATIONS[ROOMS_N_MIGRATIONS];

/* ---- failures ----------------------------------------------------------------------- */

enum rooms_failure {
    ROOMS_OK = 0,
    ROOMS_E_FORBIDDEN = -100, /* 403 M_FORBIDDEN (auth rules, not a member) */
    ROOMS_E_NOT_FOUND = -101, /* 404 M_NOT_FOUND */
    ROOMS_E_TOO_LARGE = -102, /* 413 M_TOO_LARGE */
    ROOMS_E_BAD_JSON = -103,  /* 400 M_BAD_JSON (not canonical, malformed) */
    ROOMS_E_DB = -104,        /* 503 M_UNKNOWN, retry */
    ROOMS_E_TXN_RACE = -105,  /* the transaction ID was stored meanwhile: look it up */
    ROOMS_E_NO_DIRECTORY = -106, /* 400 M_UNRECOGNIZED: aliases need the disabled directory */
    ROOMS_E_BAD_ALIAS = -107,    /* 400 M_BAD_ALIAS (m.room.canonical_alias) */
    ROOMS_E_ALIAS_IN_USE = -108, /* 400 M_ROOM_IN_USE */
    ROOMS_E_INVALID = -109,      /* 400 M_INVALID_PARAM */
    ROOMS_E_UNABLE_TO_AUTHORISE = -110, /* 400 M_UNABLE_TO_AUTHORISE_JOIN (restricted join) */
    ROOMS_E_UNABLE_TO_GRANT = -111,     /* 400 M_UNABLE_TO_GRANT_JOIN: try another server */
};

typedef struct rooms_err {
    int code;
    char why[ROOM_AUTH_WHY_LEN];
} rooms_err;
/* Set e and return its code. */
int rooms_set_err(rooms_err *e, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- database helpers --------------------------------------------------------------- */

/* One parameterized statement: the result (tuples or command OK), or NULL after logging.
 * *unique_violation (may be NULL) is set when it failed on a unique constraint. */
PGresult *rooms_q(PGconn *c, const char *sql, int n, const char *const *params,
                  bool *unique_violation) RT_MUST_CHECK;
/* rooms_q's second half for a statement sent with db_query_send: res (db_query_result's)
 * when it holds tuples or a command's success, else NULL after logging (res cleared). */
PGresult *rooms_q_taken(PGresult *res) RT_MUST_CHECK;
/* A statement whose result is not needed: db_exec (core/store/db.h). */
/* Milliseconds since the Unix epoch (origin_server_ts). */
int64_t rooms_wall_ms(void);
/* This server's name (server_name), for `origin` and new room IDs; "localhost" when no
 * runtime object is bound (unit tests). Any thread. */
const char *rooms_server_name(void);

/* The stream is what clients read; events_graph.h keeps the graph beside it. An event
 * from another server joins the stream once accepted, at the end (its position is when
 * it arrived here), so "state at P" stays the line's answer for readers. */

/* ---- reading (events_store.c) ------------------------------------------------------- */

typedef struct rooms_vis rooms_vis; /* below: what one user may see of one room */

/* The column list every event read selects, FROM events e with the joins the client
 * format needs; append "WHERE ..." (qualify columns with e.). Besides the event: the state
 * event it replaced (p), the redaction that redacted it (rd), and for each of the three
 * whether its sender was erased (erased_users, a small table: one hash join each). */
#define EVENTS_SELECT                                                                       \
    "SELECT e.stream_pos, e.event_id, e.pdu, e.redacted_by, e.txn_device, e.txn_id,"       \
    " rm.room_version, p.pdu, p.redacted_by, rd.pdu, rd.event_id, e.replaces_state,"        \
    " eu.user_id IS NOT NULL, p.stream_pos, pu.user_id IS NOT NULL, rd.stream_pos,"         \
    " ru.user_id IS NOT NULL, e.depth"                                                      \
    " FROM events e JOIN rooms rm ON rm.room_id = e.room_id"                                \
    " LEFT JOIN events p ON p.event_id = e.replaces_state"                                  \
    " LEFT JOIN events rd ON rd.event_id = e.redacted_by"                                   \
    " LEFT JOIN erased_users eu ON eu.user_id = e.sender"                                   \
    " LEFT JOIN erased_users pu ON pu.user_id = p.sender"                                   \
    " LEFT JOIN erased_users ru ON ru.user_id = rd.sender "
#define EVENTS_COL_POS 0
#define EVENTS_COL_DEPTH 17

/* Who reads: rendering depends on it (transaction_id, and erasure: rooms_erasure_hides). */
typedef struct events_view {
    const char *user_id, *device_id; /* the viewer: transaction_id for its own device */
    bool with_room_id;                /* /sync leaves room_id out */
    int64_t now_ms;                   /* wall clock, for unsigned.age */
    /* The reader's visibility in the room the events come from (borrowed; its joined
     * ranges decide erasure), or NULL: a reader never joined, for whom every event an
     * erased user sent is hidden. One room per view: a reader of several rooms (sync,
     * search) sets it per room. */
    const rooms_vis *reader;
    /* The reader was joined at every event it reads (GET /notifications: only members are
     * notified): erasure hides nothing from it. */
    bool reader_joined;
} events_view;

/* Row `row` of an EVENTS_SELECT result in the client format (with unsigned: age,
 * transaction_id, prev_content, replaces_state, redacted_because). An event, replaced
 * state or redaction that erasure hides from v's reader (rooms_erasure_hides) is rendered
 * redacted. NULL on a corrupt row (logged). */
json_t *events_render(const events_view *v, PGresult *res, int row);
/* The stream position of row `row`. */
int64_t events_pos(PGresult *res, int row);
/* Run an EVENTS_SELECT query and append every row, rendered, to array `out`. The number of
 * rows, or ROOMS_E_DB. */
int events_fetch(PGconn *c, const events_view *v, const char *sql, int n,
                 const char *const *params, json_t *out, int64_t *first_pos, int64_t *last_pos);
/* Where an event sits in the room's topological order (the client API's /messages and
 * /context: by depth, then by stream position within a depth, as the spec orders a room's
 * history and Synapse does). */
typedef struct events_topo {
    int64_t depth, pos;
} events_topo;
/* events_fetch, with the topological places of the first and last rows. */
int events_fetch_topo(PGconn *c, const events_view *v, const char *sql, int n,
                      const char *const *params, json_t *out, events_topo *first, events_topo *last);
/* The room's state at position upto (INT64_MAX: the current state), in the client format,
 * appended to out in stream order. With members not NULL (a JSON array of user IDs), the
 * only m.room.member events are those of these users (lazy loading). With types not NULL
 * (a PostgreSQL array literal), only these event types. Rows or ROOMS_E_DB. */
int events_state_at(PGconn *c, const events_view *v, const char *room_id, int64_t upto,
                    const json_t *members, const char *types, json_t *out);
/* A PostgreSQL text[] literal of the strings of a JSON array. NULL on
 * out-of-memory; the result lives in the arena. */
const char *rooms_pg_array(rt_arena *a, const json_t *strings);
/* The state changes of a window: per (type, state_key) the newest state event with
 * after < pos <= upto (after 0: the whole state at upto), filtered as events_state_at. */
int events_state_between(PGconn *c, const events_view *v, const char *room_id, int64_t after,
                         int64_t upto, const json_t *members, const char *types, json_t *out);
/* The PDU of a stored event with its room version, or NULL (not found / database). */
json_t *events_load_pdu(PGconn *c, const char *event_id, const char *room_id,
                        const room_version **ver_out, bool *redacted_out);

/* ---- membership and visibility ------------------------------------------------------ */

/* A user's membership in a room at position upto (INT64_MAX: now). *pos_out gets the
 * membership event's position (0 if none). Writes the membership ("join", ...) into out
 * ("" when the user never had one). ROOMS_OK or ROOMS_E_DB. */
int rooms_membership_at(PGconn *c, const char *room_id, const char *user_id, int64_t upto,
                        char out[16], int64_t *pos_out);
/* Append to array out the IDs of the rooms user_id is joined to now (with_invites: or
 * invited to), in room ID order, at most limit of them (limit < 0: all). The number
 * appended, or ROOMS_E_DB. */
int rooms_user_room_ids(PGconn *c, const char *user_id, bool with_invites, int64_t limit,
                        json_t *out);
/* History visibility (rooms_vis.c owns the rule). For user U and an event E at position p,
 * with hv the room's m.room.history_visibility before E ("shared" when unset) and mem U's
 * membership before E, E is visible when: it is U's own m.room.member event; or hv is
 * "world_readable"; or mem is "join"; or hv is "shared" and U is joined now; or hv is
 * "invited" and mem is "invite". An m.room.history_visibility event is also visible when
 * its own new value would allow it (the spec: before or after). A value that is none of
 * the four is treated as "joined" (hide rather than show). Nothing after the first
 * membership change that followed U's last join is visible (a user who left sees nothing
 * after leaving). The rule becomes a short list of visible ranges of positions. */
#define ROOMS_VIS_MAX_RANGES 64    /* visible (lo, hi] ranges kept; beyond: the oldest hidden */
#define ROOMS_VIS_MAX_CHANGES 1000 /* changes of each kind read; before them: the strictest */
#define ROOMS_VIS_PARAMS 7         /* SQL parameters rooms_vis_window uses */

typedef enum rooms_hv {            /* strictest first */
    ROOMS_HV_JOINED = 0,
    ROOMS_HV_INVITED,
    ROOMS_HV_SHARED,
    ROOMS_HV_WORLD_READABLE,
} rooms_hv;

typedef enum rooms_mem {
    ROOMS_MEM_NONE = 0, /* none, leave, ban, knock */
    ROOMS_MEM_INVITE,
    ROOMS_MEM_JOIN,
} rooms_mem;

/* What one user may see of one room's events. */
struct rooms_vis {
    int64_t lo[ROOMS_VIS_MAX_RANGES], hi[ROOMS_VIS_MAX_RANGES]; /* (lo, hi], ascending,
                                                                  * disjoint, not adjacent */
    int n;
    /* Where the user was joined: an event at pos with jlo < pos <= jhi saw the user's
     * membership "join" just before it (from the join after it to the change that ended
     * it, included). Ascending, disjoint; past ROOMS_VIS_MAX_RANGES the oldest go (not
     * joined there: erasure then hides more, never less). Backfilled history (pos <= 0)
     * is never joined. */
    int64_t jlo[ROOMS_VIS_MAX_RANGES], jhi[ROOMS_VIS_MAX_RANGES];
    int n_joined;
    int64_t upto;      /* nothing after: INT64_MAX unless the user left after their last join */
    int64_t floor;     /* nothing at or before (own membership events included); INT64_MAX:
                        * nothing at all */
    bool ever_joined;  /* readers answer 403 without, unless world_readable */
    bool world_readable; /* the room's history_visibility now is world_readable: anyone
                          * may read it (what the rule lets them see) */
    int dropped;       /* ranges hidden by ROOMS_VIS_MAX_RANGES */
    bool backfilled;   /* events at positions <= 0 (history backfilled from other servers,
                        * older than anything this server saw live) are visible: not in
                        * lo/hi, added by rooms_vis_window */
    const char *user_id; /* borrowed: own membership events are always visible */
};


/* One change at a stream position: value is a rooms_hv or a rooms_mem. */
typedef struct rooms_vis_change {
    int64_t pos;
    int value;
} rooms_vis_change;

/* A room's history_visibility changes and a user's membership changes, each ascending.
 * *_truncated: older changes exist but were not read (the state before the oldest one
 * read is then taken to be the strictest: "joined", no membership). */
typedef struct rooms_vis_history {
    const rooms_vis_change *mem, *hv;
    int n_mem, n_hv;
    bool mem_truncated, hv_truncated;
} rooms_vis_history;

/* The value of a history_visibility content field (NULL or unknown: ROOMS_HV_JOINED) and
 * of a membership. */
rooms_hv rooms_hv_parse(const char *value);
rooms_mem rooms_mem_parse(const char *membership);
/* The visible ranges of a history, by the rule above (pure; any thread). */
void rooms_vis_compute(const rooms_vis_history *h, const char *user_id, rooms_vis *out);
/* Read the history of (room_id, user_id) with one query and compute it. The room is not
 * checked to exist. ROOMS_OK or ROOMS_E_DB. user_id must outlive *out. */
int rooms_vis_load(PGconn *c, const char *room_id, const char *user_id, rooms_vis *out);
/* rooms_vis_load for each room of the array room_ids (strings), into out[i], with one
 * query. ROOMS_OK or ROOMS_E_DB. */
int rooms_vis_load_many(PGconn *c, const json_t *room_ids, const char *user_id, rooms_vis *out);
/* What a reader of room_id may see: ROOMS_OK with *out; ROOMS_E_FORBIDDEN (e set) when the
 * user was never joined (no peeking, whatever the history_visibility), ROOMS_E_NOT_FOUND
 * for an unknown room, ROOMS_E_DB. A room whose history_visibility is world_readable now is
 * readable by anyone (the rule still decides which events). */
int rooms_visibility(PGconn *c, const char *room_id, const char *user_id, rooms_vis *out,
                     rooms_err *e);
/* Restrict a query on events e to what v shows within the window lo < pos <= hi (hidden:
 * to what it hides there): *sql gets a condition (" AND ...", in arena a) using
 * parameters $n .. $n+ROOMS_VIS_PARAMS-1, whose values go to p[0 .. ROOMS_VIS_PARAMS-1].
 * false when the window is empty, or nothing in it can be visible (not hidden), or out of
 * memory: the caller answers with no events instead of querying. */
bool rooms_vis_window(rt_arena *a, const rooms_vis *v, int64_t lo, int64_t hi, bool hidden,
                      int n, const char **sql, const char **p);
/* rooms_vis_window (not hidden) for n rooms in one query: room i's window lo[i] < pos <=
 * hi[i] and visibility v[i] (all of one user), k the SQL expression of the row's room
 * index from 1. open[i]: can anything of room i's window be visible (when not, the
 * condition is false for it, and the caller need not ask). Parameters $pn ..
 * $pn+ROOMS_VIS_MANY_PARAMS-1 into p. false when out of memory. */
#define ROOMS_VIS_MANY_PARAMS 8
bool rooms_vis_window_many(rt_arena *a, const rooms_vis *const *v, const int64_t *lo, const int64_t *hi,
                           int n, int pn, const char *k, bool *open, const char **sql, const char **p);
/* Does v show every event with lo < pos <= hi (nothing hidden in the window)? A window
 * past v->upto is not covered. */
bool rooms_vis_covers(const rooms_vis *v, int64_t lo, int64_t hi);
/* Was v's user joined to the room at the event at position pos (its membership just
 * before the event "join")? */
bool rooms_vis_joined_at(const rooms_vis *v, int64_t pos);

/* Erasure. A user deactivated with erase: true is a row of erased_users (accounts
 * migration 8, core/client/accounts/deactivate.c). Their events are then served redacted,
 * with the room version's redaction algorithm, to every reader who was not joined to the
 * room at the event (who joined later, or never), and to every other server; a reader
 * who was joined then saw them and still does. What it covers: the user's events that
 * are not state, and their m.room.member events (their profile: display name, avatar).
 * Their other state events (a room's name, topic, encryption, power levels, join rules)
 * are the room's configuration, which every member's client relies on (an m.room.encryption
 * event redacted would read as "not encrypted"): they are served as they are. The rule
 * lives in rooms_erasure_hides; rooms_erasure_sql is its twin for a query that must not
 * match what it hides (search). */
/* Does erasure cover an event of this type (is_state: it has a state_key)? */
bool rooms_erasure_covers(const char *type, bool is_state);
/* Does erasure hide the content of the event at pos, of this type, from v's reader, when
 * its sender is erased (sender_erased)? */
bool rooms_erasure_hides(const events_view *v, bool sender_erased, const char *type,
                         bool is_state, int64_t pos);
/* Does erasure hide the content of an event of this type from other servers, when its
 * sender is erased? They are all served the redacted event (they may pass it on to
 * users who join later; a server that had it keeps what it has). */
bool rooms_erasure_hides_from_servers(bool sender_erased, const char *type, bool is_state);
/* Is user_id erased? 1, 0, or ROOMS_E_DB. */
int rooms_user_erased(PGconn *c, const char *user_id);
/* The SQL condition (" AND ...") on events e that leaves out what erasure hides from a
 * reader joined only where the boolean expression `joined` holds (SQL text, about e; e.g.
 * a column of the ranges a query joins). In arena a; NULL on out-of-memory. */
const char *rooms_erasure_sql(rt_arena *a, const char *joined);
/* Split (lo, hi] at the edges of v's joined ranges: up to max pieces (plo, phi], in
 * order, covering it, each with pj whether the user was joined there. The number of
 * pieces (at most 2 * v->n_joined + 1). */
int rooms_vis_joined_pieces(const rooms_vis *v, int64_t lo, int64_t hi, int64_t *plo,
                            int64_t *phi, bool *pj, int max);

/* The room's version, or NULL when the room does not exist (*db_failed on error). */
const room_version *rooms_version_of(PGconn *c, const char *room_id, bool *db_failed);

/* ---- jumping to a date (rooms_jump.c) ---------------------------------------------- */

#define ROOMS_JUMP_MAX_COND_PARAMS ROOMS_VIS_PARAMS /* parameters a caller's condition uses */

/* The query of timestamp_to_event: ts a non-negative integer (ms), dir "f" or "b". false
 * when either is missing or malformed (the caller answers 400 M_INVALID_PARAM). */
bool rooms_jump_parse(const char *ts_s, const char *dir_s, int64_t *ts, bool *forward);
/* The rule of timestamp_to_event (rooms_jump.c says it): the timeline events of room_id
 * nearest to ts in one direction, nearest first, at most limit, restricted by cond (NULL
 * or " AND ..." on events e, with parameters $4 .. $3+n_cp whose values are cp[0 ..
 * n_cp-1], n_cp <= ROOMS_JUMP_MAX_COND_PARAMS). Rows (event_id, origin_server_ts,
 * stream_pos), or NULL (logged; the caller answers 503). SQL text in arena a. */
PGresult *rooms_jump_candidates(PGconn *c, rt_arena *a, const char *room_id, int64_t ts,
                                bool forward, const char *cond, int n_cp,
                                const char *const *cp, int limit) RT_MUST_CHECK;

/* ---- event filters (events_store.c) ------------------------------------------------- */

/* A RoomEventFilter, as the SQL of the readers uses it: arrays are PostgreSQL text[]
 * literals (types as LIKE patterns: the spec's '*' wildcard becomes '%'), NULL = no
 * condition. */
typedef struct room_filter {
    int64_t limit; /* -1 when not given */
    const char *types, *not_types, *senders, *not_senders;
    bool lazy_load_members;
    /* Not the client's: the reader's m.ignored_user_list as a text[] literal (NULL: nobody),
     * set by the endpoint (rooms_ignored_users) and used with rooms_ignored_sql. */
    const char *ignored;
} room_filter;

/* The SQL condition of a room_filter on events e, with its four arrays as parameters
 * $N (types), $N+1 (not_types), $N+2 (senders), $N+3 (not_senders). Lives in the arena. */
const char *rooms_filter_sql(rt_arena *a, int n);
/* Parse f (a RoomEventFilter object; NULL = no filter) into out. false with why (for 400
 * M_BAD_JSON) on wrong types. */
bool rooms_filter_parse(rt_arena *a, const json_t *f, room_filter *out, char *why, size_t len);
/* The users user_id ignores (the `ignored_users` keys of its global m.ignored_user_list
 * account data) as a text[] literal in arena a, or *out NULL when nobody is. Read once per
 * request by the readers of timelines. ROOMS_OK or ROOMS_E_DB (logged). */
int rooms_ignored_users(PGconn *c, rt_arena *a, const char *user_id, const char **out);
/* The rule of rooms_ignored_users as SQL: the text[] literal (NULL: nobody) of an
 * m.ignored_user_list row's `content` (a list that is not an object of users ignores
 * nobody, as Synapse reads it). */
#define ROOMS_IGNORED_USERS_SQL(content)                                                        \
    "(SELECT array_agg(k)::text FROM jsonb_object_keys(CASE WHEN jsonb_typeof(" content         \
    "->'ignored_users') = 'object' THEN " content "->'ignored_users' ELSE '{}' END) k)"
/* The SQL condition that leaves out of a timeline the events e of ignored users ($n, a
 * text[] or NULL): their message events go, their state events stay (the spec's rule:
 * ignoring does not hide the room's state). Lives in the arena. */
const char *rooms_ignored_sql(rt_arena *a, int n);


/* ---- identifiers -------------------------------------------------------------------- */

/* Is id a syntactically valid user ID ("@local:server", <= 255 bytes, the server a server
 * name by rt_server_name_valid)? Room ID ("!local:server", the same)? */
bool rooms_user_id_ok(const char *id);
bool rooms_room_id_ok(const char *id);

#endif
