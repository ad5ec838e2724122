/*
 * core/client/appservice/as_admin.c - the application services for server admins:
 * GET /_atrium/admin/v1/appservices (Synapse has no such endpoint, hence Atrium's prefix,
 * as the media plugin's own admin routes use) answers {"appservices": [...], "total"}, one
 * object per registration in file order:
 *
 *   id, url (null: nothing pushed), sender, protocols, rate_limited, receive_ephemeral,
 *   namespaces {users, aliases, rooms: [{regex, exclusive}]} as the file wrote them;
 *   backlog: stream positions past its cursor (atrium_appservice_backlog's figure; null
 *   before the sender first looked at it), pending_transaction {txn_id, events, attempts,
 *   next_try_ts} or null, in_flight (this process is sending that transaction now: the one
 *   holding the lease core.appservice_sender is the only one that sends),
 *   last_success_ts, last_failure_ts (ms since the epoch, null: never) and last_error (the
 *   last failure's reason), kept in appservice_state by the sender (as_sender.c).
 *
 * Only server admins (auth_is_admin): 403 M_FORBIDDEN otherwise, an application service's
 * as_token included. One short query on the request thread.
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/client.h"

static json_t *namespaces_json(const as_namespace *ns, size_t n)
{
    json_t *out = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(out, json_pack("{s:s, s:b}", "regex", ns[i].regex, "exclusive",
                                             ns[i].exclusive));
    return out;
}

/* Column col of row i as a JSON integer, or null when NULL. */
static json_t *int_or_null(const PGresult *res, int i, int col)
{
    return PQgetisnull(res, i, col) ? json_null()
                                    : json_integer(strtoll(PQgetvalue(res, i, col), NULL, 10));
}

/* The registration part of service i's object. */
static json_t *service_json(size_t i)
{
    const as_service *s = as_at(i);
    json_t *protocols = json_array();
    for (size_t j = 0; j < s->n_protocols; j++)
        json_array_append_new(protocols, json_string(s->protocols[j]));
    return json_pack("{s:s, s:o, s:s, s:o, s:b, s:b, s:{s:o, s:o, s:o}, s:b}", "id", s->id,
                     "url", s->url ? json_string(s->url) : json_null(), "sender", s->sender,
                     "protocols", protocols, "rate_limited", s->rate_limited,
                     "receive_ephemeral", s->receive_ephemeral, "namespaces", "users",
                     namespaces_json(s->users, s->n_users), "aliases",
                     namespaces_json(s->aliases, s->n_aliases), "rooms",
                     namespaces_json(s->rooms, s->n_rooms), "in_flight",
                     as_sender_in_flight(i));
}

/* Add row `row` of the state query (or none: row < 0) to o. */
static void add_state(json_t *o, const PGresult *res, int row)
{
    if (row < 0) {
        json_object_set_new(o, "backlog", json_null());
        json_object_set_new(o, "pending_transaction", json_null());
        json_object_set_new(o, "last_success_ts", json_null());
        json_object_set_new(o, "last_failure_ts", json_null());
        json_object_set_new(o, "last_error", json_null());
        return;
    }
    json_object_set_new(o, "backlog", int_or_null(res, row, 1));
    json_object_set_new(o, "last_success_ts", int_or_null(res, row, 2));
    json_object_set_new(o, "last_failure_ts", int_or_null(res, row, 3));
    json_object_set_new(o, "last_error", PQgetisnull(res, row, 4)
                                             ? json_null()
                                             : json_string(PQgetvalue(res, row, 4)));
    json_object_set_new(o, "pending_transaction",
                        PQgetisnull(res, row, 5)
                            ? json_null()
                            : json_pack("{s:o, s:o, s:o, s:o}", "txn_id",
                                        int_or_null(res, row, 5), "events",
                                        int_or_null(res, row, 6), "attempts",
                                        int_or_null(res, row, 7), "next_try_ts",
                                        int_or_null(res, row, 8)));
}

static int get_appservices(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    int admin = auth_is_admin(r);
    if (admin < 0) return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    if (!admin) return http_respond_error(r, 403, "M_FORBIDDEN", "You are not a server admin");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    PGresult *res = acc_q(c, "SELECT s.as_id, (SELECT last_value FROM stream_seq) - s.stream_pos,"
                             " s.last_success_ts, s.last_failure_ts, s.last_error, t.txn_id,"
                             " t.n_events, t.attempts, t.next_try_ts"
                             " FROM appservice_state s LEFT JOIN appservice_txns t USING (as_id)",
                          0, NULL);
    http_db_checkin(c);
    if (!res) return acc_db_failed(r);
    json_t *list = json_array();
    for (size_t i = 0; i < as_count(); i++) {
        json_t *o = service_json(i);
        int row = -1;
        for (int k = 0; row < 0 && k < PQntuples(res); k++)
            if (strcmp(PQgetvalue(res, k, 0), as_at(i)->id) == 0) row = k;
        if (!o) continue;
        add_state(o, res, row);
        json_array_append_new(list, o);
    }
    PQclear(res);
    return http_respond_json(r, 200, json_pack("{s:o, s:I}", "appservices", list, "total",
                                               (json_int_t)json_array_size(list)));
}

int as_admin_routes(http_server *s)
{
    return client_route(s, "GET", "/_atrium/admin/v1/appservices", get_appservices, 0);
}
