/*
 * core/client/sync/ssync_request.c - the request of a Simplified Sliding Sync (MSC4186):
 * the query's pos and timeout, the body's conn_id, txn_id, lists, room_subscriptions and
 * extensions, checked before anything is read from the database.
 *
 * Decisions owned here: every wrong JSON type is 400 M_BAD_JSON and every bad value
 * (a negative or reversed range, a negative limit, a timeout that is no number) 400
 * M_INVALID_PARAM, at once; counts past the SSYNC_MAX_* bounds of ssync.h are refused, and
 * large numbers (a range's end, a timeline_limit) are lowered to their SSYNC_CLAMP_*
 * bound, so no request makes the server read without bound. The shape is Synapse's
 * unstable one, which Element X sends: `ranges` (a list of pairs), `required_state` as
 * [type, state_key] pairs, the filter `is_invite` (the stable `range` and `is_invited`
 * are read too). What it does not do: read anything (ssync_lists.c, ssync_room.c).
 */
#include <stdio.h>
#include <string.h>

#include "core/client/sync/ssync.h"
#include "atrium/parse.h"

typedef struct perr {
    const char *code; /* NULL: no error yet */
    char why[160];
} perr;

/* Note the first error (code, then a printf-style message): false. */
#define fail(e, errcode, ...) (snprintf((e)->why, sizeof((e)->why), __VA_ARGS__), (e)->code = (errcode), false)

static bool short_string(const json_t *v)
{
    return json_is_string(v) && json_string_length(v) > 0 && json_string_length(v) <= SSYNC_MAX_KEY_BYTES &&
           strlen(json_string_value(v)) == json_string_length(v);
}

/* An array of at most max strings (nulls too when allow_null). */
static bool string_list(const json_t *v, size_t max, bool allow_null, const char *what, perr *e)
{
    if (!json_is_array(v)) return fail(e, "M_BAD_JSON", "'%s' must be a list", what);
    if (json_array_size(v) > max) return fail(e, "M_INVALID_PARAM", "'%s' has too many entries", what);
    size_t i;
    const json_t *x;
    json_array_foreach(v, i, x)
    {
        if (allow_null && json_is_null(x)) continue;
        if (!short_string(x)) return fail(e, "M_BAD_JSON", "'%s' must hold short strings", what);
    }
    return true;
}

/* timeline_limit and required_state of a list or subscription. */
static bool parse_config(const json_t *o, ssync_config *cfg, const char *what, perr *e)
{
    json_t *tl = json_object_get(o, "timeline_limit"), *rs = json_object_get(o, "required_state");
    cfg->timeline_limit = 0;
    if (tl) {
        if (!json_is_integer(tl)) return fail(e, "M_BAD_JSON", "'timeline_limit' of %s must be an integer", what);
        if (json_integer_value(tl) < 0)
            return fail(e, "M_INVALID_PARAM", "'timeline_limit' of %s must not be negative", what);
        cfg->timeline_limit = json_integer_value(tl) > SSYNC_CLAMP_TIMELINE_LIMIT ? SSYNC_CLAMP_TIMELINE_LIMIT
                                                                                : json_integer_value(tl);
    }
    cfg->required_state = NULL;
    if (!rs || json_is_null(rs)) return true;
    if (!json_is_array(rs)) return fail(e, "M_BAD_JSON", "'required_state' of %s must be a list", what);
    if (json_array_size(rs) > SSYNC_MAX_REQUIRED_STATE)
        return fail(e, "M_INVALID_PARAM", "'required_state' of %s has too many entries", what);
    size_t i;
    const json_t *pair;
    json_array_foreach(rs, i, pair)
    {
        if (!json_is_array(pair) || json_array_size(pair) != 2 ||
            !short_string(json_array_get(pair, 0)) || !json_is_string(json_array_get(pair, 1)) ||
            json_string_length(json_array_get(pair, 1)) > SSYNC_MAX_KEY_BYTES)
            return fail(e, "M_BAD_JSON", "'required_state' of %s must hold [type, state_key] pairs", what);
    }
    cfg->required_state = rs;
    return true;
}

/* A range [start, end]: non-negative, start <= end; the end lowered to the clamp. */
static bool parse_range(const json_t *v, int64_t out[2], perr *e)
{
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(json_array_get(v, 0)) ||
        !json_is_integer(json_array_get(v, 1)))
        return fail(e, "M_BAD_JSON", "%s", "a range must be a pair of integers");
    json_int_t a = json_integer_value(json_array_get(v, 0)), b = json_integer_value(json_array_get(v, 1));
    if (a < 0 || b < 0 || a > b)
        return fail(e, "M_INVALID_PARAM", "%s", "a range must be [start, end] with 0 <= start <= end");
    out[0] = a > SSYNC_CLAMP_RANGE_END ? SSYNC_CLAMP_RANGE_END : a;
    out[1] = b > SSYNC_CLAMP_RANGE_END ? SSYNC_CLAMP_RANGE_END : b;
    return true;
}

