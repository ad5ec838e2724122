/*
 * core/client/rooms/crooms_api.h - what the room endpoints share: failures as Matrix errors, the
 * write path that turns a client's intent into a stored event, membership changes,
 * readers, the request helpers and the routes. The room model they build on (tables,
 * events, auth rules, visibility) is core/rooms/rooms.h.
 *
 * The room family is one client module (ROOMS_MODULE in crooms_module.c, owner "rooms") spread over
 * files by concern (the one write path they all go through, lock, authorize, build,
 * store, is the room model's: core/rooms/rooms_tx.c),
 * crooms_create.c (createRoom), crooms_upgrade.c (room upgrades), crooms_membership.c (join, leave, invite, kick, ban, unban,
 * forget), crooms_send.c (send, state, redact), crooms_read.c (state, members, messages,
 * context, joined rooms), crooms_ephemeral.c (receipts, read markers, typing),
 * crooms_relations.c + crooms_bundle.c (relations, threads, bundled aggregations: see
 * crooms_relations.h), crooms_search.c (POST /search), crooms_timestamp.c (timestamp_to_event),
 * crooms_typing.c (typing notices that
 * run out), crooms_remote.c (joining, inviting and declining through other servers, on the
 * remote pool), crooms_knock.c (knocking, here and through other servers). /sync is its own module (sync.c). Prefix: crooms_ (CROOMS_ for
 * constants); rooms_ is the room model's (core/rooms/rooms.h).
 */
#ifndef ATRIUM_CORE_CLIENT_ROOMS_CROOMS_API_H
#define ATRIUM_CORE_CLIENT_ROOMS_CROOMS_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "atrium/directory.h"
#include "atrium/rooms.h"
#include "core/client/client.h"
#include "core/rooms/events_graph.h"
#include "core/rooms/rooms.h"
#include "core/rooms/rooms_tx.h"

#define CROOMS_MAX_BODY_BYTES (EVENT_MAX_PDU_BYTES) /* no larger body can become an event */
#define CROOMS_CREATE_MAX_BODY_BYTES (1024 * 1024)  /* createRoom: initial_state, invites */
#define CROOMS_MAX_TXN_ID_BYTES 255
#define CROOMS_MAX_REASON_BYTES 1024
#define CROOMS_MAX_INITIAL_STATE 100            /* createRoom initial_state entries */
#define CROOMS_ID_RANDOM_CHARS 18               /* "!<18 letters>:server" */
#define CROOMS_DEFAULT_VERSION "10"

/* ---- database ----------------------------------------------------------------------- */

/* A request's pooled connection: http_db_checkout / http_db_checkin (core/http/http.h). */
/* Decimal text of x in the arena / into buf. */
const char *crooms_i64(atrium_req *r, int64_t x);

/* ---- the write path (core/rooms/rooms_tx.c) -------------------------------------------- */

/* ---- the directory seam (crooms_iface.c) -------------------------------------------- */

/* Register the core's "rooms/1" interface (module init). 0 or a negative atrium_err. */
int crooms_iface_provide(void);
/* The plugin providing "directory/1" (at least its version 0: check ATRIUM_DIRECTORY_HAS
 * before a later member), or NULL when none is enabled. Any thread. */
const atrium_directory *crooms_directory(void);
/* [req] Answer 400 M_UNRECOGNIZED: the directory is disabled. Returns ATRIUM_DONE. */
int crooms_directory_disabled(atrium_req *r);
/* The room a local alias points to: ROOMS_OK, ROOMS_E_NOT_FOUND (unknown or not local),
 * ROOMS_E_NO_DIRECTORY, ROOMS_E_DB (e set). */
int crooms_resolve_alias(PGconn *c, const char *alias,
                        char room_id[ATRIUM_ROOM_ID_MAX_BYTES + 1], rooms_err *e);

