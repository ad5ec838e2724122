/*
 * core/client/e2ee/e2ee.c - the E2EE module: its tables (migration owner "e2ee"), its routes
 * (registered by the part files, see e2ee.h), and the helpers those parts share.
 *
 * Owns two rules: a key change takes a stream position in device_lists_changes
 * (e2ee_record_key_change), and who hears of it (E2EE_SHARED_USERS_SQL). Keys are stored
 * as the JSON text the client uploaded (re-serialized compactly); the server reads only the
 * fields it must route by (user_id, device_id, key IDs, usage) and never the key material.
 *
 * Deleting a device (logout, device delete; done by accounts) cascades to its keys,
 * one-time keys, fallback keys and pending to-device messages through foreign keys.
 * Triggers record the device-list change when a device row is added (a login), removed,
 * or renamed, and when a device's keys go, so that other users re-query, whichever code
 * touched the row. The process that changed it should call e2ee_wake_key_change (parked
 * syncs wake at their timeout otherwise).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/client.h"
#include "core/client/e2ee/e2ee.h"
#include "core/client/sync/notifier.h"
#include "core/federation/transport/fed_txn.h"
#include "core/rooms/rooms.h"

static const atrium_migration MIGRATIONS[] = {
    {1, "e2ee_keys_to_device_backup",
     /* device keys, one-time keys and fallback keys, per device */
     "CREATE TABLE e2ee_device_keys ("
     " user_id text NOT NULL, device_id text NOT NULL,"
     " key_json text NOT NULL,"
     " PRIMARY KEY (user_id, device_id),"
     " FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id)"
     "  ON DELETE CASCADE);"
     "CREATE TABLE e2ee_one_time_keys ("
     " user_id text NOT NULL, device_id text NOT NULL,"
     " algorithm text NOT NULL, key_id text NOT NULL,"
     " key_json text NOT NULL,"
     " PRIMARY KEY (user_id, device_id, algorithm, key_id),"
     " FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id)"
     "  ON DELETE CASCADE);"
     "CREATE TABLE e2ee_fallback_keys ("
     " user_id text NOT NULL, device_id text NOT NULL,"
     " algorithm text NOT NULL, key_id text NOT NULL,"
     " key_json text NOT NULL,"
     " used boolean NOT NULL DEFAULT false,"
     " PRIMARY KEY (user_id, device_id, algorithm),"
     " FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id)"
     "  ON DELETE CASCADE);"
     /* cross-signing keys (master, self_signing, user_signing) and uploaded signatures */
     "CREATE TABLE e2ee_cross_signing_keys ("
     " user_id text NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,"
     " key_type text NOT NULL,"
     " public_key text NOT NULL,"
     " key_json text NOT NULL,"
     " PRIMARY KEY (user_id, key_type));"
     "CREATE TABLE e2ee_signatures ("
     " target_user_id text NOT NULL, target_key_id text NOT NULL,"
     " signer_user_id text NOT NULL, signer_key_id text NOT NULL,"
     " signature text NOT NULL,"
     " PRIMARY KEY (target_user_id, target_key_id, signer_user_id, signer_key_id));"
     /* one row per key change: the device_lists stream */
     "CREATE TABLE device_lists_changes ("
     " stream_pos bigint PRIMARY KEY,"
     " user_id text NOT NULL);"
     "CREATE INDEX device_lists_changes_user ON device_lists_changes (user_id, stream_pos);"
     "CREATE FUNCTION e2ee_device_keys_deleted() RETURNS trigger LANGUAGE plpgsql AS $$"
     " BEGIN"
     "  INSERT INTO device_lists_changes (stream_pos, user_id)"
     "   VALUES (stream_next(), OLD.user_id);"
     "  RETURN NULL;"
     " END $$;"
     "CREATE TRIGGER e2ee_device_keys_deleted AFTER DELETE ON e2ee_device_keys"
     " FOR EACH ROW EXECUTE FUNCTION e2ee_device_keys_deleted();"
     /* to-device messages: delivered until acknowledged (see to_device.c) */
     "CREATE TABLE to_device_messages ("
     " user_id text NOT NULL, device_id text NOT NULL,"
     " stream_pos bigint NOT NULL,"
     " sender text NOT NULL, event_type text NOT NULL, content text NOT NULL,"
     " delivered_upto bigint,"
     " PRIMARY KEY (user_id, device_id, stream_pos),"
     " FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id)"
     "  ON DELETE CASCADE);"
     "CREATE TABLE to_device_txns ("
     " user_id text NOT NULL, device_id text NOT NULL,"
     " event_type text NOT NULL, txn_id text NOT NULL,"
     " created_ts bigint NOT NULL,"
     " PRIMARY KEY (user_id, device_id, event_type, txn_id),"
     " FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id)"
     "  ON DELETE CASCADE);"
     /* server-side room key backup */
     "CREATE TABLE e2ee_backup_versions ("
     " user_id text NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,"
     " version bigint NOT NULL,"
     " algorithm text NOT NULL,"
     " auth_data text NOT NULL,"
     " etag bigint NOT NULL DEFAULT 0,"
     " deleted boolean NOT NULL DEFAULT false,"
     " PRIMARY KEY (user_id, version));"
     "CREATE TABLE e2ee_backup_keys ("
     " user_id text NOT NULL, version bigint NOT NULL,"
     " room_id text NOT NULL, session_id text NOT NULL,"
     " first_message_index bigint NOT NULL,"
     " forwarded_count bigint NOT NULL,"
     " is_verified boolean NOT NULL,"
     " key_json text NOT NULL,"
     " PRIMARY KEY (user_id, version, room_id, session_id),"
     " FOREIGN KEY (user_id, version) REFERENCES e2ee_backup_versions (user_id, version)"
     "  ON DELETE CASCADE);"},
    {2, "e2ee_federation",
     /* Device lists across servers (e2ee_federation.c). A local user's device-list stream
      * ID counts that user's announced changes; each change of a device's keys (upload,
      * delete, also by cascade) or of the display name of a device with keys is queued as
      * an m.device_list_update EDU for every other server sharing a joined room with the
      * user, in the transaction that made it (federation_outbound, created by the
      * "federation" migrations before any request runs). Local users are those with a row
      * in users; a server's other members never are. */
     "CREATE TABLE e2ee_device_list_streams ("
     " user_id text PRIMARY KEY,"
     " stream_id bigint NOT NULL);"
     /* Remote users' device lists as their servers announced them: the last stream ID
      * applied (a prev_id that is not it means a gap: resync), the devices
      * {device_id: {keys, device_display_name}} and the cross-signing keys. */
     "CREATE TABLE e2ee_remote_device_lists ("
     " user_id text PRIMARY KEY,"
     " stream_id bigint NOT NULL,"
     " devices text NOT NULL DEFAULT '{}',"
     " master_key text,"
     " self_signing_key text,"
     " updated_ts bigint NOT NULL);"
     "CREATE FUNCTION e2ee_announce_device(uid text, did text, gone boolean) RETURNS void"
     " LANGUAGE plpgsql AS $f$"
     " DECLARE sid bigint; body text;"
     " BEGIN"
     "  INSERT INTO e2ee_device_list_streams AS s (user_id, stream_id) VALUES (uid, 1)"
     "   ON CONFLICT (user_id) DO UPDATE SET stream_id = s.stream_id + 1"
     "   RETURNING stream_id INTO sid;"
     "  body := jsonb_strip_nulls(jsonb_build_object('user_id', uid, 'device_id', did,"
     "   'stream_id', sid,"
     "   'prev_id', CASE WHEN sid > 1 THEN jsonb_build_array(sid - 1) ELSE '[]'::jsonb END,"
     "   'deleted', CASE WHEN gone THEN true END,"
     "   'keys', (SELECT k.key_json::jsonb FROM e2ee_device_keys k"
     "    WHERE k.user_id = uid AND k.device_id = did AND NOT gone),"
     "   'device_display_name', (SELECT d.display_name FROM devices d"
     "    WHERE d.user_id = uid AND d.device_id = did AND NOT gone)))::text;"
     "  INSERT INTO federation_outbound (destination, kind, edu_type, content, queued_ts)"
     "   SELECT DISTINCT substr(o.state_key, strpos(o.state_key, ':') + 1), 1,"
     "    'm.device_list_update', body, (extract(epoch from now()) * 1000)::bigint"
     "   FROM current_state m JOIN current_state o ON o.room_id = m.room_id"
     "    AND o.type = 'm.room.member' AND o.membership = 'join'"
     "   WHERE m.type = 'm.room.member' AND m.state_key = uid AND m.membership = 'join'"
     "    AND strpos(o.state_key, ':') > 0"
     "    AND NOT EXISTS (SELECT 1 FROM users u WHERE u.user_id = o.state_key);"
     " END $f$;"
     "CREATE FUNCTION e2ee_device_keys_announce() RETURNS trigger LANGUAGE plpgsql AS $f$"
     " BEGIN"
     "  IF TG_OP = 'DELETE' THEN PERFORM e2ee_announce_device(OLD.user_id, OLD.device_id, true);"
     "  ELSE PERFORM e2ee_announce_device(NEW.user_id, NEW.device_id, false); END IF;"
     "  RETURN NULL;"
     " END $f$;"
     "CREATE TRIGGER e2ee_device_keys_announce AFTER INSERT OR UPDATE OR DELETE"
     " ON e2ee_device_keys FOR EACH ROW EXECUTE FUNCTION e2ee_device_keys_announce();"
     "CREATE FUNCTION e2ee_device_renamed() RETURNS trigger LANGUAGE plpgsql AS $f$"
     " BEGIN"
     "  IF NEW.display_name IS DISTINCT FROM OLD.display_name AND EXISTS (SELECT 1"
     "   FROM e2ee_device_keys k WHERE k.user_id = NEW.user_id AND k.device_id = NEW.device_id)"
     "  THEN PERFORM e2ee_announce_device(NEW.user_id, NEW.device_id, false); END IF;"
     "  RETURN NULL;"
     " END $f$;"
     "CREATE TRIGGER e2ee_device_renamed AFTER UPDATE OF display_name ON devices"
     " FOR EACH ROW EXECUTE FUNCTION e2ee_device_renamed();"
     /* m.signing_key_update: a local user's master or self-signing key changed. */
     "CREATE FUNCTION e2ee_signing_keys_announce() RETURNS trigger LANGUAGE plpgsql AS $f$"
     " DECLARE body text;"
     " BEGIN"
     "  IF NEW.key_type NOT IN ('master', 'self_signing') THEN RETURN NULL; END IF;"
     "  body := jsonb_strip_nulls(jsonb_build_object('user_id', NEW.user_id,"
     "   'master_key', (SELECT key_json::jsonb FROM e2ee_cross_signing_keys"
     "    WHERE user_id = NEW.user_id AND key_type = 'master'),"
     "   'self_signing_key', (SELECT key_json::jsonb FROM e2ee_cross_signing_keys"
     "    WHERE user_id = NEW.user_id AND key_type = 'self_signing')))::text;"
     "  INSERT INTO federation_outbound (destination, kind, edu_type, content, queued_ts)"
     "   SELECT DISTINCT substr(o.state_key, strpos(o.state_key, ':') + 1), 1,"
     "    'm.signing_key_update', body, (extract(epoch from now()) * 1000)::bigint"
     "   FROM current_state m JOIN current_state o ON o.room_id = m.room_id"
     "    AND o.type = 'm.room.member' AND o.membership = 'join'"
     "   WHERE m.type = 'm.room.member' AND m.state_key = NEW.user_id"
     "    AND m.membership = 'join' AND strpos(o.state_key, ':') > 0"
     "    AND NOT EXISTS (SELECT 1 FROM users u WHERE u.user_id = o.state_key);"
     "  RETURN NULL;"
     " END $f$;"
     "CREATE TRIGGER e2ee_signing_keys_announce AFTER INSERT OR UPDATE"
     " ON e2ee_cross_signing_keys FOR EACH ROW EXECUTE FUNCTION e2ee_signing_keys_announce();"},
    /* A device that appears, goes or is renamed is a device-list change too: others must
     * re-query (a login's new device has no keys yet, and nobody would hear of it). */
    {3, "device_row_changes",
     "CREATE FUNCTION e2ee_device_row_changed() RETURNS trigger LANGUAGE plpgsql AS $$"
     " BEGIN"
     "  INSERT INTO device_lists_changes (stream_pos, user_id)"
     "   VALUES (stream_next(), CASE WHEN TG_OP = 'DELETE' THEN OLD.user_id"
     "    ELSE NEW.user_id END);"
     "  RETURN NULL;"
     " END $$;"
     "CREATE TRIGGER e2ee_device_added_or_removed AFTER INSERT OR DELETE ON devices"
     " FOR EACH ROW EXECUTE FUNCTION e2ee_device_row_changed();"
     "CREATE TRIGGER e2ee_device_renamed_changes AFTER UPDATE OF display_name ON devices"
     " FOR EACH ROW WHEN (OLD.display_name IS DISTINCT FROM NEW.display_name)"
     " EXECUTE FUNCTION e2ee_device_row_changed();"},
    /* When this server last asked a remote user's server for the whole device list: at
     * most one resync per user per E2EE_FED_RESYNC_INTERVAL_MS, however many gaps its
     * updates show (e2ee_federation.c, docs/adr/0023-device-list-resync-rate.md). */
    {4, "remote_device_list_resync_ts",
     "ALTER TABLE e2ee_remote_device_lists ADD COLUMN resync_ts bigint;"},
};