static bool parse_flag(const json_t *f, const char *key, int *out, perr *e)
{
    json_t *v = json_object_get(f, key);
    *out = -1;
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) return fail(e, "M_BAD_JSON", "'%s' must be true or false", key);
    *out = json_is_true(v);
    return true;
}

static bool parse_filters(const json_t *f, ssync_filters *out, perr *e)
{
    *out = (ssync_filters){-1, -1, -1, NULL, NULL, NULL, NULL, NULL};
    if (!f || json_is_null(f)) return true;
    if (!json_is_object(f)) return fail(e, "M_BAD_JSON", "%s", "'filters' must be an object");
    if (!parse_flag(f, "is_dm", &out->is_dm, e) || !parse_flag(f, "is_encrypted", &out->is_encrypted, e) ||
        !parse_flag(f, "is_invite", &out->is_invite, e))
        return false;
    if (out->is_invite < 0 && !parse_flag(f, "is_invited", &out->is_invite, e)) return false;
    static const char *const LISTS[] = {"room_types", "not_room_types", "spaces", "tags", "not_tags"};
    const json_t **slots[] = {&out->room_types, &out->not_room_types, &out->spaces, &out->tags,
                              &out->not_tags};
    for (size_t i = 0; i < sizeof(LISTS) / sizeof(LISTS[0]); i++) {
        json_t *v = json_object_get(f, LISTS[i]);
        if (!v || json_is_null(v)) continue;
        if (!string_list(v, SSYNC_MAX_FILTER_ITEMS, i < 2, LISTS[i], e)) return false;
        *slots[i] = v;
    }
    return true;
}

static bool parse_list(const char *name, const json_t *o, ssync_list *l, perr *e)
{
    if (!json_is_object(o)) return fail(e, "M_BAD_JSON", "list '%s' must be an object", name);
    if (strlen(name) > SSYNC_MAX_KEY_BYTES) return fail(e, "M_INVALID_PARAM", "%s", "a list name is too long");
    l->name = name;
    if (!parse_config(o, &l->cfg, name, e) || !parse_filters(json_object_get(o, "filters"), &l->f, e))
        return false;
    json_t *ranges = json_object_get(o, "ranges"), *range = json_object_get(o, "range");
    l->n_ranges = -1;
    if (range && !json_is_null(range)) {
        l->n_ranges = 1;
        return parse_range(range, l->ranges[0], e);
    }
    if (!ranges || json_is_null(ranges)) return true;
    if (!json_is_array(ranges)) return fail(e, "M_BAD_JSON", "'ranges' of %s must be a list", name);
    if (json_array_size(ranges) > SSYNC_MAX_RANGES)
        return fail(e, "M_INVALID_PARAM", "'ranges' of %s has too many entries", name);
    l->n_ranges = 0;
    size_t i;
    const json_t *r;
    json_array_foreach(ranges, i, r)
    {
        if (!parse_range(r, l->ranges[l->n_ranges++], e)) return false;
    }
    return true;
}

static bool parse_lists(atrium_req *r, const json_t *lists, ssync_request *q, perr *e)
{
    if (!lists || json_is_null(lists)) return true;
    if (!json_is_object(lists)) return fail(e, "M_BAD_JSON", "%s", "'lists' must be an object");
    if (json_object_size(lists) > SSYNC_MAX_LISTS) return fail(e, "M_INVALID_PARAM", "%s", "too many lists");
    q->lists = rt_arena_alloc(r->arena, sizeof(ssync_list) * (json_object_size(lists) + 1));
    if (!q->lists) return fail(e, "M_UNKNOWN", "%s", "out of memory");
    const char *name;
    const json_t *o;
    json_object_foreach((json_t *)lists, name, o)
    {
        if (!parse_list(name, o, &q->lists[q->n_lists++], e)) return false;
    }
    return true;
}

static bool parse_subs(atrium_req *r, const json_t *subs, ssync_request *q, perr *e)
{
    if (!subs || json_is_null(subs)) return true;
    if (!json_is_object(subs)) return fail(e, "M_BAD_JSON", "%s", "'room_subscriptions' must be an object");
    if (json_object_size(subs) > SSYNC_MAX_SUBSCRIPTIONS)
        return fail(e, "M_INVALID_PARAM", "%s", "too many room_subscriptions");
    q->subs = rt_arena_alloc(r->arena, sizeof(ssync_sub) * (json_object_size(subs) + 1));
    if (!q->subs) return fail(e, "M_UNKNOWN", "%s", "out of memory");
    const char *room;
    const json_t *o;
    json_object_foreach((json_t *)subs, room, o)
    {
        if (!json_is_object(o)) return fail(e, "M_BAD_JSON", "subscription '%s' must be an object", room);
        if (strlen(room) > SSYNC_MAX_KEY_BYTES) return fail(e, "M_INVALID_PARAM", "%s", "a room ID is too long");
        ssync_sub *s = &q->subs[q->n_subs++];
        s->room_id = room;
        if (!parse_config(o, &s->cfg, room, e)) return false;
    }
    return true;
}

