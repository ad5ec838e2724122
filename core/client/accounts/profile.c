/*
 * core/client/accounts/profile.c - profiles (display name and avatar) and what the server lets
 * accounts do (GET /capabilities).
 *
 * GET /profile/{userId}[/{field}] answers for local users from the profiles table: 404
 * M_NOT_FOUND for a user that does not exist, or for a field that is not set. Remote users'
 * profiles are asked of their server (profile_remote.c). Only a user
 * may set their own profile (403 otherwise); an empty string clears a field (stored as
 * NULL, so it reads as not set). A new account's display name is its localpart
 * (acc_create_account).
 *
 * This file owns the decision that a profile change reaches the user's rooms, and how far:
 * once the new value is committed, every room the user is joined to gets a new
 * m.room.member event carrying it (clients show names and avatars from member state), up
 * to PROFILE_ROOMS_MAX rooms per change, each room its own short transaction on a
 * connection taken and given back per room. The whole change runs on the rooms module's
 * bulk pool (crooms_to_bulk_pool), and a change counts against the message rate limit. A room that refuses or fails is logged and
 * skipped; the PUT answers 200 once the profile is committed, whatever the rooms did.
 * What this file does not do: build or authorize those events (the rooms module's
 * crooms_member_profile_refresh does, through the rooms write path, and writes nothing
 * where the member event already has the values), or update rooms beyond the cap later.
 */
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/ratelimits.h"
#include "core/client/rooms/crooms_api.h"
#include "core/rooms/events.h"

/* Joined rooms one profile change updates before the PUT answers; each is one short
 * transaction of the rooms write path. Rooms past it keep their old member event. */
#define PROFILE_ROOMS_MAX 1000

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

json_t *acc_profile_load(atrium_req *r, const char *user_id)
{
    PGconn *c = http_db_checkout(r);
    if (!c) return NULL;
    const char *p[1] = {user_id};
    PGresult *res = acc_q(c, "SELECT p.displayname, p.avatar_url FROM users u"
                             " LEFT JOIN profiles p ON p.user_id = u.user_id"
                             " WHERE u.user_id = $1", 1, p);
    http_db_checkin(c);
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
    if (!acc_is_local_user(r, http_req_param(r, "userId")))
        return acc_profile_remote(r, http_req_param(r, "userId"), NULL);
    int asked = as_query_user(r, http_req_param(r, "userId")); /* a bridge's user */
    if (asked != ATRIUM_CONTINUE) return asked;
    json_t *profile = acc_profile_load(r, http_req_param(r, "userId"));
    if (!profile) return ATRIUM_DONE;
    return http_respond_json(r, 200, profile);
}

