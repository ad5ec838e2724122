/*
 * core/client/accounts/accounts.c - the accounts module: the tables behind users, devices, tokens,
 * profiles, user-interactive auth, push rules, filters, account data, OpenID, refresh and login
 * tokens, and
 * the module's start-up (rate limiters, every account route).
 *
 * The endpoints live one concern per file (see accounts.h); this file only ties them into
 * one client module so their migrations are recorded under one owner, "accounts".
 *
 * Tables other modules read:
 *   account_data (user_id, room_id ('' = global), type, content jsonb, stream_pos bigint):
 *     one row per (user, room, type); every write takes nextval('stream_seq') as its
 *     stream_pos and wakes the user (notifier_wake_user) after commit, so /sync sends the
 *     rows with stream_pos > since. Push rule changes are mirrored there as m.push_rules.
 *   filters (user_id, filter_id bigint, filter jsonb): filter IDs are decimal text of
 *     filter_id, unique per server.
 *   profiles (user_id, displayname, avatar_url): NULL = not set.
 *   erased_users (user_id, erased_ts): users deactivated with erase: true; the rooms
 *     module serves their events redacted to readers who were not joined at them.
 */
#include <sodium.h>

#include "core/client/accounts/accounts.h"
#include "core/client/push/push_rules.h"
#include "core/client/push/push_send.h"
#include "core/client/push/pushers.h"
#include "core/client/ratelimits.h"

