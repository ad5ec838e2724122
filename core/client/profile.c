/*
 * core/client/profile.c - profiles (display name and avatar) and what the server lets
 * accounts do (GET /capabilities).
 *
 * GET /profile/{userId}[/{field}] answers for local users from the profiles table: 404
 * M_NOT_FOUND for a user that does not exist, or for a field that is not set. Remote users'
 * profiles need a federation query, which is not here yet: they get 404 too. Only a user
 * may set their own profile (403 otherwise). A new account's display name is its
 * localpart (acc_create_account). What this file does not do: send updated m.room.member
 * events into the user's rooms when the profile changes (the rooms code owns membership
 * events).
 */
#include <string.h>

#include "core/client/accounts.h"
#include "core/client/events.h"

typedef struct profile_field {
    const char *name;   /* in the path and the JSON */
    const char *column; /* in profiles */
    size_t max_bytes;
} profile_field;

static const profile_field FIELDS[] = {
    {"displayname", "displayname", ACC_DISPLAYNAME_MAX_BYTES},
    {"avatar_url", "avatar_url", ACC_AVATAR_URL_MAX_BYTES},
};
#define N_FIELDS (sizeof(FIELDS) / sizeof(FIELDS[0]))

/* The profile row of user_id as {displayname?, avatar_url?}; NULL after answering (404 for
 * an unknown user, 503). */
static json_t *load_profile(atrium_req *r, const char *user_id)
{
    PGconn *c = acc_db(r);
    if (!c) return NULL;
    const char *p[1] = {user_id};
    PGresult *res = acc_q(c, "SELECT p.displayname, p.avatar_url FROM users u"
                             " LEFT JOIN profiles p ON p.user_id = u.user_id"
                             " WHERE u.user_id = $1", 1, p);
    acc_db_release(c);
    if (!res) {
        acc_db_failed(r);
        return NULL;
    }
    if (PQntuples(res) != 1) {
        PQclear(res);
        http_respond_error(r, 404, "M_NOT_FOUND", "No such user");
        return NULL;
    }
    json_t *profile = json_object();
    for (size_t i = 0; profile && i < N_FIELDS; i++)
        if (!PQgetisnull(res, 0, (int)i))
            json_object_set_new(profile, FIELDS[i].name, json_string(PQgetvalue(res, 0, (int)i)));
    PQclear(res);
    if (!profile) http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    return profile;
}

static const profile_field *field_named(const char *name)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if (strcmp(FIELDS[i].name, name) == 0) return &FIELDS[i];
    return NULL;
}

/* GET /_matrix/client/v3/profile/{userId} */
static int get_profile(atrium_req *r)
{
    json_t *profile = load_profile(r, r->param_values[0]);
    if (!profile) return ATRIUM_DONE;
    return http_respond_json(r, 200, profile);
}

/* GET /_matrix/client/v3/profile/{userId}/{field} */
static int get_field(atrium_req *r)
{
    const profile_field *f = field_named(r->param_values[1]);
    if (!f) return http_respond_error(r, 404, "M_NOT_FOUND", "No such profile field");
    json_t *profile = load_profile(r, r->param_values[0]);
    if (!profile) return ATRIUM_DONE;
    json_t *value = json_object_get(profile, f->name);
    if (!value) {
        json_decref(profile);
        return http_respond_error(r, 404, "M_NOT_FOUND", "%s is not set", f->name);
    }
    json_t *body = json_pack("{s:O}", f->name, value);
    json_decref(profile);
    return http_respond_json(r, 200, body);
}

/* PUT /_matrix/client/v3/profile/{userId}/{field} {"<field>": value} */
static int put_field(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    const profile_field *f = field_named(r->param_values[1]);
    if (!f) return http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown profile field");
    if (strcmp(r->param_values[0], r->user) != 0)
        return http_respond_error(r, 403, "M_FORBIDDEN", "You can only change your own profile");
    json_t *body = acc_body(r);
    const char *value;
    if (!body || !acc_string(r, body, f->name, true, f->max_bytes, &value)) return ATRIUM_DONE;
    if (strcmp(f->name, "avatar_url") == 0 && value[0] && strncmp(value, "mxc://", 6) != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "avatar_url must be an mxc:// URI");
    PGconn *c = acc_db(r);
    if (!c) return ATRIUM_DONE;
    const char *p[2] = {r->user, value};
    char *sql = rt_arena_printf(r->arena,
                                "INSERT INTO profiles (user_id, %s) VALUES ($1, $2)"
                                " ON CONFLICT (user_id) DO UPDATE SET %s = $2",
                                f->column, f->column);
    bool ok = sql && acc_exec(c, sql, 2, p);
    acc_db_release(c);
    if (!ok) return acc_db_failed(r);
    return http_respond_json(r, 200, json_object());
}

/* GET /_matrix/client/v3/capabilities */
static int get_capabilities(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *available = json_object();
    for (size_t i = 0; available && ROOM_VERSIONS_SUPPORTED[i]; i++)
        json_object_set_new(available, ROOM_VERSIONS_SUPPORTED[i], json_string("stable"));
    json_t *body = json_pack("{s:{s:{s:b}, s:{s:s, s:o}, s:{s:b}, s:{s:b}, s:{s:b}}}",
                             "capabilities",
                             "m.change_password", "enabled", 1,
                             "m.room_versions", "default", r->srv->cfg->rooms.default_version,
                             "available", available,
                             "m.set_displayname", "enabled", 1,
                             "m.set_avatar_url", "enabled", 1,
                             "m.3pid_changes", "enabled", 0);
    return http_respond_json(r, 200, body);
}

int acc_profile_routes(http_server *s)
{
    if (client_route(s, "GET", "/_matrix/client/v3/profile/{userId}", get_profile, 0) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/profile/{userId}/{field}", get_field, 0) < 0 ||
        client_route(s, "PUT", "/_matrix/client/v3/profile/{userId}/{field}", put_field,
                     ACC_MAX_BODY_BYTES) < 0 ||
        client_route(s, "GET", "/_matrix/client/v3/capabilities", get_capabilities, 0) < 0)
        return -1;
    return 0;
}
