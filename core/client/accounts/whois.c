/*
 * core/client/accounts/whois.c - GET /_matrix/client/v3/admin/whois/{userId}: a user's
 * devices and where they were last seen, for server admins (and for the user themself, as
 * Synapse allows).
 *
 * The answer has the spec's shape, {user_id, devices: {id: {sessions: [{connections:
 * [...]}]}}}, with one session per device and at most one connection: the device's last
 * seen address, time and user agent (core/client/auth/auth_seen.c keeps them, refreshed
 * at most every AUTH_SEEN_REFRESH_MS, so they can lag behind). The connection always
 * carries user_agent, as Synapse's does: null when the device's requests named none.
 * A user of another server is 404 here: this server knows nothing of its sessions.
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/rooms/rooms.h"

/* GET /_matrix/client/v3/admin/whois/{userId} */
static int get_whois(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    const char *who = http_req_param(r, "userId");
    if (!rooms_user_id_ok(who))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Not a user ID");
    if (strcmp(who, r->user) != 0) {
        int admin = auth_is_admin(r);
        if (admin < 0) return acc_db_failed(r);
        if (!admin)
            return http_respond_error(r, 403, "M_FORBIDDEN", "You are not a server admin");
    }
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    int exists = acc_user_exists(c, who);
    const char *p[1] = {who};
    PGresult *res = exists == 1 ? acc_q(c, "SELECT device_id, last_seen_ts, last_seen_ip,"
                                           " last_seen_user_agent FROM devices"
                                           " WHERE user_id = $1 ORDER BY device_id",
                                        1, p)
                                : NULL;
    http_db_checkin(c);
    if (exists == 0) return http_respond_error(r, 404, "M_NOT_FOUND", "Unknown user");
    if (!res) return acc_db_failed(r);
    json_t *devices = json_object();
    for (int i = 0; i < PQntuples(res); i++) {
        json_t *connections = json_array();
        if (!PQgetisnull(res, i, 1) && !PQgetisnull(res, i, 2))
            json_array_append_new(
                connections,
                json_pack("{s:s, s:I, s:o}", "ip", PQgetvalue(res, i, 2), "last_seen",
                          (json_int_t)strtoll(PQgetvalue(res, i, 1), NULL, 10), "user_agent",
                          PQgetisnull(res, i, 3) ? json_null() : json_string(PQgetvalue(res, i, 3))));
        json_object_set_new(devices, PQgetvalue(res, i, 0),
                            json_pack("{s:[{s:o}]}", "sessions", "connections", connections));
    }
    PQclear(res);
    return http_respond_json(r, 200, json_pack("{s:s, s:o}", "user_id", who, "devices", devices));
}

int acc_whois_routes(http_server *s)
{
    return client_route(s, "GET", "/_matrix/client/v3/admin/whois/{userId}", get_whois, 0);
}
