/*
 * core/client/accounts.c - accounts: the tables behind users, devices and access tokens,
 * and who-am-I. Registration, login and logout build on auth.h.
 */
#include "core/client/auth.h"
#include "core/client/client.h"

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
};

/* GET /_matrix/client/v3/account/whoami */
static int get_whoami(atrium_req *r)
{
    const char *user = auth_request(r);
    if (!user) return ATRIUM_DONE;
    json_t *body = json_pack("{s:s, s:s, s:b}", "user_id", user, "device_id", r->device,
                             "is_guest", 0);
    return http_respond_json(r, 200, body);
}

static int accounts_init(http_server *s, rt_metrics *metrics)
{
    (void)metrics;
    return client_route(s, "GET", "/_matrix/client/v3/account/whoami", get_whoami, 0);
}

const client_module ACCOUNTS_MODULE = {
    .owner = "accounts",
    .migrations = MIGRATIONS,
    .n_migrations = sizeof(MIGRATIONS) / sizeof(MIGRATIONS[0]),
    .init = accounts_init,
};
