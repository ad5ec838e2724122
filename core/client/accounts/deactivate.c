/*
 * core/client/accounts/deactivate.c - closing an account for good: POST
 * /_matrix/client/v3/account/deactivate {auth, erase, id_server}.
 *
 * Deactivation is sensitive, so it needs the user's password again through
 * user-interactive auth (m.login.password, checked on the auth pool like a password
 * change). This file owns what deactivating means, in this order:
 *   1. one transaction: users.deactivated = true and the password hash cleared (the
 *      account can never log in again; its name stays taken, so registration answers
 *      M_USER_IN_USE), every device and access token deleted (their E2EE keys and pushers
 *      go with the devices), the user's UIA sessions dropped, and with erase: true the
 *      profile's display name and avatar cleared and the user listed in erased_users:
 *      from then on every reader of events serves the user's events redacted to whoever
 *      was not joined to the room at them, and to other servers (the rule is
 *      rooms_erasure_hides in core/rooms/rooms_vis.c; docs/architecture.md, "The room model",
 *      "Erasure");
 *   2. once committed, the token cache forgets the user (other processes hear the
 *      triggers' NOTIFY) and room-mates learn the device list changed;
 *   3. one leave event per room the user is joined to or invited to, at most
 *      DEACTIVATE_ROOMS_MAX rooms, each its own short transaction of the rooms write path
 *      on a connection taken per room, on the rooms module's bulk pool (handed off there
 *      after step 2, so no auth thread is held; if its queue is full, on the auth thread
 *      after all). A room that fails is logged and skipped: the account is deactivated
 *      whatever the rooms did.
 * The answer is {"id_server_unbind_result": "no-support"}: Atrium keeps no third-party
 * identifiers, so there is nothing to unbind and no identity server is called; id_server
 * is only checked for its type. What this file does not do: refuse logins of deactivated
 * users (login.c and auth.c read the flag), hide them from the user directory
 * (user_directory.c), or build membership events (crooms_membership.c).
 */
#include <stdio.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/rooms/crooms_api.h"
#include "core/rooms/events.h"

#define DEACTIVATE_PURPOSE "deactivate"
/* Rooms one deactivation leaves before it answers; each is one short transaction of the
 * rooms write path. Rooms past it keep the user's old membership. */
#define DEACTIVATE_ROOMS_MAX 1000
#define DEACTIVATE_ID_SERVER_MAX_BYTES 255 /* a host name with a port */

typedef struct deactivate_state {
    uia_password auth;
    bool erase;
    bool deactivated; /* the account's rows are committed; the rooms are next */
} deactivate_state;

/* The account's own rows, as one transaction (conn held): true when committed. */
static bool deactivate_account(PGconn *c, const char *user_id, bool erase)
{
    const char *p[1] = {user_id};
    bool ok = db_begin(c) &&
              db_exec(c, "UPDATE users SET deactivated = true, password_hash = NULL"
                         " WHERE user_id = $1", 1, p) &&
              acc_delete_devices(c, user_id, NULL, 0, NULL) &&
              db_exec(c, "DELETE FROM uia_sessions WHERE user_id = $1", 1, p);
    if (ok && erase) {
        char now[24];
        snprintf(now, sizeof(now), "%lld", (long long)rt_wall_ms());
        const char *pe[2] = {user_id, now};
        ok = db_exec(c, "UPDATE profiles SET displayname = NULL, avatar_url = NULL"
                        " WHERE user_id = $1", 1, p) &&
             db_exec(c, "INSERT INTO erased_users (user_id, erased_ts) VALUES ($1, $2)"
                        " ON CONFLICT (user_id) DO NOTHING", 2, pe);
    }
    ok = ok && db_commit(c);
    if (!ok) db_rollback(c);
    return ok;
}

/* After user_id was deactivated: leave every room they are joined to or invited to (at
 * most DEACTIVATE_ROOMS_MAX), holding a connection only for one room at a time. Failures
 * are logged, never answered. */