/* ---- requests ----------------------------------------------------------------------------- */

const char *e2ee_user_domain(const char *user_id)
{
    const char *colon = strchr(user_id, ':');
    return colon ? colon + 1 : "";
}

const char *e2ee_first_bad_user(const json_t *map)
{
    const char *user;
    json_t *v;
    json_object_foreach((json_t *)map, user, v) {
        if (!rooms_user_id_ok(user)) return user;
    }
    return NULL;
}

bool e2ee_user_is_local(const atrium_req *r, const char *user_id)
{
    return user_id[0] == '@' && strcmp(e2ee_user_domain(user_id), r->srv->cfg->server_name) == 0;
}

bool e2ee_id_ok(const char *s)
{
    size_t n = 0;
    for (; s[n]; n++)
        if ((unsigned char)s[n] < 0x20 || s[n] == 0x7f) return false;
    return n > 0 && n <= E2EE_MAX_ID_BYTES;
}

const char *e2ee_check_device_map(const json_t *map, const char *what, size_t max_pairs,
                                  bool (*value_ok)(const json_t *value),
                                  const char *value_rule)
{
    static _Thread_local char msg[192];
    if (!json_is_object(map)) {
        snprintf(msg, sizeof(msg), "%s must be an object", what);
        return msg;
    }
    size_t pairs = 0;
    const char *user, *device;
    json_t *devices, *value;
    json_object_foreach((json_t *)map, user, devices) {
        if (!json_is_object(devices)) {
            snprintf(msg, sizeof(msg), "%s must map user IDs to objects of device ID -> %s",
                     what, value_rule);
            return msg;
        }
        json_object_foreach(devices, device, value) {
            if (!e2ee_id_ok(device)) {
                snprintf(msg, sizeof(msg), "%s: a device ID is empty or too long", what);
                return msg;
            }
            if (!value_ok(value)) {
                snprintf(msg, sizeof(msg), "%s: each device maps to %s", what, value_rule);
                return msg;
            }
            if (++pairs > max_pairs) {
                snprintf(msg, sizeof(msg), "%s: more than %zu devices in one request", what,
                         max_pairs);
                return msg;
            }
        }
    }
    return NULL;
}

