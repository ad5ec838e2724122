/*
 * core/rooms/state_pdus.c - room states in memory as PDUs (state_pdus.h): one JSON object
 * keyed by the length-prefixed pair "<len(type)>:<type><state_key>", so no type or state
 * key can make two keys collide. Also the stripped state shown to those outside a room
 * (rooms_stripped_state, rooms_tx.h), which is read from such a state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rooms/canonical_json.h"
#include "core/rooms/events_graph.h"
#include "core/rooms/rooms.h"
#include "core/rooms/rooms_tx.h"
#include "core/rooms/state_pdus.h"

#define STATE_KEY_BYTES (2 * EVENT_MAX_ID_BYTES + 16)

static void map_key(char out[STATE_KEY_BYTES], const char *type, const char *state_key)
{
    snprintf(out, STATE_KEY_BYTES, "%zu:%s%s", strlen(type), type, state_key);
}

json_t *rooms_pdus_new(void)
{
    return json_object();
}

void rooms_pdus_put(json_t *map, json_t *pdu)
{
    const char *type = json_string_value(json_object_get(pdu, "type"));
    const char *sk = event_state_key(pdu);
    if (!type || !sk) return;
    char key[STATE_KEY_BYTES];
    map_key(key, type, sk);
    json_object_set(map, key, pdu);
}

const json_t *rooms_pdus_get(void *map, const char *type, const char *state_key)
{
    if (!type || !state_key) return NULL;
    char key[STATE_KEY_BYTES];
    map_key(key, type, state_key);
    return json_object_get(map, key);
}

json_t *rooms_pdus_ids(const room_version *v, const json_t *map)
{
    json_t *ids = json_array();
    const char *k;
    json_t *pdu;
    json_object_foreach((json_t *)map, k, pdu) {
        const char *given = json_string_value(json_object_get(pdu, "event_id"));
        char id[EVENT_ID_LEN];
        if (given) json_array_append_new(ids, json_string(given));
        else if (event_compute_id(v, pdu, id) == 0) json_array_append_new(ids, json_string(id));
    }
    return ids;
}

static void put_rows(json_t *map, json_t *ids, PGresult *res)
{
    for (int i = 0; i < PQntuples(res); i++) {
        json_t *pdu = json_loads(PQgetvalue(res, i, 0), 0, NULL);
        const room_version *v = room_version_find(PQgetvalue(res, i, 2));
        if (pdu && v && PQgetvalue(res, i, 1)[0] == 't') {
            json_t *red = event_redact(v, pdu);
            json_decref(pdu);
            pdu = red;
        }
        if (!pdu) continue;
        rooms_pdus_put(map, pdu);
        if (ids) json_array_append_new(ids, json_string(PQgetvalue(res, i, 3)));
        json_decref(pdu);
    }
}

int rooms_pdus_current(PGconn *c, const char *room_id, json_t **map_out, json_t **ids_out)
{
    *map_out = NULL;
    if (ids_out) *ids_out = NULL;
    const char *p[1] = {room_id};
    PGresult *res = rooms_q(c,
                            "SELECT e.pdu, e.redacted_by IS NOT NULL, rm.room_version, e.event_id"
                            " FROM current_state cs JOIN events e ON e.event_id = cs.event_id"
                            " JOIN rooms rm ON rm.room_id = cs.room_id WHERE cs.room_id = $1",
                            1, p, NULL);
    if (!res) return -1;
    *map_out = rooms_pdus_new();
    if (ids_out) *ids_out = json_array();
    put_rows(*map_out, ids_out ? *ids_out : NULL, res);
    PQclear(res);
    return 0;
}

int rooms_pdus_of_ids(PGconn *c, const json_t *ids, json_t **map_out)
{
    *map_out = NULL;
    rt_arena *a = rt_arena_new(4096);
    if (!a) return -1;
    const char *p[1] = {rooms_pg_array(a, ids)};
    PGresult *res = p[0] ? rooms_q(c,
                                   "SELECT e.pdu, e.redacted_by IS NOT NULL, rm.room_version,"
                                   " e.event_id FROM events e JOIN rooms rm ON rm.room_id = e.room_id"
                                   " WHERE e.event_id = ANY($1::text[])"
                                   " UNION ALL SELECT o.pdu, false, NULL, o.event_id"
                                   " FROM event_outliers o WHERE o.event_id = ANY($1::text[])"
                                   " AND o.status <> 'rejected'",
                                   1, p, NULL)
                         : NULL;
    rt_arena_free(a);
    if (!res) return -1;
    *map_out = rooms_pdus_new();
    put_rows(*map_out, NULL, res);
    PQclear(res);
    return 0;
}

/* ---- stripped state ------------------------------------------------------------------ */

/* The events that describe a room to someone outside it, besides a member event. */
static const char *const STRIPPED_TYPES[] = {"m.room.create", "m.room.join_rules", "m.room.name",
                                             "m.room.avatar", "m.room.canonical_alias",
                                             "m.room.encryption", "m.room.topic", NULL};

/* (rooms_tx.h) */
json_t *rooms_stripped_event(const json_t *ev)
{
    json_t *t = json_object_get(ev, "type"), *sk = json_object_get(ev, "state_key"),
           *s = json_object_get(ev, "sender"), *c = json_object_get(ev, "content");
    if (!json_is_string(t) || !json_is_string(sk) || !json_is_string(s) || !json_is_object(c))
        return NULL;
    return json_pack("{s:O, s:O, s:O, s:O}", "type", t, "state_key", sk, "sender", s, "content", c);
}

json_t *rooms_stripped_state(const json_t *map, const char *member)
{
    json_t *out = json_array();
    for (size_t i = 0; STRIPPED_TYPES[i]; i++) {
        json_t *one = rooms_stripped_event(rooms_pdus_get((void *)map, STRIPPED_TYPES[i], ""));
        if (one) json_array_append_new(out, one);
    }
    json_t *me = member ? rooms_stripped_event(rooms_pdus_get((void *)map, "m.room.member", member)) : NULL;
    if (me) json_array_append_new(out, me);
    return out;
}
