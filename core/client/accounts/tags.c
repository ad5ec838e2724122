/*
 * core/client/accounts/tags.c - room tags (favourites, low priority, the user's own "u." tags):
 * GET /user/{userId}/rooms/{roomId}/tags, PUT and DELETE .../tags/{tag}.
 *
 * Tags are not a table of their own: they are the room account data event m.tag with
 * content {"tags": {tag: {order, ...}}}, written through acc_account_data_store, so a
 * change takes a stream position and reaches /sync's room account_data like any other
 * account data (the writer wakes the user after commit). This file owns the edit rule:
 * a PUT or DELETE reads the current m.tag, changes one tag and writes the whole event back,
 * with the user's row locked so two edits of the same user never lose each other. A PUT
 * stores the request body as the tag's value (order, when present, a number in [0, 1];
 * other keys kept); a room holds at most TAGS_PER_ROOM_MAX tags (400 M_LIMIT_EXCEEDED
 * beyond, as for push rules). A DELETE of a tag the room does not have changes nothing and
 * writes nothing. Setting m.tag directly through the room account_data endpoint stays
 * allowed (as Synapse allows it); whatever shape it left is read leniently here (a
 * "tags" that is not an object counts as none). Like account data, tags are the user's
 * own: membership of the room is not checked, only that the path names the caller (403).
 */
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/sync/notifier.h"
#include "core/client/rooms/crooms_api.h"

#define TAG_NAME_MAX_BYTES 255    /* the spec's limit on a tag name */
#define TAGS_PER_ROOM_MAX 64      /* distinct tags on one room */
#define TAG_BODY_MAX_BYTES 4096   /* one tag's value (the PUT body) */
#define TAG_ORDER_MIN 0.0
#define TAG_ORDER_MAX 1.0
#define TAG_EVENT_TYPE "m.tag"

/* The path's user must be the caller, its room a room ID and its tag (when tag is not
 * NULL) a sane name. false after answering. */
static bool tag_path_ok(atrium_req *r, const char *tag)
{
    if (strcmp(http_req_param(r, "userId"), r->user) != 0) {
        http_respond_error(r, 403, "M_FORBIDDEN", "You can only use your own room tags");
        return false;
    }
    if (!rooms_room_id_ok(http_req_param(r, "roomId"))) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'%.64s' is not a room ID",
                           http_req_param(r, "roomId"));
        return false;
    }
    if (!tag) return true;
    if (!tag[0] || strlen(tag) > TAG_NAME_MAX_BYTES) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "A tag name is 1 to %d bytes",
                           TAG_NAME_MAX_BYTES);
        return false;
    }
    json_t *as_string = json_string(tag); /* NULL when tag is not UTF-8 */
    if (!as_string) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "A tag name must be UTF-8");
        return false;
    }
    json_decref(as_string);
    return true;
}

/* A PUT body: a JSON object whose order, when present, is a number in [0, 1]. false after
 * answering. */
static bool tag_info_ok(atrium_req *r, json_t *info)
{
    json_t *order = json_object_get(info, "order");
    if (!order) return true;
    if (!json_is_number(order)) {
        http_respond_error(r, 400, "M_BAD_JSON", "'order' must be a number");
        return false;
    }
    double v = json_number_value(order);
    if (v < TAG_ORDER_MIN || v > TAG_ORDER_MAX) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'order' must be between 0 and 1");
        return false;
    }
    return true;
}

/* The stored m.tag content of (user, room) as a new reference ({} when there is none or
 * it is not a JSON object), or NULL after a logged database failure. conn held. */
static json_t *load_tag_event(PGconn *c, const char *user_id, const char *room_id)
{
    const char *p[3] = {user_id, room_id, TAG_EVENT_TYPE};
    PGresult *res = acc_q(c, "SELECT content::text FROM account_data WHERE user_id = $1"
                             " AND room_id = $2 AND type = $3", 3, p);
    if (!res) return NULL;
    json_t *content = PQntuples(res) == 1 ? json_loads(PQgetvalue(res, 0, 0), 0, NULL) : NULL;
    PQclear(res);
    if (!json_is_object(content)) {
        json_decref(content);
        content = json_object();
    }
    return content;
}

/* The "tags" object inside an m.tag content, created (replacing a malformed one) when
 * missing. Borrowed from content; NULL on out of memory. */
static json_t *tags_of(json_t *content)
{
    json_t *tags = json_object_get(content, "tags");
    if (json_is_object(tags)) return tags;
    tags = json_object();
    if (!tags || json_object_set_new(content, "tags", tags) < 0) return NULL;
    return tags;
}

typedef enum { TAG_EDIT_OK, TAG_EDIT_UNCHANGED, TAG_EDIT_FULL, TAG_EDIT_DB, TAG_EDIT_NOMEM }
tag_edit_result;

/* Inside an open transaction: set tag to info (info NULL: remove it) in (user, room)'s
 * m.tag and store the event with a new stream position. */