/* ---- database ----------------------------------------------------------------------------- */

PGconn *e2ee_db_begin(atrium_req *r)
{
    PGconn *c = http_db_checkout(r);
    if (c && !db_begin(c)) {
        e2ee_db_failed(r, c, false);
        http_db_checkin(c);
        return NULL;
    }
    return c;
}

PGresult *e2ee_sql(PGconn *c, ExecStatusType want, const char *sql, int n,
                   const char *const *params)
{
    PGresult *res = db_query(c, sql, n, params);
    if (PQresultStatus(res) == want) return res;
    rt_log(ATRIUM_LOG_ERROR, "e2ee", "query failed: %s (%.80s...)", PQresultErrorMessage(res),
           sql);
    PQclear(res);
    return NULL;
}

int e2ee_db_failed(atrium_req *r, PGconn *c, bool in_txn)
{
    if (in_txn) db_rollback(c);
    return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
}

/* ---- key changes ------------------------------------------------------------------------- */

const char E2EE_SHARED_USERS_SQL[] =
    "SELECT $1::text AS user_id"
    " UNION"
    " SELECT o.state_key FROM current_state m"
    " JOIN current_state o ON o.room_id = m.room_id"
    "  AND o.type = 'm.room.member' AND o.membership = 'join'"
    " WHERE m.type = 'm.room.member' AND m.state_key = $1 AND m.membership = 'join'";