/* An extension's object: NULL (not asked), or an object whose `enabled` is true. */
static const json_t *extension(const json_t *exts, const char *name, bool *enabled, perr *e)
{
    *enabled = false;
    json_t *o = json_object_get(exts, name);
    if (!o || json_is_null(o)) return NULL;
    if (!json_is_object(o)) {
        (void)fail(e, "M_BAD_JSON", "extension '%s' must be an object", name);
        return NULL;
    }
    json_t *en = json_object_get(o, "enabled");
    if (en && !json_is_boolean(en)) {
        (void)fail(e, "M_BAD_JSON", "'enabled' of extension '%s' must be true or false", name);
        return NULL;
    }
    *enabled = json_is_true(en);
    return o;
}

static bool parse_scope(const json_t *exts, const char *name, ssync_ext_scope *s, perr *e)
{
    *s = (ssync_ext_scope){0};
    const json_t *o = extension(exts, name, &s->enabled, e);
    if (e->code) return false;
    if (!o) return true;
    json_t *lists = json_object_get(o, "lists"), *rooms = json_object_get(o, "rooms");
    if (lists && !json_is_null(lists)) {
        if (!string_list(lists, SSYNC_MAX_EXT_NAMES, false, "lists", e)) return false;
        s->lists = lists;
    }
    if (rooms && !json_is_null(rooms)) {
        if (!string_list(rooms, SSYNC_MAX_EXT_NAMES, false, "rooms", e)) return false;
        s->rooms = rooms;
    }
    return true;
}

static bool parse_extensions(const json_t *exts, ssync_request *q, perr *e)
{
    if (!exts || json_is_null(exts)) return true;
    if (!json_is_object(exts)) return fail(e, "M_BAD_JSON", "%s", "'extensions' must be an object");
    const json_t *td = extension(exts, "to_device", &q->to_device, e);
    if (e->code) return false;
    json_t *since = json_object_get(td, "since");
    if (since && !json_is_null(since)) {
        if (!json_is_string(since)) return fail(e, "M_BAD_JSON", "%s", "'since' of to_device must be a string");
        q->to_device_since = json_string_value(since);
    }
    extension(exts, "e2ee", &q->e2ee, e);
    if (e->code) return false;
    return parse_scope(exts, "account_data", &q->account_data, e) &&
           parse_scope(exts, "receipts", &q->receipts, e) && parse_scope(exts, "typing", &q->typing, e);
}

/* pos and timeout of the query string. */
static bool parse_query(atrium_req *r, ssync_request *q, perr *e)
{
    q->pos = http_req_query(r, "pos");
    if (q->pos && !*q->pos) q->pos = NULL;
    const char *timeout = http_req_query(r, "timeout");
    q->timeout_ms = 0;
    if (timeout && *timeout) {
        int64_t t;
        int rc = atrium_parse_int64(timeout, 0, SSYNC_MAX_TIMEOUT_MS, &t); /* clamped */
        if (rc == ATRIUM_E_INVAL || (rc == ATRIUM_E_LIMIT && t != SSYNC_MAX_TIMEOUT_MS))
            return fail(e, "M_INVALID_PARAM", "%s", "'timeout' must be a non-negative integer");
        q->timeout_ms = t;
    }
    return true;
}

bool ssync_request_parse(atrium_req *r, ssync_request *q)
{
    *q = (ssync_request){.conn_id = ""};
    perr e = {0};
    json_t *body = http_req_json(r);
    if (!body) return false; /* answered */
    json_t *conn = json_object_get(body, "conn_id"), *txn = json_object_get(body, "txn_id");
    bool ok = parse_query(r, q, &e);
    if (ok && conn && !json_is_null(conn)) {
        if (!json_is_string(conn)) ok = fail(&e, "M_BAD_JSON", "%s", "'conn_id' must be a string");
        else if (json_string_length(conn) > SSYNC_MAX_CONN_ID_BYTES ||
                 strlen(json_string_value(conn)) != json_string_length(conn))
            ok = fail(&e, "M_INVALID_PARAM", "%s", "'conn_id' is too long");
        else q->conn_id = json_string_value(conn);
    }
    if (ok && txn && !json_is_null(txn)) {
        if (!json_is_string(txn)) ok = fail(&e, "M_BAD_JSON", "%s", "'txn_id' must be a string");
        else q->txn_id = txn;
    }
    ok = ok && parse_lists(r, json_object_get(body, "lists"), q, &e) &&
         parse_subs(r, json_object_get(body, "room_subscriptions"), q, &e) &&
         parse_extensions(json_object_get(body, "extensions"), q, &e);
    if (!ok) {
        int status = strcmp(e.code, "M_UNKNOWN") == 0 ? 500 : 400;
        http_respond_error(r, status, e.code, "%s", e.why);
    }
    return ok;
}