/* The rule for m.room.canonical_alias content: `alias` and each of `alt_aliases` must be
 * room aliases, and each of this server's that the room's current event does not name
 * already must point to room_id in the directory (another server's: the next function).
 * ROOMS_OK, ROOMS_E_INVALID, ROOMS_E_BAD_ALIAS, ROOMS_E_DB (e set). */
int crooms_check_canonical_alias(PGconn *c, const char *room_id, const json_t *content,
                                rooms_err *e);
/* [req] The same rule for the aliases of other servers in content (after
 * crooms_check_canonical_alias passed): each that the room's current event does not name
 * must point to room_id, asked of its server through the directory (directory/1
 * alias_resolve_remote: parked under the outbound budget, one after another; the handler
 * runs again and asks again, answered from the request's state). true when they do (or
 * the directory cannot ask: not checked); false with *out the handler's return:
 * ATRIUM_PARKED, or ATRIUM_DONE after answering (400 M_BAD_ALIAS, or the look-up's
 * failure: 404 no such alias, 429, 502, 504). c stays the caller's. */
bool crooms_check_remote_canonical(atrium_req *r, PGconn *c, const char *room_id,
                                  const json_t *content, int *out);

/* ---- membership (crooms_membership.c) ------------------------------------------------ */

/* The content of a membership event for user_id: {"membership", "displayname",
 * "avatar_url"} with the profile's values when set. A new object (never NULL). */
json_t *crooms_member_content(PGconn *c, const char *user_id, const char *membership);
/* May user_id, a user of this server, be invited: one that exists (ROOMS_E_NOT_FOUND
 * otherwise) and is not deactivated (ROOMS_E_FORBIDDEN). Users of other servers are
 * invited through their server (crooms_remote_invite), which decides. */
int crooms_check_invitee(PGconn *c, const char *user_id, rooms_err *e);
/* Look up (user, device, key) in event_txns: 1 with id_out set, 0 when absent, ROOMS_E_DB. */
int crooms_txn_lookup(PGconn *c, const char *user_id, const char *device_id, const char *key,
                     char id_out[EVENT_ID_LEN]);
/* After user_id's profile changed: bring their m.room.member event in room_id in line
 * with it, as one transaction of the write path (room lock, auth rules, stream position,
 * wake-ups). Only while user_id is joined; the new content is the current one with
 * displayname and avatar_url taken from the profile (an unset or empty field removes the
 * key), membership still "join". Writes nothing when the content already matches or the
 * user is not joined: ROOMS_OK with id_out "". Otherwise ROOMS_OK with the new event's ID,
 * or a failure (e set, rolled back; id_out ""). conn held, outside any transaction. */
int crooms_member_profile_refresh(PGconn *c, rt_arena *arena, const char *room_id,
                                 const char *user_id, char id_out[EVENT_ID_LEN], rooms_err *e);
/* user_id leaves room_id, or declines its invite: one m.room.member "leave" event sent by
 * user_id, as one transaction of the write path. Writes nothing when, under the room's
 * lock, the user is neither joined, invited nor knocking: ROOMS_OK with id_out "". Otherwise
 * ROOMS_OK with the new event's ID, or a failure (e set, rolled back; id_out ""). conn
 * held, outside any transaction. For account deactivation
 * (core/client/accounts/deactivate.c). */
int crooms_member_leave(PGconn *c, rt_arena *arena, const char *room_id, const char *user_id,
                       char id_out[EVENT_ID_LEN], rooms_err *e);
/* [req] Write one event as its own transaction and answer: {"event_id"} (or {} / the
 * given body when answer is not NULL: it is stolen). Handles the transaction-ID race by
 * answering with the event stored first. Returns ATRIUM_DONE. */
int crooms_write_one(atrium_req *r, const char *room_id, const room_new_event *ev, json_t *answer);

/* ---- readers ------------------------------------------------------------------------ */