static tag_edit_result edit_in_tx(PGconn *c, const char *user_id, const char *room_id,
                                  const char *tag, json_t *info)
{
    const char *pu[1] = {user_id};
    /* One user's tag edits queue here, so read-change-write never loses a concurrent edit. */
    if (!db_exec(c, "SELECT FROM users WHERE user_id = $1 FOR NO KEY UPDATE", 1, pu))
        return TAG_EDIT_DB;
    json_t *content = load_tag_event(c, user_id, room_id);
    if (!content) return TAG_EDIT_DB;
    json_t *tags = tags_of(content);
    tag_edit_result rc = TAG_EDIT_OK;
    if (!tags) {
        rc = TAG_EDIT_NOMEM;
    } else if (!info) {
        if (!json_object_get(tags, tag)) rc = TAG_EDIT_UNCHANGED;
        else json_object_del(tags, tag);
    } else if (!json_object_get(tags, tag) && json_object_size(tags) >= TAGS_PER_ROOM_MAX) {
        rc = TAG_EDIT_FULL;
    } else if (json_object_set(tags, tag, info) < 0) {
        rc = TAG_EDIT_NOMEM;
    }
    char *text = rc == TAG_EDIT_OK ? json_dumps(content, JSON_COMPACT) : NULL;
    json_decref(content);
    if (rc != TAG_EDIT_OK) return rc;
    if (!text) return TAG_EDIT_NOMEM;
    bool ok = acc_account_data_store(c, user_id, room_id, TAG_EVENT_TYPE, text);
    free(text);
    return ok ? TAG_EDIT_OK : TAG_EDIT_DB;
}

/* [req] Set or remove one tag of the path's room in one transaction, wake the user's
 * syncs when something changed, and answer {} (or the error). Returns ATRIUM_DONE. */
static int edit_tag(atrium_req *r, const char *tag, json_t *info)
{
    const char *room_id = http_req_param(r, "roomId");
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    tag_edit_result rc = TAG_EDIT_DB;
    if (db_begin(c)) {
        rc = edit_in_tx(c, r->user, room_id, tag, info);
        if (rc == TAG_EDIT_OK && !db_commit(c)) rc = TAG_EDIT_DB;
        if (rc != TAG_EDIT_OK) db_rollback(c);
    }
    http_db_checkin(c);
    switch (rc) {
    case TAG_EDIT_OK:
        notifier_wake_user(r->user);
        return http_respond_json(r, 200, json_object());
    case TAG_EDIT_UNCHANGED:
        return http_respond_json(r, 200, json_object());
    case TAG_EDIT_FULL:
        return http_respond_error(r, 400, "M_LIMIT_EXCEEDED",
                                  "A room can have at most %d tags; remove one first",
                                  TAGS_PER_ROOM_MAX);
    case TAG_EDIT_NOMEM:
        return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    case TAG_EDIT_DB:
        break;
    }
    return acc_db_failed(r);
}

/* GET /_matrix/client/v3/user/{userId}/rooms/{roomId}/tags */
static int get_tags(atrium_req *r)
{
    if (!auth_request(r) || !tag_path_ok(r, NULL)) return ATRIUM_DONE;
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    json_t *content = load_tag_event(c, r->user, http_req_param(r, "roomId"));
    http_db_checkin(c);
    if (!content) return acc_db_failed(r);
    json_t *tags = tags_of(content);
    json_t *body = tags ? json_pack("{s:O}", "tags", tags) : NULL;
    json_decref(content);
    if (!body) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    return http_respond_json(r, 200, body);
}

/* PUT /_matrix/client/v3/user/{userId}/rooms/{roomId}/tags/{tag} {order?, ...} */
static int put_tag(atrium_req *r)
{
    const char *tag = http_req_param(r, "tag");
    if (!auth_request(r) || !tag_path_ok(r, tag)) return ATRIUM_DONE;
    json_t *info = http_req_json(r);
    if (!info || !tag_info_ok(r, info)) return ATRIUM_DONE;
    return edit_tag(r, tag, info);
}

/* DELETE /_matrix/client/v3/user/{userId}/rooms/{roomId}/tags/{tag} */
static int delete_tag(atrium_req *r)
{
    const char *tag = http_req_param(r, "tag");
    if (!auth_request(r) || !tag_path_ok(r, tag)) return ATRIUM_DONE;
    return edit_tag(r, tag, NULL);
}

int acc_tags_routes(http_server *s)
{
#define TAGS "/_matrix/client/v3/user/{userId}/rooms/{roomId}/tags"
    int rc = client_route(s, "GET", TAGS, get_tags, 0) < 0 ||
                     client_route(s, "PUT", TAGS "/{tag}", put_tag, TAG_BODY_MAX_BYTES) < 0 ||
                     client_route(s, "DELETE", TAGS "/{tag}", delete_tag, 0) < 0
                 ? -1
                 : 0;
#undef TAGS
    return rc;
}
