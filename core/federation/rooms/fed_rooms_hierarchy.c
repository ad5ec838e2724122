/*
 * core/federation/rooms/fed_rooms_hierarchy.c - GET /_matrix/federation/v1/hierarchy/{roomId}:
 * a space and its direct children as another server may see them, in one answer (no
 * paging: the asking server walks further itself, space by space).
 *
 * The room must be one this server is resident in (one of our users joined), its server
 * ACL must allow the origin, and the origin must be able to see it by the hierarchy's
 * rule for servers (rooms_space_may_see, core/rooms/rooms_space.c: public, knockable or
 * world_readable, or one of its users joined to it or invited (so a user invited to a
 * space can look into it first), or, when restricted, joined to an allowed room); else 404, as the spec says ("unable to peek/join"). Each child this server is
 * resident in is either in `children` (its summary) or, when the origin could not see it
 * or the child's ACL denies the origin, in `inaccessible_children`; a child this server
 * does not hold is left out, since it cannot speak for it.
 */
#include <string.h>

#include "core/federation/rooms/fed_rooms.h"
#include "core/rooms/rooms_space.h"

/* The child's place in the answer: 1 in children (*out its summary), 0 inaccessible, 2 not
 * ours to say, -1 database. */
static int child_of(PGconn *c, const char *room_id, const char *origin, json_t **out)
{
    *out = NULL;
    int res = rooms_space_resident(c, room_id);
    if (res <= 0) return res < 0 ? -1 : 2;
    int acl = fed_rooms_acl_allows(c, room_id, origin);
    if (acl <= 0) return acl;
    json_t *s = NULL;
    int rc = rooms_summary(c, room_id, true, &s);
    if (rc == ATRIUM_E_NOTFOUND) return 2;
    if (rc < 0) return -1;
    int may = rooms_space_may_see(c, s, NULL, origin);
    if (may <= 0) {
        json_decref(s);
        return may;
    }
    *out = s;
    return 1;
}

/* The answer for a room that may be shown: {room, children, inaccessible_children}, or NULL
 * (database). */
static json_t *answer(PGconn *c, json_t *room, const char *origin, bool suggested)
{
    const char *room_id = json_string_value(json_object_get(room, "room_id"));
    const char *type = json_string_value(json_object_get(room, "room_type"));
    json_t *kids = NULL;
    if (type && strcmp(type, "m.space") == 0 &&
        rooms_space_children(c, room_id, suggested, &kids) < 0)
        return NULL;
    json_object_set_new(room, "children_state", kids ? kids : json_array());
    json_t *children = json_array(), *inaccessible = json_array();
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(room, "children_state"), i, k) {
        const char *child = json_string_value(json_object_get(k, "state_key"));
        json_t *s = NULL;
        int rc = child_of(c, child, origin, &s);
        if (rc < 0) {
            json_decref(children);
            json_decref(inaccessible);
            return NULL;
        }
        if (rc == 1) json_array_append_new(children, s);
        if (rc == 0) json_array_append_new(inaccessible, json_string(child));
    }
    return json_pack("{s:O, s:o, s:o}", "room", room, "children", children,
                     "inaccessible_children", inaccessible);
}

/* GET /_matrix/federation/v1/hierarchy/{roomId}?suggested_only= (signed) */
static int get_hierarchy(atrium_req *r)
{
    const char *room_id = http_req_param(r, "roomId"), *s = http_req_query(r, "suggested_only");
    if (s && strcmp(s, "true") != 0 && strcmp(s, "false") != 0)
        return http_respond_error(r, 400, "M_INVALID_PARAM", "suggested_only must be true or false");
    PGconn *c = fed_rooms_open(r, room_id);
    if (!c) return ATRIUM_DONE;
    json_t *room = NULL, *body = NULL;
    int res = rooms_space_resident(c, room_id);
    int rc = res < 0 ? ATRIUM_E_DB : res == 0 ? ATRIUM_E_NOTFOUND
                                              : rooms_summary(c, room_id, true, &room);
    int may = rc == 0 ? rooms_space_may_see(c, room, NULL, r->origin) : 0;
    if (may > 0 && !(body = answer(c, room, r->origin, s && strcmp(s, "true") == 0))) may = -1;
    fed_rooms_close(c);
    json_decref(room);
    if ((rc < 0 && rc != ATRIUM_E_NOTFOUND) || may < 0)
        return http_respond_error(r, 503, "M_UNKNOWN", "The database failed; retry");
    if (!body)
        return http_respond_error(r, 404, "M_NOT_FOUND",
                                  "This server cannot show you that room");
    return http_respond_json(r, 200, body);
}

int fed_rooms_hierarchy_routes(fed_module *m)
{
    static const atrium_route routes[] = {
        {.method = "GET", .path = "/_matrix/federation/v1/hierarchy/{roomId}",
         .handler = get_hierarchy, .flags = ATRIUM_ROUTE_FEDERATION},
    };
    return HTTP_ROUTES_ADD(m->srv, routes, "federation") < 0 ? -1 : 0;
}