int e2ee_record_key_change(PGconn *c, const char *user_id)
{
    const char *p[1] = {user_id};
    return db_exec(c, "INSERT INTO device_lists_changes (stream_pos, user_id)"
                      " VALUES (stream_next(), $1)",
                   1, p)
               ? 0
               : ATRIUM_E_DB;
}

void e2ee_wake_key_change(PGconn *c, const char *user_id)
{
    const char *p[1] = {user_id};
    PGresult *res = e2ee_sql(c, PGRES_TUPLES_OK, E2EE_SHARED_USERS_SQL, 1, p);
    if (!res) {
        notifier_wake_user(user_id);
        return;
    }
    for (int i = 0; i < PQntuples(res); i++) notifier_wake_user(PQgetvalue(res, i, 0));
    PQclear(res);
    fed_outbound_kick(); /* the change may have queued device-list EDUs (e2ee_federation.c) */
}

/* ---- pure helpers ------------------------------------------------------------------------ */

int e2ee_key_algorithm_len(const char *key_id)
{
    const char *colon = strchr(key_id, ':');
    if (!colon || colon == key_id || !colon[1]) return -1;
    return (int)(colon - key_id);
}

/* Is v an object whose values are all strings? */
static bool is_string_map(const json_t *v)
{
    if (!json_is_object(v)) return false;
    const char *k;
    json_t *item;
    json_object_foreach((json_t *)v, k, item) if (!json_is_string(item)) return false;
    return true;
}