/* GET /_matrix/client/v3/profile/{userId}/{field} */
static int get_field(atrium_req *r)
{
    const profile_field *f = field_named(http_req_param(r, "field"));
    if (!f) return http_respond_error(r, 404, "M_NOT_FOUND", "No such profile field");
    if (!acc_is_local_user(r, http_req_param(r, "userId")))
        return acc_profile_remote(r, http_req_param(r, "userId"), f->name);
    int asked = as_query_user(r, http_req_param(r, "userId")); /* a bridge's user */
    if (asked != ATRIUM_CONTINUE) return asked;
    json_t *profile = acc_profile_load(r, http_req_param(r, "userId"));
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

/* After user_id's profile was committed: refresh their member event in each joined room
 * (at most PROFILE_ROOMS_MAX), holding a connection only for one room at a time. Failures
 * are logged, never answered: the profile change itself has succeeded. */
static void update_joined_rooms(atrium_req *r, const char *user_id)
{
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    json_t *rooms = json_array();
    int n = c && rooms ? rooms_user_room_ids(c, user_id, false, PROFILE_ROOMS_MAX + 1, rooms)
                       : ROOMS_E_DB;
    if (c) db_release(db_global(), c);
    if (n < 0) {
        rt_log(ATRIUM_LOG_WARN, "core", "profile of %s changed, but its rooms could not be "
               "listed (database busy or failing): their member events keep the old values "
               "until the next profile change", user_id);
        json_decref(rooms);
        return;
    }
    if (n > PROFILE_ROOMS_MAX) {
        rt_log(ATRIUM_LOG_WARN, "core", "profile of %s changed; it is joined to more than %d "
               "rooms and only the first %d (by room ID) get the new member event",
               user_id, PROFILE_ROOMS_MAX, PROFILE_ROOMS_MAX);
        n = PROFILE_ROOMS_MAX;
    }
    for (int i = 0; i < n; i++) {
        const char *room = json_string_value(json_array_get(rooms, (size_t)i));
        c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
        if (!c) {
            rt_log(ATRIUM_LOG_WARN, "core", "profile of %s: the database is busy; %d of %d "
                   "rooms keep the old member event", user_id, n - i, n);
            break;
        }
        rooms_err e = {0};
        char id[EVENT_ID_LEN];
        int rc = crooms_member_profile_refresh(c, r->arena, room, user_id, id, &e);
        db_release(db_global(), c);
        if (rc != ROOMS_OK)
            rt_log(ATRIUM_LOG_WARN, "core", "profile of %s: room %s keeps the old member "
                   "event: %s", user_id, room, e.why);
    }
    json_decref(rooms);
}

/* PUT /_matrix/client/v3/profile/{userId}/{field} {"<field>": value} */
static int put_field(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    const profile_field *f = field_named(http_req_param(r, "field"));
    if (!f) return http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown profile field");
    if (strcmp(http_req_param(r, "userId"), r->user) != 0)
        return http_respond_error(r, 403, "M_FORBIDDEN", "You can only change your own profile");
    json_t *body = http_req_json(r);
    const char *value;
    if (!body || !http_field_string(r, body, f->name, true, f->max_bytes, &value)) return ATRIUM_DONE;
    if (strcmp(f->name, "avatar_url") == 0 && value[0] && strncmp(value, "mxc://", 6) != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "avatar_url must be an mxc:// URI");
    /* Each change may write a member event into every joined room: it costs a message,
     * and it runs on the rooms module's bulk pool, not on this request thread. */
    if (r->run_reason != ATRIUM_RUN_HANDOFF) {
        if (ratelimit_refused(r, ratelimit_message())) return ATRIUM_DONE;
        return crooms_to_bulk_pool(r);
    }
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    const char *p[2] = {r->user, value};
    char *sql = rt_arena_printf(r->arena,
                                "INSERT INTO profiles (user_id, %s) VALUES ($1, NULLIF($2, ''))"
                                " ON CONFLICT (user_id) DO UPDATE SET %s = EXCLUDED.%s",
                                f->column, f->column, f->column);
    bool ok = sql && db_exec(c, sql, 2, p);
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    update_joined_rooms(r, r->user);
    return http_respond_json(r, 200, json_object());
}

/* GET /_matrix/client/v3/capabilities */
static int get_capabilities(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    json_t *available = json_object();
    for (size_t i = 0; available && ROOM_VERSIONS_SUPPORTED[i]; i++)
        json_object_set_new(available, ROOM_VERSIONS_SUPPORTED[i], json_string("stable"));
    json_t *body = json_pack("{s:{s:{s:b}, s:{s:s, s:o}, s:{s:b}, s:{s:b}, s:{s:b}, s:{s:b}}}",
                             "capabilities",
                             "m.change_password", "enabled", 1,
                             "m.room_versions", "default", r->srv->cfg->rooms.default_version,
                             "available", available,
                             "m.set_displayname", "enabled", 1,
                             "m.set_avatar_url", "enabled", 1,
                             "m.3pid_changes", "enabled", 0,
                             "m.get_login_token", "enabled",
                             acc_login_token_enabled(r) && !r->is_guest);
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