/* What a reader of one room's events holds (crooms_read.c, crooms_relations.c). */
typedef struct crooms_reader {
    const char *user, *room;
    PGconn *c;
    rooms_vis vis; /* vis.upto: the state readers' position (INT64_MAX while joined) */
    events_view view;
} crooms_reader;
/* [req] Start reading rd->room as rd->user (both set by the caller): a connection, what
 * the user may see (rooms_visibility: 404 unknown room, 403 never joined) and the view to
 * render with. true: ready, connection held; false: answered, nothing held. */
bool crooms_reader_open(atrium_req *r, crooms_reader *rd);
/* [req] End a reader: release its connection and answer body (stolen) with status, or 503
 * when body is NULL (a database failure). Returns ATRIUM_DONE. */
int crooms_reader_close(atrium_req *r, crooms_reader *rd, int status, json_t *body);

/* [req] GET /rooms/{roomId}/initialSync for user, who is neither joined to nor invited to
 * the room (core/client/sync/sync.c answers those): when the room's history visibility is
 * world_readable now, the room as anyone may read it (as Synapse answers a peeker): its
 * newest `limit` events up to stream position upto that the rule shows user, oldest
 * first, in messages {chunk, start, end}; its current state; empty presence, receipts
 * and account_data; no membership. Otherwise 403 M_FORBIDDEN (404 for an unknown room).
 * Takes its own connection; returns ATRIUM_DONE. */
int crooms_peek_initial_sync(atrium_req *r, const char *user, int64_t upto, int64_t limit);

/* [req] The events lo < pos <= hi of a reader's room (crooms_reader_open) that it may see,
 * oldest first, at most limit, message events of users rd->user ignores left out: appended
 * to out, *last the position of the last one (0 when none). The count or ROOMS_E_DB. */
int crooms_reader_events(atrium_req *r, crooms_reader *rd, int64_t lo, int64_t hi, int64_t limit,
                        json_t *out, int64_t *last);

/* [req] The filter in query parameter `name` (JSON text). false after answering 400. */
bool crooms_filter_query(atrium_req *r, const char *name, room_filter *out);

/* ---- requests ----------------------------------------------------------------------- */

/* [req] The {roomId} path parameter, checked to look like a room ID (400 otherwise). */
const char *crooms_param_room(atrium_req *r);
/* A new room ID, "!" + CROOMS_ID_RANDOM_CHARS random letters + ":" + the server's name. */
void crooms_new_room_id(char *out, size_t len);
/* The configured default room version (rooms.default_version). */
const room_version *crooms_default_version(void);
/* Pagination tokens: "s<pos>", and "b<n>" for position -n (history backfilled from other
 * servers sits at positions <= 0). /messages' places in the room's topological order,
 * "t<depth>_<pos>" (crooms_read.c), stand for their stream position here (the spec lets
 * /relations start at a /messages token). false when tok is not one. */
bool crooms_parse_token(const char *tok, int64_t *pos);
/* A "t<depth>_<pos>" token. false when tok is not one. */
bool crooms_parse_topo_token(const char *tok, int64_t *depth, int64_t *pos);
const char *crooms_token(atrium_req *r, int64_t pos);

/* Route registration, one per file. */
int crooms_create_routes(http_server *s);
int crooms_upgrade_routes(http_server *s); /* crooms_upgrade.c: POST /rooms/{roomId}/upgrade */
int crooms_membership_routes(http_server *s);
int crooms_send_routes(http_server *s);
int crooms_read_routes(http_server *s);
int crooms_ephemeral_routes(http_server *s);
int crooms_search_routes(http_server *s); /* crooms_search.c: POST /search */
int crooms_hierarchy_routes(http_server *s); /* crooms_hierarchy.c: GET /v1/rooms/{roomId}/hierarchy */
/* crooms_timestamp.c: GET /v1/rooms/{roomId}/timestamp_to_event */
int crooms_jump_routes(http_server *s);
int crooms_admin_routes(http_server *s);  /* crooms_admin.c: GET, DELETE /_synapse/admin/v1/rooms/{roomId} */
/* [req] The answer to the client for a peer's failure or refusal in a remote membership
 * step (what: the step, for the message): 504 on a timeout, 403 when federation with it
 * is not allowed, 502 otherwise; a 4xx refusal keeps its status and errcode
 * (crooms_remote.c). ATRIUM_DONE. */
