/*
 * core/rooms/rooms.c - the room model's tables (ROOMS_MIGRATIONS; rooms.h describes the data
 * model) and the small helpers every part of it shares: failures, database calls,
 * membership look-ups, the room version of a room, and the shape of user and room IDs.
 * History visibility is rooms_vis.c; reading events back is events_store.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/config/config.h"
#include "core/rooms/rooms.h"
#include "core/runtime/core_runtime.h"
#include "core/runtime/server_name.h"

const atrium_migration ROOMS_MIGRATIONS[ROOMS_N_MIGRATIONS] = {
    {1, "rooms_events_state",
     "CREATE TABLE rooms ("
     " room_id text PRIMARY KEY,"
     " room_version text NOT NULL,"
     " creator text NOT NULL,"
     " created_ts bigint NOT NULL,"
     " last_event_id text NOT NULL DEFAULT '',"
     " last_depth bigint NOT NULL DEFAULT 0);"
     "CREATE TABLE events ("
     " stream_pos bigint PRIMARY KEY,"
     " event_id text NOT NULL UNIQUE,"
     " room_id text NOT NULL REFERENCES rooms(room_id),"
     " type text NOT NULL,"
     " state_key text,"
     " sender text NOT NULL,"
     " origin_server_ts bigint NOT NULL,"
     " depth bigint NOT NULL,"
     " pdu text NOT NULL,"
     " replaces_state text,"
     " redacted_by text,"
     " txn_device text,"
     " txn_id text);"
     "CREATE INDEX events_room_pos ON events (room_id, stream_pos);"
     "CREATE INDEX events_room_state ON events (room_id, type, state_key, stream_pos)"
     " WHERE state_key IS NOT NULL;"
     "CREATE TABLE current_state ("
     " room_id text NOT NULL,"
     " type text NOT NULL,"
     " state_key text NOT NULL,"
     " event_id text NOT NULL,"
     " membership text,"
     " PRIMARY KEY (room_id, type, state_key));"
     "CREATE INDEX current_state_members ON current_state (state_key, room_id)"
     " WHERE type = 'm.room.member';"
     "CREATE TABLE memberships ("
     " stream_pos bigint PRIMARY KEY,"
     " room_id text NOT NULL,"
     " user_id text NOT NULL,"
     " membership text NOT NULL,"
     " event_id text NOT NULL,"
     " sender text NOT NULL,"
     " forgotten boolean NOT NULL DEFAULT false);"
     "CREATE INDEX memberships_user ON memberships (user_id, room_id, stream_pos);"
     "CREATE INDEX memberships_user_pos ON memberships (user_id, stream_pos);"
     "CREATE TABLE event_txns ("
     " user_id text NOT NULL,"
     " device_id text NOT NULL,"
     " txn_id text NOT NULL,"
     " event_id text NOT NULL,"
     " created_ts bigint NOT NULL,"
     " PRIMARY KEY (user_id, device_id, txn_id));"
     "CREATE TABLE receipts ("
     " room_id text NOT NULL,"
     " user_id text NOT NULL,"
     " receipt_type text NOT NULL,"
     " thread_id text NOT NULL DEFAULT '',"
     " event_id text NOT NULL,"
     " ts bigint NOT NULL,"
     " stream_pos bigint NOT NULL,"
     " PRIMARY KEY (room_id, user_id, receipt_type, thread_id));"
     "CREATE INDEX receipts_stream ON receipts (room_id, stream_pos);"
     "CREATE TABLE typing ("
     " room_id text NOT NULL,"
     " user_id text NOT NULL,"
     " expires_ts bigint NOT NULL,"
     " stream_pos bigint NOT NULL,"
     " PRIMARY KEY (room_id, user_id));"
     "CREATE INDEX typing_stream ON typing (room_id, stream_pos);"},
    {2, "rooms_event_relations",
     /* Relations by parent (crooms_bundle.c keeps it), filled from the events stored so far. */
     "CREATE TABLE event_relations ("
     " event_id text PRIMARY KEY,"
     " room_id text NOT NULL,"
     " relates_to text NOT NULL,"
     " rel_type text NOT NULL,"
     " sender text NOT NULL,"
     " type text NOT NULL,"
     " stream_pos bigint NOT NULL,"
     " aggregation_key text);"
     "CREATE INDEX event_relations_parent ON event_relations (relates_to, rel_type, stream_pos);"
     "CREATE INDEX event_relations_threads ON event_relations (room_id, relates_to, stream_pos)"
     " WHERE rel_type = 'm.thread';"
     "INSERT INTO event_relations SELECT e.event_id, e.room_id, x.r ->> 'event_id',"
     " x.r ->> 'rel_type', e.sender, e.type, e.stream_pos,"
     " CASE WHEN x.r ->> 'rel_type' = 'm.annotation' AND jsonb_typeof(x.r -> 'key') = 'string'"
     "  THEN x.r ->> 'key' END"
     " FROM events e, LATERAL (SELECT e.pdu::jsonb -> 'content' -> 'm.relates_to' AS r) x"
     " WHERE e.redacted_by IS NULL AND e.type <> 'm.room.redaction'"
     " AND jsonb_typeof(x.r -> 'rel_type') = 'string'"
     " AND jsonb_typeof(x.r -> 'event_id') = 'string'"
     " AND length(x.r ->> 'rel_type') BETWEEN 1 AND 255"
     " AND length(x.r ->> 'event_id') BETWEEN 1 AND 255;"},
    {3, "rooms_event_search",
     /* Full text search (crooms_search.c): the searchable text of an event - content.body of
      * m.room.message, content.name of m.room.name, content.topic of m.room.topic - as a
      * generated tsvector, NULL once redacted, with a GIN index. */
     "CREATE FUNCTION events_search_text(etype text, pdu text) RETURNS text"
     " LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$"
     " DECLARE k text; v json;"
     " BEGIN"
     "  k := CASE etype WHEN 'm.room.message' THEN 'body' WHEN 'm.room.name' THEN 'name'"
     "   WHEN 'm.room.topic' THEN 'topic' END;"
     "  IF k IS NULL OR strpos(pdu, '\\u0000') > 0 THEN RETURN NULL; END IF;"
     "  v := pdu::json -> 'content' -> k;"
     "  IF json_typeof(v) IS DISTINCT FROM 'string' THEN RETURN NULL; END IF;"
     "  RETURN v #>> '{}';"
     " END $$;"
     "ALTER TABLE events ADD COLUMN search_tsv tsvector GENERATED ALWAYS AS (CASE WHEN"
     " redacted_by IS NULL THEN to_tsvector('simple'::regconfig, events_search_text(type, pdu))"
     " END) STORED;"
     "CREATE INDEX events_search ON events USING gin (search_tsv) WHERE search_tsv IS NOT NULL;"},
    {4, "rooms_event_graph",
     /* The event graph of federated rooms (events_graph.c): prev and auth edges of every
      * event, the forward extremities (several when servers sent concurrently), events
      * kept outside the timeline (outliers, soft-failed and rejected ones) and the state
      * each federated event was authorized against, as shared snapshots. Existing rooms
      * are lines: their edges come from the stored PDUs, their one extremity from
      * rooms.last_event_id. */
     "CREATE TABLE event_edges ("
     " event_id text NOT NULL,"
     " prev_id text NOT NULL,"
     " room_id text NOT NULL,"
     " PRIMARY KEY (event_id, prev_id));"
     "CREATE INDEX event_edges_prev ON event_edges (prev_id);"
     "CREATE TABLE event_auth_edges ("
     " event_id text NOT NULL,"
     " auth_id text NOT NULL,"
     " PRIMARY KEY (event_id, auth_id));"
     "CREATE TABLE room_extremities ("
     " room_id text NOT NULL,"
     " event_id text NOT NULL,"
     " PRIMARY KEY (room_id, event_id));"
     "CREATE TABLE event_outliers ("
     " event_id text PRIMARY KEY,"
     " room_id text NOT NULL,"
     " status text NOT NULL CHECK (status IN ('outlier', 'soft_failed', 'rejected')),"
     " reason text,"
     " origin text,"
     " depth bigint NOT NULL,"
     " pdu text NOT NULL,"
     " received_ts bigint NOT NULL);"
     "CREATE INDEX event_outliers_room ON event_outliers (room_id, status);"
     "CREATE TABLE state_snapshots ("
     " snapshot_id bigserial PRIMARY KEY,"
     " room_id text NOT NULL,"
     " digest text NOT NULL,"
     " event_ids text[] NOT NULL,"
     " UNIQUE (room_id, digest));"
     "CREATE TABLE event_state_before ("
     " event_id text PRIMARY KEY,"
     " snapshot_id bigint NOT NULL REFERENCES state_snapshots(snapshot_id));"
     "ALTER TABLE events ADD COLUMN origin text;"
     "CREATE INDEX memberships_room ON memberships (room_id, stream_pos);"
     /* Invites of local users to rooms this server is not in: the stripped state the
      * inviting server sent, for /sync's invite_state (the invite itself is an outlier,
      * its membership a row of memberships). */
     "CREATE TABLE remote_invites ("
     " event_id text PRIMARY KEY,"
     " room_id text NOT NULL,"
     " user_id text NOT NULL,"
     " sender text NOT NULL,"
     " room_version text NOT NULL,"
     " invite_state text NOT NULL,"
     " received_ts bigint NOT NULL);"
     "CREATE INDEX remote_invites_user ON remote_invites (user_id, room_id);"
     "INSERT INTO event_edges SELECT e.event_id, p.id, e.room_id FROM events e,"
     " LATERAL json_array_elements_text(e.pdu::json -> 'prev_events') p(id)"
     " ON CONFLICT DO NOTHING;"
     "INSERT INTO event_auth_edges SELECT e.event_id, a.id FROM events e,"
     " LATERAL json_array_elements_text(e.pdu::json -> 'auth_events') a(id)"
     " ON CONFLICT DO NOTHING;"
     "INSERT INTO room_extremities SELECT room_id, last_event_id FROM rooms"
     " WHERE last_event_id <> '';"},
    {5, "rooms_backfill_positions",
     /* History backfilled from other servers is older than anything in the stream: it
      * takes positions <= 0, each batch below the last (-nextval), so /messages pages
      * into it backwards and /sync, which reads forwards from its tokens, never sees it. */
     "CREATE SEQUENCE rooms_backfill_seq;"
     /* The backward extremities of a room (fed_rooms_backward_extremities) are read by
      * room. */
     "CREATE INDEX event_edges_room ON event_edges (room_id);"
     /* Backward extremities no server gave anything new for: not asked again until
      * until_ts (fed_rooms_recv.c), so one event that never passes costs one request
      * per while, not one per page. */
     "CREATE TABLE backfill_dead_ends ("
     " event_id text PRIMARY KEY,"
     " room_id text NOT NULL,"
     " until_ts bigint NOT NULL);"},
    {6, "rooms_remote_knocks",
     /* Knocks of local users on rooms this server is not in (core/client/rooms/
      * crooms_knock.c): the stripped state the resident server answered, the knock itself
      * last, for /sync's knock_state, and the server that took the knock (the first to
      * ask when the knock is withdrawn). The knock is an outlier, its membership a row of
      * memberships, as for remote_invites. */
     "CREATE TABLE remote_knocks ("
     " event_id text PRIMARY KEY,"
     " room_id text NOT NULL,"
     " user_id text NOT NULL,"
     " via text NOT NULL,"
     " room_version text NOT NULL,"
     " knock_state text NOT NULL,"
     " sent_ts bigint NOT NULL);"
     "CREATE INDEX remote_knocks_user ON remote_knocks (user_id, room_id);"},
    {7, "rooms_event_timestamps",
     /* timestamp_to_event (rooms_jump.c): the nearest event to a time in a room is one
      * index range scan from that time, whichever the direction. */
     "CREATE INDEX events_room_ts ON events (room_id, origin_server_ts, stream_pos);"},
    {8, "rooms_event_topological",
     /* /messages and /context page a room in topological order (crooms_read.c): by depth,
      * then stream position, one index range scan either way. */
     "CREATE INDEX events_room_topo ON events (room_id, depth, stream_pos);"},
    {9, "rooms_event_senders",
     /* A user's newest own event in a room (where the unread events start,
      * core/client/sync/sync_counts.c) is one index probe: without it, a scan back through
      * everything others sent since, on every sync of every member. */
     "CREATE INDEX events_room_sender ON events (room_id, sender, stream_pos);"},
    {10, "rooms_member_counts",
     /* Each room's joined and invited member counts, kept by a trigger on current_state
      * (every writer of a room's state holds its rooms row, rooms_tx_begin, so the count
      * adds no lock): push rules' room_member_count and the sync summaries read one
      * column where each woken member of a 1,000-member room counted 1,000 rows
      * (docs/adr/0040-sync-round-trips-and-kept-member-counts.md). */
     "ALTER TABLE rooms ADD COLUMN joined_members bigint NOT NULL DEFAULT 0,"
     " ADD COLUMN invited_members bigint NOT NULL DEFAULT 0;"
     "CREATE FUNCTION rooms_member_counts() RETURNS trigger LANGUAGE plpgsql AS $f$"
     " DECLARE dj int := 0; di int := 0; rid text;"
     " BEGIN"
     "  IF TG_OP <> 'DELETE' AND NEW.type = 'm.room.member' THEN"
     "   dj := (NEW.membership IS NOT DISTINCT FROM 'join')::int;"
     "   di := (NEW.membership IS NOT DISTINCT FROM 'invite')::int; rid := NEW.room_id;"
     "  END IF;"
     "  IF TG_OP <> 'INSERT' AND OLD.type = 'm.room.member' THEN"
     "   IF rid IS NOT NULL AND rid <> OLD.room_id THEN"
     "    UPDATE rooms SET joined_members = joined_members + dj,"
     "     invited_members = invited_members + di WHERE room_id = rid;"
     "    dj := 0; di := 0;"
     "   END IF;"
     "   dj := dj - (OLD.membership IS NOT DISTINCT FROM 'join')::int;"
     "   di := di - (OLD.membership IS NOT DISTINCT FROM 'invite')::int; rid := OLD.room_id;"
     "  END IF;"
     "  IF dj <> 0 OR di <> 0 THEN"
     "   UPDATE rooms SET joined_members = joined_members + dj,"
     "    invited_members = invited_members + di WHERE room_id = rid;"
     "  END IF;"
     "  RETURN NULL;"
     " END $f$;"
     "CREATE TRIGGER current_state_member_counts AFTER INSERT OR UPDATE OR DELETE"
     " ON current_state FOR EACH ROW EXECUTE FUNCTION rooms_member_counts();"
     "UPDATE rooms r SET joined_members = c.j, invited_members = c.i FROM"
     " (SELECT room_id, count(*) FILTER (WHERE membership = 'join') AS j,"
     "  count(*) FILTER (WHERE membership = 'invite') AS i FROM current_state"
     "  WHERE type = 'm.room.member' GROUP BY room_id) c WHERE c.room_id = r.room_id;"},
};