/* Is v a signatures object: {user_id: {key_id: signature}}? */
static bool is_signatures(const json_t *v)
{
    if (!json_is_object(v)) return false;
    const char *k;
    json_t *item;
    json_object_foreach((json_t *)v, k, item) if (!is_string_map(item)) return false;
    return true;
}

const char *e2ee_check_device_keys(const json_t *keys, const char *user_id,
                                   const char *device_id, const char **errcode)
{
    *errcode = "M_BAD_JSON";
    if (!json_is_object(keys)) return "device_keys must be an object";
    const json_t *uid = json_object_get(keys, "user_id");
    const json_t *did = json_object_get(keys, "device_id");
    if (!json_is_string(uid) || !json_is_string(did))
        return "device_keys.user_id and device_keys.device_id must be strings";
    const json_t *algs = json_object_get(keys, "algorithms");
    if (!json_is_array(algs)) return "device_keys.algorithms must be an array of strings";
    size_t i;
    json_t *alg;
    json_array_foreach(algs, i, alg) if (!json_is_string(alg))
        return "device_keys.algorithms must be an array of strings";
    const json_t *k = json_object_get(keys, "keys");
    if (!is_string_map(k) || json_object_size(k) == 0)
        return "device_keys.keys must be a non-empty object of strings";
    const char *key_id;
    json_t *v;
    json_object_foreach((json_t *)k, key_id, v) if (e2ee_key_algorithm_len(key_id) < 0)
        return "device_keys.keys must be named <algorithm>:<device_id>";
    if (!is_signatures(json_object_get(keys, "signatures")))
        return "device_keys.signatures must be an object of objects of strings";
    *errcode = "M_INVALID_PARAM";
    if (strcmp(json_string_value(uid), user_id) != 0)
        return "device_keys.user_id is not the authenticated user";
    if (strcmp(json_string_value(did), device_id) != 0)
        return "device_keys.device_id is not the access token's device";
    return NULL;
}