struct fed_call_result; /* core/federation/transport/fed_call.h */
int crooms_remote_answer_failure(atrium_req *r, const struct fed_call_result *res,
                                const char *what);
/* PUT one membership step to dest: /_matrix/federation/v2/<step>/<room_enc>/<id_enc> with
 * v2_body, and when dest does not know that route (404 or 405 without a Matrix error or
 * with M_UNRECOGNIZED, or 400 M_UNRECOGNIZED as older servers answer), once more with the
 * v1 form, v1_body, whose [200, answer] envelope is unwrapped: *res is either's answer,
 * the caller's to clear. step: "send_join", "send_leave", "invite" (crooms_remote.c). */
void crooms_remote_put_step(atrium_req *r, const char *dest, const char *step,
                           const char *room_enc, const char *id_enc, const json_t *v2_body,
                           const json_t *v1_body, int64_t max_body, struct fed_call_result *res);
/* A membership event (join, knock, leave) completed from a resident's make_* template:
 * origin, time and content (the user's profile from c for a join or knock; c may be NULL,
 * then none), reason if not NULL, the keys of extra if not NULL (crooms_join_extras), then
 * checked to be user's own m.room.member and sealed (crooms_remote.c). A new event with its
 * ID, or NULL with e set. */
json_t *crooms_remote_complete_member(PGconn *c, const room_version *v, const json_t *tmpl,
                                     const char *user, const char *membership,
                                     const char *reason, const json_t *extra,
                                     char id[EVENT_ID_LEN], rooms_err *e);
/* [req] POST /join/{roomIdOrAlias}: the body's keys that go into the join's content, put
 * into content (crooms_membership.c). false after answering 400. */
bool crooms_join_extras(atrium_req *r, json_t *body, json_t *content);
/* [req] Join or knock: act(r, user, room_id, the alias's servers or NULL) answers. */
typedef int (*crooms_alias_act)(atrium_req *r, const char *user, const char *room_id,
                               const json_t *alias_vias);
/* [req] Resolve alias (a local one from the directory's table, another server's by asking
 * it: the request parks meanwhile) and run act on its room (crooms_membership.c). */
int crooms_act_on_alias(atrium_req *r, const char *user, const char *alias, crooms_alias_act act);
int crooms_knock_routes(http_server *s);  /* crooms_knock.c: POST /knock/{roomIdOrAlias} */
/* [req] Hand r off to the rooms module's bulk pool (one thread, a short queue), where
 * writes into many rooms run without holding a request-pool or auth thread; the handler
 * runs again there with run_reason ATRIUM_RUN_HANDOFF. ATRIUM_HANDED_OFF, or ATRIUM_DONE
 * after answering 429 (queue full) or 503 (stopping). */
int crooms_to_bulk_pool(atrium_req *r);
/* [req] Hand r off to the rooms module's remote pool (CROOMS_REMOTE_THREADS threads, a
 * short queue), where requests that wait for other servers (joining, inviting, leaving
 * through them) run holding no request-pool thread. Like crooms_to_bulk_pool otherwise. */
int crooms_to_remote_pool(atrium_req *r);
/* Join room_id through other servers (crooms_remote.c), on the remote pool's thread: the
 * via servers (a JSON array of server names, tried in order) are asked make_join, the
 * join is built, signed and sent with send_join, and the answer's state and auth chain are
 * checked (IDs, hashes, signatures, auth rules) and stored before the join. Answers r:
 * {"room_id"} or the failure. Returns ATRIUM_DONE. */