/* ---- failures ----------------------------------------------------------------------- */

int rooms_set_err(rooms_err *e, int code, const char *fmt, ...)
{
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->why, sizeof(e->why), fmt, ap);
    va_end(ap);
    return code;
}

/* ---- database ----------------------------------------------------------------------- */

PGresult *rooms_q(PGconn *c, const char *sql, int n, const char *const *params,
                  bool *unique_violation)
{
    if (unique_violation) *unique_violation = false;
    PGresult *res = db_query(c, sql, n, params);
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return res;
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    if (unique_violation && state && strcmp(state, "23505") == 0) {
        *unique_violation = true;
        PQclear(res);
        return NULL;
    }
    return rooms_q_taken(res);
}

PGresult *rooms_q_taken(PGresult *res)
{
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return res;
    rt_log(ATRIUM_LOG_ERROR, "core", "rooms query failed: %s",
           res ? PQresultErrorMessage(res) : "the connection broke");
    PQclear(res);
    return NULL;
}

int64_t rooms_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *rooms_server_name(void)
{
    const core_runtime *rt = core_runtime_get();
    return rt && rt->cfg ? rt->cfg->server_name : "localhost";
}

/* ---- membership and visibility ------------------------------------------------------ */

int rooms_membership_at(PGconn *c, const char *room_id, const char *user_id, int64_t upto,
                        char out[16], int64_t *pos_out)
{
    char upto_s[24];
    snprintf(upto_s, sizeof(upto_s), "%lld", (long long)upto);
    const char *p[3] = {user_id, room_id, upto_s};
    PGresult *res = rooms_q(c,
                            "SELECT membership, stream_pos FROM memberships"
                            " WHERE user_id = $1 AND room_id = $2 AND stream_pos <= $3"
                            " ORDER BY stream_pos DESC LIMIT 1",
                            3, p, NULL);
    if (!res) return ROOMS_E_DB;
    out[0] = '\0';
    if (pos_out) *pos_out = 0;
    if (PQntuples(res) == 1) {
        snprintf(out, 16, "%s", PQgetvalue(res, 0, 0));
        if (pos_out) *pos_out = atoll(PQgetvalue(res, 0, 1));
    }
    PQclear(res);
    return ROOMS_OK;
}