const char *e2ee_check_cross_signing_key(const json_t *key, const char *user_id,
                                         const char *usage, const char **public_key)
{
    if (!json_is_object(key)) return "a cross-signing key must be an object";
    const json_t *uid = json_object_get(key, "user_id");
    if (!json_is_string(uid)) return "a cross-signing key needs a user_id";
    if (strcmp(json_string_value(uid), user_id) != 0)
        return "a cross-signing key's user_id must be the authenticated user";
    const json_t *use = json_object_get(key, "usage");
    if (!json_is_array(use)) return "a cross-signing key's usage must be an array";
    bool has_usage = false;
    size_t i;
    json_t *u;
    json_array_foreach(use, i, u) {
        if (!json_is_string(u)) return "a cross-signing key's usage must hold strings";
        if (strcmp(json_string_value(u), usage) == 0) has_usage = true;
    }
    if (!has_usage) return "a cross-signing key's usage does not name its role";
    const json_t *k = json_object_get(key, "keys");
    if (!is_string_map(k) || json_object_size(k) != 1)
        return "a cross-signing key must have exactly one key in keys";
    const char *key_id = json_object_iter_key(json_object_iter((json_t *)k));
    int alen = e2ee_key_algorithm_len(key_id);
    if (alen != 7 || strncmp(key_id, "ed25519", 7) != 0)
        return "a cross-signing key must be an ed25519 key";
    const json_t *sigs = json_object_get(key, "signatures");
    if (sigs && !is_signatures(sigs))
        return "signatures must be an object of objects of strings";
    *public_key = key_id + alen + 1;
    return NULL;
}

/* ---- the module -------------------------------------------------------------------------- */

static int e2ee_init(core_runtime *rt)
{
    http_server *s = rt->http;
    if (e2ee_keys_init(s) < 0 || e2ee_query_init(s) < 0 || e2ee_cross_signing_init(s) < 0 ||
        e2ee_backup_init(s) < 0 || to_device_init(s) < 0 || e2ee_federation_init(s) < 0)
        return -1;
    return 0;
}

static int e2ee_start(core_runtime *rt)
{
    (void)rt;
    return e2ee_federation_start();
}

static void e2ee_stop(core_runtime *rt)
{
    (void)rt;
    e2ee_federation_stop();
}

const client_module E2EE_MODULE = {
    .owner = "e2ee",
    .migrations = MIGRATIONS,
    .n_migrations = sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]),
    .init = e2ee_init,
    .start = e2ee_start,
    .stop = e2ee_stop,
};