static const atrium_migration MIGRATIONS[] = {
    {1, "users_devices_tokens",
     "CREATE TABLE users ("
     " user_id text PRIMARY KEY,"
     " password_hash text,"
     " is_admin boolean NOT NULL DEFAULT false,"
     " deactivated boolean NOT NULL DEFAULT false,"
     " created_ts bigint NOT NULL);"
     "CREATE TABLE devices ("
     " user_id text NOT NULL REFERENCES users(user_id),"
     " device_id text NOT NULL,"
     " display_name text,"
     " last_seen_ts bigint,"
     " last_seen_ip text,"
     " PRIMARY KEY (user_id, device_id));"
     "CREATE TABLE access_tokens ("
     " token_hash text PRIMARY KEY,"
     " user_id text NOT NULL REFERENCES users(user_id),"
     " device_id text NOT NULL,"
     " created_ts bigint NOT NULL);"
     "CREATE INDEX access_tokens_user ON access_tokens (user_id, device_id);"},
    {2, "uia_profiles_settings",
     "CREATE TABLE uia_sessions ("
     " session_id text PRIMARY KEY,"
     " purpose text NOT NULL,"
     " user_id text NOT NULL,"
     " expires_ts bigint NOT NULL);"
     "CREATE INDEX uia_sessions_expiry ON uia_sessions (expires_ts);"
     "CREATE TABLE admin_register_nonces ("
     " nonce text PRIMARY KEY,"
     " expires_ts bigint NOT NULL);"
     "CREATE INDEX admin_register_nonces_expiry ON admin_register_nonces (expires_ts);"
     "CREATE TABLE profiles ("
     " user_id text PRIMARY KEY REFERENCES users(user_id),"
     " displayname text,"
     " avatar_url text);"
     "CREATE SEQUENCE filter_ids;"
     "CREATE TABLE filters ("
     " user_id text NOT NULL REFERENCES users(user_id),"
     " filter_id bigint NOT NULL,"
     " filter jsonb NOT NULL,"
     " PRIMARY KEY (user_id, filter_id));"
     "CREATE TABLE account_data ("
     " user_id text NOT NULL REFERENCES users(user_id),"
     " room_id text NOT NULL,"
     " type text NOT NULL,"
     " content jsonb NOT NULL,"
     " stream_pos bigint NOT NULL,"
     " PRIMARY KEY (user_id, room_id, type));"
     "CREATE INDEX account_data_stream ON account_data (user_id, stream_pos);"
     "CREATE TABLE push_rules ("
     " user_id text NOT NULL REFERENCES users(user_id),"
     " kind text NOT NULL,"
     " rule_id text NOT NULL,"
     " position integer NOT NULL,"
     " conditions jsonb,"
     " pattern text,"
     " actions jsonb NOT NULL,"
     " enabled boolean NOT NULL DEFAULT true,"
     " PRIMARY KEY (user_id, kind, rule_id));"
     "CREATE TABLE push_rule_defaults ("
     " user_id text NOT NULL REFERENCES users(user_id),"
     " rule_id text NOT NULL,"
     " enabled boolean,"
     " actions jsonb,"
     " PRIMARY KEY (user_id, rule_id));"},
    /* Revocations reach every process's token cache (auth_cache.c). */
    {3, "auth_notify",
     "CREATE FUNCTION atrium_auth_notify() RETURNS trigger LANGUAGE plpgsql AS $f$"
     " BEGIN PERFORM pg_notify('atrium_auth', OLD.user_id); RETURN NULL; END $f$;"
     "CREATE TRIGGER access_tokens_revoked AFTER DELETE ON access_tokens"
     " FOR EACH ROW EXECUTE FUNCTION atrium_auth_notify();"
     "CREATE TRIGGER users_rights_changed AFTER UPDATE OF is_admin, deactivated ON users"
     " FOR EACH ROW EXECUTE FUNCTION atrium_auth_notify();"},
    /* pushers.c; a device's pushers go with the device. */
    {4, "pushers",
     "CREATE TABLE pushers ("
     " user_id text NOT NULL,"
     " device_id text NOT NULL,"
     " app_id text NOT NULL,"
     " pushkey text NOT NULL,"
     " kind text NOT NULL,"
     " app_display_name text NOT NULL,"
     " device_display_name text NOT NULL,"
     " profile_tag text,"
     " lang text NOT NULL,"
     " data jsonb NOT NULL,"
     " created_ts bigint NOT NULL,"
     " PRIMARY KEY (user_id, app_id, pushkey),"
     " FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id)"
     "  ON DELETE CASCADE);"
     "CREATE INDEX pushers_app_pushkey ON pushers (app_id, pushkey);"
     "CREATE INDEX pushers_device ON pushers (user_id, device_id);"},
    /* uia.c: a session is bound to the request that began it (method and path), and keeps
     * that request's parameters (secrets left out) for a resubmission with only auth. */
    {5, "uia_operation",
     "ALTER TABLE uia_sessions ADD COLUMN operation text NOT NULL DEFAULT '',"
     " ADD COLUMN params jsonb;"},
    /* Guests (register.c, auth.c): accounts without a password and with a guest's rights. */
    {6, "guests", "ALTER TABLE users ADD COLUMN is_guest boolean NOT NULL DEFAULT false;"},
    /* push_send.c: the stream cursor of the push sender, the events that notified whom
     * (GET /notifications) and the deliveries due to http pushers. */
    {7, "push_notifications",
     "CREATE TABLE push_cursor (id int PRIMARY KEY CHECK (id = 1), stream_pos bigint NOT NULL);"
     /* from the stream's end when this is applied: history is never pushed */
     "INSERT INTO push_cursor SELECT 1, CASE WHEN is_called THEN last_value ELSE 0 END"
     " FROM stream_seq;"
     "CREATE TABLE push_notifications ("
     " id bigserial PRIMARY KEY,"
     " user_id text NOT NULL,"
     " room_id text NOT NULL,"
     " event_id text NOT NULL,"
     " stream_pos bigint NOT NULL,"
     " highlight boolean NOT NULL,"
     " actions jsonb NOT NULL,"
     " ts bigint NOT NULL,"
     " UNIQUE (user_id, event_id));"
     "CREATE INDEX push_notifications_user ON push_notifications (user_id, stream_pos);"
     "CREATE TABLE push_queue ("
     " id bigserial PRIMARY KEY,"
     " notification_id bigint NOT NULL REFERENCES push_notifications (id) ON DELETE CASCADE,"
     " user_id text NOT NULL,"
     " app_id text NOT NULL,"
     " pushkey text NOT NULL,"
     " attempts int NOT NULL DEFAULT 0,"
     " next_try_ts bigint NOT NULL DEFAULT 0,"
     " FOREIGN KEY (user_id, app_id, pushkey) REFERENCES pushers (user_id, app_id, pushkey)"
     "  ON DELETE CASCADE ON UPDATE CASCADE);"
     "CREATE INDEX push_queue_pusher ON push_queue (user_id, app_id, pushkey, id);"},
    /* deactivate.c: the users who asked for erasure; every reader of events joins it
     * (EVENTS_SELECT in core/rooms/rooms.h) to serve their events redacted to new readers. */
    {8, "erased_users",
     "CREATE TABLE erased_users (user_id text PRIMARY KEY, erased_ts bigint NOT NULL);"},
    /* push_send.c: how many push_notifications rows each user has, kept with the rows, so
     * the sender prunes a user past push.notifications_per_user_max without counting. */
    {9, "push_notification_counts",
     "CREATE TABLE push_notification_counts ("
     " user_id text PRIMARY KEY,"
     " n bigint NOT NULL);"
     "INSERT INTO push_notification_counts"
     " SELECT user_id, count(*) FROM push_notifications GROUP BY user_id;"},
    /* whois.c lists it with each device's last connection (auth_seen.c keeps it). */
    {10, "device_user_agents", "ALTER TABLE devices ADD COLUMN last_seen_user_agent text;"},
    /* openid.c: OpenID tokens for widgets and calls, as SHA-256 hex; at most a few per user
     * (OPENID_TOKENS_PER_USER_MAX), the newest kept. */
    {11, "openid_tokens",
     "CREATE TABLE openid_tokens ("
     " token_hash text PRIMARY KEY,"
     " id bigserial NOT NULL," /* minting order, for keeping the newest */
     " user_id text NOT NULL REFERENCES users(user_id),"
     " created_ts bigint NOT NULL,"
     " expires_ts bigint NOT NULL);"
     "CREATE INDEX openid_tokens_user ON openid_tokens (user_id, id);"},
    /* refresh.c: an access token minted with a refresh token expires (NULL: never) and, until
     * its first use, names the refresh token it replaces (retires); a refresh token is paired
     * with the access token minted beside it and goes with its device. */
    {12, "refresh_tokens",
     "ALTER TABLE access_tokens ADD COLUMN expires_ts bigint, ADD COLUMN retires text;"
     "CREATE TABLE refresh_tokens ("
     " token_hash text PRIMARY KEY,"
     " user_id text NOT NULL,"
     " device_id text NOT NULL,"
     " access_hash text NOT NULL,"
     " retires text,"
     " created_ts bigint NOT NULL,"
     " FOREIGN KEY (user_id, device_id) REFERENCES devices (user_id, device_id)"
     "  ON DELETE CASCADE);"
     "CREATE INDEX refresh_tokens_retires ON refresh_tokens (retires);"
     "CREATE INDEX access_tokens_retires ON access_tokens (retires) WHERE retires IS NOT NULL;"},
    /* login_token.c: single-use m.login.token tokens from POST /login/get_token, as SHA-256
     * hex; expired ones are deleted whenever one is minted, at most a few live per user. */
    {13, "login_tokens",
     "CREATE TABLE login_tokens ("
     " token_hash text PRIMARY KEY,"
     " id bigserial NOT NULL,"
     " user_id text NOT NULL REFERENCES users(user_id),"
     " expires_ts bigint NOT NULL);"
     "CREATE INDEX login_tokens_user ON login_tokens (user_id, id);"},
    /* registration_tokens.c: tokens that open registration (Synapse's admin API shape);
     * uia.c: the stages a session completed, the registration token it reserved, the user
     * it registered (a retry of a finished registration logs in again) and the hash of the
     * password its first request gave. */
    {14, "registration_tokens",
     "CREATE TABLE registration_tokens ("
     " token text PRIMARY KEY,"
     " uses_allowed integer,"
     " pending integer NOT NULL DEFAULT 0,"
     " completed integer NOT NULL DEFAULT 0,"
     " expiry_time bigint);"
     "ALTER TABLE uia_sessions ADD COLUMN completed text[] NOT NULL DEFAULT '{}',"
     " ADD COLUMN registration_token text, ADD COLUMN registered_user text,"
     " ADD COLUMN password_hash text;"},
    /* pushers.c: MSC3881, a pusher its device switched off (kept, listed, not pushed to). */
    {15, "pushers_enabled", "ALTER TABLE pushers ADD COLUMN enabled boolean NOT NULL DEFAULT true;"},
    /* The newest erasure in one index probe: part of a kept sliding-sync result's stamp
     * (core/client/sync/ssync_hits.c). */
    {16, "erased_users_ts", "CREATE INDEX erased_users_ts ON erased_users (erased_ts);"},
};