int rooms_user_room_ids(PGconn *c, const char *user_id, bool with_invites, int64_t limit,
                        json_t *out)
{
    char limit_s[24];
    snprintf(limit_s, sizeof(limit_s), "%lld", (long long)limit);
    const char *p[3] = {user_id, limit < 0 ? NULL : limit_s, with_invites ? "t" : "f"};
    PGresult *res = rooms_q(c,
                            "SELECT room_id FROM current_state WHERE type = 'm.room.member'"
                            " AND state_key = $1 AND (membership = 'join'"
                            " OR ($3::boolean AND membership = 'invite'))"
                            " ORDER BY room_id LIMIT $2::bigint",
                            3, p, NULL);
    if (!res) return ROOMS_E_DB;
    int n = PQntuples(res);
    for (int i = 0; i < n; i++) json_array_append_new(out, json_string(PQgetvalue(res, i, 0)));
    PQclear(res);
    return n;
}

const room_version *rooms_version_of(PGconn *c, const char *room_id, bool *db_failed)
{
    const char *p[1] = {room_id};
    *db_failed = false;
    PGresult *res = rooms_q(c, "SELECT room_version FROM rooms WHERE room_id = $1", 1, p, NULL);
    if (!res) {
        *db_failed = true;
        return NULL;
    }
    const room_version *v = PQntuples(res) == 1 ? room_version_find(PQgetvalue(res, 0, 0)) : NULL;
    PQclear(res);
    return v;
}

/* ---- identifiers -------------------------------------------------------------------- */

/* "<sigil>localpart:server" within the spec's length limit, the server a server name
 * (core/runtime/server_name.h): an ID names the server it is asked of. */
static bool sigil_id_ok(const char *id, char sigil)
{
    if (!id || id[0] != sigil || strlen(id) > EVENT_MAX_ID_BYTES) return false;
    return rt_server_name_of_id_valid(id);
}

bool rooms_user_id_ok(const char *id)
{
    return sigil_id_ok(id, '@');
}

bool rooms_room_id_ok(const char *id)
{
    return sigil_id_ok(id, '!');
}
