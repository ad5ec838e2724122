/*
 * core/client/sync/ssync_ext.c - the extensions of a sliding sync response, each only
 * when the request enabled it: to_device, e2ee, account_data, receipts, typing.
 *
 * Decisions owned here:
 *   - to_device and e2ee are /sync's own sections (sync.h, registered by the e2ee module
 *     under those names), run for this device: to_device with the extension's own
 *     since/next_batch (stream positions, so a message is deleted once a request's since
 *     reaches the response that carried it: /sync's acknowledgement rule), e2ee for the
 *     connection's window (device_lists changed/left, one-time key counts, unused
 *     fallback key types).
 *   - account_data: global and per room, what changed in the window (everything on a
 *     connection's first answer); receipts and typing: per room, as /sync's ephemeral
 *     events. Room data is limited to the rooms of the lists and subscriptions, and to
 *     those the extension's `lists` / `rooms` name ("*" or absent: all).
 * What it does not do: presence, thread subscriptions (not served).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/sync/ssync.h"
#include "core/client/sync/sync.h"
#include "atrium/parse.h"

static bool names_any(const json_t *list, const json_t *names)
{
    size_t i, j;
    const json_t *x, *y;
    json_array_foreach(list, i, x)
    {
        if (json_is_string(x) && strcmp(json_string_value(x), "*") == 0) return true;
        json_array_foreach(names, j, y)
        {
            if (json_equal(x, y)) return true;
        }
    }
    return false;
}

/* Is the picked room within the extension's scope? */
static bool in_scope(const ssync_ext_scope *sc, const char *room_id, const json_t *pick)
{
    json_t *id = json_string(room_id), *one = json_pack("[o]", id);
    bool by_list = json_array_size(json_object_get(pick, "lists")) > 0 &&
                   (!sc->lists || names_any(sc->lists, json_object_get(pick, "lists")));
    bool by_room = (json_is_true(json_object_get(pick, "sub")) && !sc->rooms) ||
                   (sc->rooms && names_any(sc->rooms, one));
    json_decref(one);
    return by_list || by_room;
}

static int to_device(sync_ctx *s, const ssync_request *q, json_t *ext, bool *has_new)
{
    int64_t since = 0;
    if (q->to_device_since && atrium_parse_int64(q->to_device_since, 0, INT64_MAX, &since) != 0) since = 0;
    if (since > s->upto) since = s->upto;
    json_t *scratch = json_object();
    int rc = sync_sections_run("to_device", s->c, s->user, s->device, since, s->upto, scratch);
    if (rc > 0) *has_new = true;
    json_t *events = json_object_get(json_object_get(scratch, "to_device"), "events");
    json_object_set_new(ext, "to_device", json_pack("{s:s, s:o}", "next_batch", crooms_i64(s->r, s->upto),
                                                    "events", events ? json_incref(events) : json_array()));
    json_decref(scratch);
    return rc < 0 ? ROOMS_E_DB : ROOMS_OK;
}

static int e2ee(sync_ctx *s, int64_t prev, json_t *ext, bool *has_new)
{
    json_t *out = json_object();
    int rc = sync_sections_run("e2ee", s->c, s->user, s->device, prev, s->upto, out);
    if (rc > 0) *has_new = true;
    json_object_set_new(ext, "e2ee", out);
    return rc < 0 ? ROOMS_E_DB : ROOMS_OK;
}

static int account_data(sync_ctx *s, const ssync_request *q, const json_t *picked, int64_t prev,
                        json_t *ext, bool *has_new)
{
    const char *p[3] = {s->user, crooms_i64(s->r, prev), crooms_i64(s->r, s->upto)};
    PGresult *res = rooms_q(s->c,
                            "SELECT room_id, type, content::text FROM account_data WHERE user_id = $1"
                            " AND stream_pos > $2::bigint AND stream_pos <= $3::bigint ORDER BY stream_pos",
                            3, p, NULL);
    if (!res) return ROOMS_E_DB;
    json_t *global = json_array(), *rooms = json_object();
    for (int i = 0; i < PQntuples(res); i++) {
        const char *room = PQgetvalue(res, i, 0);
        const json_t *pick = json_object_get(picked, room);
        if (*room && (!pick || !in_scope(&q->account_data, room, pick))) continue;
        json_t *content = json_loads(PQgetvalue(res, i, 2), 0, NULL);
        json_t *ev = json_pack("{s:s, s:o}", "type", PQgetvalue(res, i, 1), "content",
                               content ? content : json_object());
        if (!*room) {
            json_array_append_new(global, ev);
            continue;
        }
        json_t *list = json_object_get(rooms, room);
        if (!list) json_object_set_new(rooms, room, list = json_array());
        json_array_append_new(list, ev);
    }
    PQclear(res);
    if (json_array_size(global) > 0 || json_object_size(rooms) > 0) *has_new = true;
    json_object_set_new(ext, "account_data", json_pack("{s:o, s:o}", "global", global, "rooms", rooms));
    return ROOMS_OK;
}

/* receipts and typing: /sync's ephemeral events of each room in scope, by type. */
static int ephemeral(sync_ctx *s, const ssync_request *q, const json_t *picked, int64_t prev,
                     json_t *ext, bool *has_new)
{
    json_t *receipts = json_object(), *typing = json_object();
    const char *room;
    json_t *pick;
    int rc = ROOMS_OK;
    s->since = prev;
    json_object_foreach((json_t *)picked, room, pick)
    {
        bool want_r = q->receipts.enabled && in_scope(&q->receipts, room, pick);
        bool want_t = q->typing.enabled && in_scope(&q->typing, room, pick);
        if (!want_r && !want_t) continue;
        json_t *events = json_array();
        rc = sync_room_ephemeral(s, room, prev == 0, events);
        size_t i;
        json_t *ev;
        json_array_foreach(events, i, ev)
        {
            const char *type = json_string_value(json_object_get(ev, "type"));
            bool is_receipt = type && strcmp(type, "m.receipt") == 0;
            if (is_receipt ? !want_r : !want_t) continue;
            json_object_set(is_receipt ? receipts : typing, room, ev);
            *has_new = true;
        }
        json_decref(events);
        if (rc < 0) break;
    }
    if (q->receipts.enabled) json_object_set_new(ext, "receipts", json_pack("{s:O}", "rooms", receipts));
    if (q->typing.enabled) json_object_set_new(ext, "typing", json_pack("{s:O}", "rooms", typing));
    json_decref(receipts);
    json_decref(typing);
    return rc < 0 ? ROOMS_E_DB : ROOMS_OK;
}

int ssync_extensions(sync_ctx *s, const ssync_request *q, const json_t *picked, int64_t prev,
                     json_t *ext, bool *has_new)
{
    if (q->to_device && to_device(s, q, ext, has_new) < 0) return ROOMS_E_DB;
    if (q->e2ee && e2ee(s, prev, ext, has_new) < 0) return ROOMS_E_DB;
    if (q->account_data.enabled && account_data(s, q, picked, prev, ext, has_new) < 0) return ROOMS_E_DB;
    if ((q->receipts.enabled || q->typing.enabled) && ephemeral(s, q, picked, prev, ext, has_new) < 0)
        return ROOMS_E_DB;
    return ROOMS_OK;
}