int crooms_remote_join(atrium_req *r, const char *user, const char *room_id, const json_t *vias);
/* Invite target, a user of another server, to room_id as sender (on the remote pool's
 * thread): the invite is authorized and sealed here, signed by the invitee's server
 * (PUT /v2/invite, with the room's stripped state), then stored and sent to the room's
 * other servers. content is the invite's (borrowed). Answers r; returns ATRIUM_DONE. */
int crooms_remote_invite(atrium_req *r, const char *sender, const char *room_id,
                        const char *target, json_t *content);
/* The same without the success answer, for a caller inviting several (createRoom): true
 * when target is invited (r not answered), false after answering r with the failure. */
bool crooms_remote_invite_send(atrium_req *r, const char *sender, const char *room_id,
                              const char *target, json_t *content);
/* Decline an invite to a room this server is not in (on the remote pool's thread):
 * make_leave / send_leave through the vias, then the leave kept as the user's newest
 * membership. Answers r; returns ATRIUM_DONE. */
int crooms_remote_leave(atrium_req *r, const char *user, const char *room_id, const json_t *vias);
/* Does joining room_id need other servers: unknown here, or known but with no user of
 * this server joined while other servers' users are (a room left and rejoined)? 1, 0,
 * ROOMS_E_DB. */
int crooms_join_needs_remote(PGconn *c, const char *room_id);
/* [req] The servers to join room_id through, in the order tried: the request's
 * server_name and via arguments (with msc4235 also org.matrix.msc4235.via, the space
 * hierarchy's), in the order given, the room ID's server, the servers of remote users who
 * invited ours to it, then the servers of the members this server last knew joined. May
 * repeat a name or hold this server's. A new array. */
json_t *crooms_remote_vias(atrium_req *r, PGconn *c, const char *room_id, bool msc4235);
/* Are the request's `server_name` and `via` query parameters (with msc4235 also
 * org.matrix.msc4235.via) all server names (core/runtime/server_name.h)? false after
 * answering 400 M_INVALID_PARAM naming the first that is not: checked before any of them
 * is asked (or backed off). */
bool crooms_vias_ok(atrium_req *r, bool msc4235);
/* ---- knocking (crooms_knock.c) -------------------------------------------------------- */

/* [req] The servers to withdraw user's knock on room_id through (a leave, on the remote
 * pool): the server that took the knock first, then crooms_remote_vias. A new array. */
json_t *crooms_knock_vias(atrium_req *r, PGconn *c, const char *room_id, const char *user);
/* [req] Withdraw user's knock on room_id, a room this server is not in (on the remote
 * pool's thread): make_leave / send_leave through the server that took the knock, then
 * the others (crooms_knock_vias); when none takes it, a leave of this server's own that
 * follows the knock. Either is kept as an outlier and the user's newest membership.
 * Answers r ({}, 403 when the user has no standing knock kept here, 503); returns
 * ATRIUM_DONE. */
int crooms_knock_withdraw(atrium_req *r, const char *user, const char *room_id);
#define CROOMS_REMOTE_THREADS 2
#define CROOMS_REMOTE_QUEUE 16
/* The typing reaper (crooms_typing.c), started and stopped with the rooms module. */
int crooms_typing_start(void);
void crooms_typing_stop(void);
/* A typing notice stored on c (a connection the caller holds, outside a transaction, after
 * the notice's commit) runs out at wall_ms: this process's reaper wakes then, and so do
 * those of the other processes sharing the database (a notification sent on c at once,
 * so the writer dying right after its answer cannot lose it). Any thread. */
void crooms_typing_expires_at(PGconn *c, int64_t wall_ms);
/* Typing and receipts across servers (crooms_edus.c): queue a local user's notice for the
 * room's other servers (after it was stored on c; failures are logged, the local notice
 * stands), and register the handlers of other servers' notices (at init; 0 or -1). */
void crooms_edu_typing(PGconn *c, const char *room_id, const char *user_id, bool typing);
void crooms_edu_receipt(PGconn *c, const char *room_id, const char *user_id,
                       const char *event_id, const char *ts, const char *thread_id);
int crooms_edus_init(void);


#endif