static void leave_rooms(atrium_req *r, const char *user_id)
{
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    json_t *rooms = json_array();
    int n = c && rooms ? rooms_user_room_ids(c, user_id, true, DEACTIVATE_ROOMS_MAX + 1, rooms)
                       : ROOMS_E_DB;
    if (c) db_release(db_global(), c);
    if (n < 0) {
        rt_log(ATRIUM_LOG_WARN, "core", "%s was deactivated, but its rooms could not be listed "
               "(database busy or failing): it stays a member of them", user_id);
        json_decref(rooms);
        return;
    }
    if (n > DEACTIVATE_ROOMS_MAX) {
        rt_log(ATRIUM_LOG_WARN, "core", "%s was deactivated; it is in more than %d rooms and "
               "leaves only the first %d (by room ID)", user_id, DEACTIVATE_ROOMS_MAX,
               DEACTIVATE_ROOMS_MAX);
        n = DEACTIVATE_ROOMS_MAX;
    }
    int left = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        const char *room = json_string_value(json_array_get(rooms, (size_t)i));
        c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
        if (!c) {
            rt_log(ATRIUM_LOG_WARN, "core", "deactivating %s: the database is busy; it stays in "
                   "%d of %d rooms", user_id, n - i, n);
            failed += n - i;
            break;
        }
        rooms_err e = {0};
        char id[EVENT_ID_LEN];
        int rc = crooms_member_leave(c, r->arena, room, user_id, id, &e);
        db_release(db_global(), c);
        if (rc == ROOMS_OK) {
            left += id[0] != '\0';
        } else {
            failed++;
            rt_log(ATRIUM_LOG_WARN, "core", "deactivating %s: it stays in room %s: %s", user_id,
                   room, e.why);
        }
    }
    rt_log(ATRIUM_LOG_INFO, "core", "deactivated %s: left %d rooms, %d failed", user_id, left,
           failed);
    json_decref(rooms);
}

/* The answer, once every live process dropped the user's tokens (auth_revoke.c). */
static int answer_deactivated(atrium_req *r)
{
    json_t *body = json_pack("{s:s}", "id_server_unbind_result", "no-support");
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    if (!c) return http_respond_json(r, 200, body); /* busy: the rooms are left, say so */
    int rc = auth_revoke_answer(r, c, r->user, 200, body);
    db_release(db_global(), c);
    return rc;
}

/* [auth pool] After the password passed: deactivate, then hand off to the rooms module's
 * bulk pool, so leaving many rooms holds no auth thread. [bulk pool] Leave the rooms and
 * answer. */
static int finish_deactivate(atrium_req *r, deactivate_state *st)
{
    if (st->deactivated) {
        leave_rooms(r, r->user);
        return answer_deactivated(r);
    }
    if (!uia_password_verify(r, &st->auth, DEACTIVATE_PURPOSE)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    bool ok = deactivate_account(c, r->user, st->erase);
    if (ok) acc_tokens_revoked(c, r->user); /* the tokens stop working before the rooms */
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    st->deactivated = true;
    int rc = crooms_to_bulk_pool(r);
    if (rc == ATRIUM_HANDED_OFF) return rc;
    /* No room for it there: the account is closed all the same; say so, and leave here. */
    leave_rooms(r, r->user);
    return answer_deactivated(r);
}

/* POST /_matrix/client/v3/account/deactivate {auth, erase, id_server} */
static int post_deactivate(atrium_req *r)
{
    int rerun_rc;
    if (auth_revoke_rerun(r, &rerun_rc)) return rerun_rc; /* after a revocation's wait */
    if (!auth_request(r)) return ATRIUM_DONE;
    if (r->run_reason == ATRIUM_RUN_HANDOFF) return finish_deactivate(r, r->core_state);
    /* An empty body asks for the challenge. */
    json_t *body = uia_body(r);
    if (!body) return ATRIUM_DONE;
    deactivate_state *st = rt_arena_alloc(r->arena, sizeof(*st));
    if (!st) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    const char *id_server;
    if (!http_field_bool(r, body, "erase", false, &st->erase) ||
        !http_field_string(r, body, "id_server", false, DEACTIVATE_ID_SERVER_MAX_BYTES, &id_server))
        return ATRIUM_DONE;
    if (!uia_password_begin(r, body, DEACTIVATE_PURPOSE, &st->auth)) return ATRIUM_DONE;
    return acc_to_auth_pool(r, st);
}

int acc_deactivate_routes(http_server *s)
{
    return client_route(s, "POST", "/_matrix/client/v3/account/deactivate", post_deactivate,
                        ACC_MAX_BODY_BYTES);
}