static int accounts_init(core_runtime *rt)
{
    http_server *s = rt->http;
    if (sodium_init() < 0) { /* random numbers and Argon2id need it, once, before threads */
        rt_log(ATRIUM_LOG_ERROR, "core", "libsodium failed to initialize");
        return -1;
    }
    if (ratelimits_init(rt) < 0 || !(rt->auth_cache = auth_cache_new(rt->metrics)) ||
        auth_cache_listen(rt->auth_cache, rt->notify) < 0 ||
        auth_revoke_listen(rt->notify, rt->metrics) < 0 || auth_seen_init(rt->metrics) < 0)
        return -1;
    if (acc_register_routes(s) < 0 || acc_admin_register_routes(s) < 0 ||
        acc_login_routes(s) < 0 || acc_devices_routes(s) < 0 || acc_profile_routes(s) < 0 ||
        acc_profile_remote_routes(s) < 0 ||
        push_rules_routes(s) < 0 || acc_filters_routes(s) < 0 ||
        acc_tags_routes(s) < 0 || pushers_routes(s) < 0 || acc_misc_routes(s) < 0 || acc_whois_routes(s) < 0 ||
        acc_account_data_routes(s) < 0 || acc_user_directory_routes(s) < 0 ||
        acc_deactivate_routes(s) < 0 || acc_openid_routes(s) < 0 ||
        acc_refresh_routes(s) < 0 || acc_login_token_routes(s) < 0 ||
        acc_registration_tokens_routes(s) < 0)
        return -1;
    return 0;
}

static void prepare_dummy_hash(void *arg, bool cancelled)
{
    (void)arg;
    if (!cancelled) auth_prepare_dummy_hash();
}

/* After migrations: the auth pool makes the unknown-user hash before the first login. */
static int accounts_start(core_runtime *rt)
{
    rt_pool *pool = rt->auth_pool;
    if (pool && rt_pool_submit(pool, prepare_dummy_hash, NULL) < 0)
        rt_log(ATRIUM_LOG_WARN, "core", "could not queue the dummy password hash; the first "
               "failed login will make it");
    return 0;
}

static void accounts_stop(core_runtime *rt)
{
    auth_cache_stop(rt->auth_cache); /* freed by core/main.c at the very end */
}

const client_module ACCOUNTS_MODULE = {
    .owner = "accounts",
    .migrations = MIGRATIONS,
    .n_migrations = sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]),
    .init = accounts_init,
    .start = accounts_start,
    .stop = accounts_stop,
};
