/*
 * core/client/push/push_rules.c - push rules: the spec's server-default rule set (v1.11) for each
 * user, the user's own rules and changes to the defaults stored in PostgreSQL, and the
 * /pushrules endpoints.
 *
 * The rule this file owns is how a user's rule set is composed (compose_ruleset): per kind,
 * the user's rules (by position) come before the server defaults, except .m.rule.master,
 * which is always first of all. Changes to a default rule (enabled, actions) are stored
 * apart (push_rule_defaults), so the defaults themselves come from the code and a later
 * server version can add default rules for everyone. Every change is mirrored into the
 * user's global account data as m.push_rules with a stream position, so /sync carries it.
 * Reads never fail: matrix-js-sdk retries GET /pushrules/ forever before it syncs, so when
 * PostgreSQL cannot be read the defaults are served (and the failure logged).
 * What this file does not do: evaluate rules against events (push_eval.c does, for the
 * notification counts of /sync) or deliver pushes (no pushers yet).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/push/push_rules.h"
#include "core/client/sync/notifier.h"

#define PUSHRULES_MAX_PER_KIND 1000 /* user-defined rules of one kind */
#define USER_PLACEHOLDER "\x01user"
#define LOCALPART_PLACEHOLDER "\x01localpart"

static const char *const KINDS[] = {"override", "content", "room", "sender", "underride", NULL};

#define SOUND_DEFAULT "{\"set_tweak\":\"sound\",\"value\":\"default\"}"
#define HIGHLIGHT "{\"set_tweak\":\"highlight\"}"
#define MATCH(key, pattern) "{\"kind\":\"event_match\",\"key\":\"" key "\",\"pattern\":\"" pattern "\"}"
#define RULE(id, conditions, actions)                                                     \
    "{\"rule_id\":\"" id "\",\"default\":true,\"enabled\":true,\"conditions\":[" conditions \
    "],\"actions\":[" actions "]}"

/* The server-default rules of the spec (v1.11 "Predefined Rules"), in order. The two
 * placeholders become the user's ID and localpart (patch_placeholders). */
static const char DEFAULT_RULES[] =
    "{\"override\":["
    "{\"rule_id\":\".m.rule.master\",\"default\":true,\"enabled\":false,\"conditions\":[],"
    "\"actions\":[]},"
    RULE(".m.rule.suppress_notices", MATCH("content.msgtype", "m.notice"), "") ","
    RULE(".m.rule.invite_for_me",
         MATCH("type", "m.room.member") "," MATCH("content.membership", "invite") ","
         MATCH("state_key", "\\u0001user"),
         "\"notify\"," SOUND_DEFAULT) ","
    RULE(".m.rule.member_event", MATCH("type", "m.room.member"), "") ","
    RULE(".m.rule.is_user_mention",
         "{\"kind\":\"event_property_contains\",\"key\":\"content.m\\\\.mentions.user_ids\","
         "\"value\":\"\\u0001user\"}",
         "\"notify\"," SOUND_DEFAULT "," HIGHLIGHT) ","
    RULE(".m.rule.contains_display_name", "{\"kind\":\"contains_display_name\"}",
         "\"notify\"," SOUND_DEFAULT "," HIGHLIGHT) ","
    RULE(".m.rule.is_room_mention",
         "{\"kind\":\"event_property_is\",\"key\":\"content.m\\\\.mentions.room\",\"value\":true},"
         "{\"kind\":\"sender_notification_permission\",\"key\":\"room\"}",
         "\"notify\"," HIGHLIGHT) ","
    RULE(".m.rule.roomnotif",
         "{\"kind\":\"sender_notification_permission\",\"key\":\"room\"},"
         MATCH("content.body", "@room"),
         "\"notify\"," HIGHLIGHT) ","
    RULE(".m.rule.tombstone", MATCH("type", "m.room.tombstone") "," MATCH("state_key", ""),
         "\"notify\"," HIGHLIGHT) ","
    RULE(".m.rule.reaction", MATCH("type", "m.reaction"), "") ","
    RULE(".m.rule.room.server_acl", MATCH("type", "m.room.server_acl") "," MATCH("state_key", ""),
         "") ","
    RULE(".m.rule.suppress_edits",
         "{\"kind\":\"event_property_is\",\"key\":\"content.m\\\\.relates_to.rel_type\","
         "\"value\":\"m.replace\"}", "")
    "],\"content\":["
    "{\"rule_id\":\".m.rule.contains_user_name\",\"default\":true,\"enabled\":true,"
    "\"pattern\":\"\\u0001localpart\",\"actions\":[\"notify\"," SOUND_DEFAULT "," HIGHLIGHT "]}"
    "],\"room\":[],\"sender\":[],\"underride\":["
    RULE(".m.rule.call", MATCH("type", "m.call.invite"),
         "\"notify\",{\"set_tweak\":\"sound\",\"value\":\"ring\"}") ","
    RULE(".m.rule.encrypted_room_one_to_one",
         "{\"kind\":\"room_member_count\",\"is\":\"2\"}," MATCH("type", "m.room.encrypted"),
         "\"notify\"," SOUND_DEFAULT) ","
    RULE(".m.rule.room_one_to_one",
         "{\"kind\":\"room_member_count\",\"is\":\"2\"}," MATCH("type", "m.room.message"),
         "\"notify\"," SOUND_DEFAULT) ","
    RULE(".m.rule.message", MATCH("type", "m.room.message"), "\"notify\"") ","
    RULE(".m.rule.encrypted", MATCH("type", "m.room.encrypted"), "\"notify\"")
    "]}";

static bool kind_ok(const char *kind)
{
    for (size_t i = 0; KINDS[i]; i++)
        if (strcmp(KINDS[i], kind) == 0) return true;
    return false;
}

/* Replace the placeholders anywhere in v (strings only) with the user's values. */
static void patch_placeholders(json_t *v, const char *user_id, const char *localpart)
{
    if (json_is_object(v)) {
        const char *key;
        json_t *item;
        json_object_foreach(v, key, item) {
            if (json_is_string(item) && strcmp(json_string_value(item), USER_PLACEHOLDER) == 0)
                json_string_set(item, user_id);
            else if (json_is_string(item) &&
                     strcmp(json_string_value(item), LOCALPART_PLACEHOLDER) == 0)
                json_string_set(item, localpart);
            else
                patch_placeholders(item, user_id, localpart);
        }
    } else if (json_is_array(v)) {
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) patch_placeholders(item, user_id, localpart);
    }
}

/* DEFAULT_RULES parsed once (parsing it per rule set was half the server's CPU when one
 * message woke 1,000 members: the push sender composes each member's rule set, and each
 * woken /sync its user's; docs/performance.md, "The wake fan-out"; ADR-0037). Never
 * changed after parse_defaults: its rules are shared by every composed rule set, and a
 * rule that must differ for a user is a copy. Every value in it is immortal (jansson's
 * reference count (size_t)-1, which json_incref and json_decref leave alone), so no
 * thread ever writes a count of it: the inline json_incref of json_array_append reads a
 * count before changing it atomically, a data race ThreadSanitizer reported between
 * two woken syncs (tests/integration/test_wake_fanout.py runs under it). */
static json_t *g_defaults;
#define MAX_DEFAULTS_PER_KIND 32
/* [kind (KINDS, without its NULL)][position]: the rule holds a placeholder */
static bool g_names_user[sizeof(KINDS) / sizeof(*KINDS) - 1][MAX_DEFAULTS_PER_KIND];
static pthread_once_t g_defaults_once = PTHREAD_ONCE_INIT;

static bool holds_placeholder(const json_t *v)
{
    if (json_is_string(v)) return json_string_value(v)[0] == '\x01';
    const char *key;
    json_t *item;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach((json_t *)v, key, item) if (holds_placeholder(item)) return true;
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, item) if (holds_placeholder(item)) return true;
    }
    return false;
}

/* v and everything in it made immortal (never counted again, never freed). Before any
 * other thread sees v. */
static void make_immortal(json_t *v)
{
    const char *key;
    json_t *item;
    size_t i;
    if (json_is_object(v)) {
        json_object_foreach(v, key, item) make_immortal(item);
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, item) make_immortal(item);
    }
    if (v->refcount != (size_t)-1) v->refcount = (size_t)-1; /* true, false, null already are */
}

static void parse_defaults(void)
{
    json_error_t jerr;
    g_defaults = json_loads(DEFAULT_RULES, 0, &jerr);
    RT_ASSERT(g_defaults, "default push rules do not parse: %s at %d", jerr.text, jerr.position);
    make_immortal(g_defaults);
    for (size_t k = 0; KINDS[k]; k++) {
        const json_t *defs = json_object_get(g_defaults, KINDS[k]);
        RT_ASSERT(json_array_size(defs) <= MAX_DEFAULTS_PER_KIND, "too many default %s rules",
                  KINDS[k]);
        for (size_t i = 0; i < json_array_size(defs); i++)
            g_names_user[k][i] = holds_placeholder(json_array_get(defs, i));
    }
}

/* The defaults for one user: {override: [...], content: [...], ...}, new arrays of the
 * shared rules (g_defaults: not to be changed), those naming the user copied with the
 * placeholders replaced by the user's ID and localpart. NULL on OOM. */
static json_t *default_rules(const char *user)
{
    pthread_once(&g_defaults_once, parse_defaults);
    char lp[256];
    const char *colon = strchr(user, ':');
    size_t n = user[0] == '@' && colon ? (size_t)(colon - user - 1) : 0;
    if (n > 0 && n < sizeof(lp)) {
        memcpy(lp, user + 1, n);
        lp[n] = '\0';
    }
    const char *localpart = n > 0 && n < sizeof(lp) ? lp : user;
    json_t *out = json_object();
    for (size_t k = 0; out && KINDS[k]; k++) {
        const json_t *defs = json_object_get(g_defaults, KINDS[k]);
        json_t *arr = json_array();
        for (size_t i = 0; arr && i < json_array_size(defs); i++) {
            json_t *rule = json_array_get(defs, i), *mine;
            int rc;
            if (!g_names_user[k][i]) {
                /* Shared and immortal: appending it writes no count. */
                rc = json_array_append(arr, rule);
            } else if ((mine = json_deep_copy(rule))) {
                patch_placeholders(mine, user, localpart);
                rc = json_array_append_new(arr, mine);
            } else {
                rc = -1;
            }
            if (rc != 0) {
                json_decref(arr);
                arr = NULL;
            }
        }
        if (!arr || json_object_set_new(out, KINDS[k], arr) != 0) {
            json_decref(out);
            out = NULL;
        }
    }
    return out;
}

/* A stored user rule as the client sees it. */
static json_t *user_rule_json(PGresult *res, int row)
{
    const char *kind = PQgetvalue(res, row, 0);
    json_t *actions = json_loads(PQgetvalue(res, row, 4), 0, NULL);
    json_t *rule = json_pack("{s:s, s:b, s:b, s:o}", "rule_id", PQgetvalue(res, row, 1),
                             "default", 0, "enabled", PQgetvalue(res, row, 5)[0] == 't',
                             "actions", actions ? actions : json_array());
    if (!rule) return NULL;
    if ((strcmp(kind, "override") == 0 || strcmp(kind, "underride") == 0) &&
        !PQgetisnull(res, row, 2)) {
        json_t *conditions = json_loads(PQgetvalue(res, row, 2), 0, NULL);
        json_object_set_new(rule, "conditions", conditions ? conditions : json_array());
    }
    if (strcmp(kind, "content") == 0 && !PQgetisnull(res, row, 3))
        json_object_set_new(rule, "pattern", json_string(PQgetvalue(res, row, 3)));
    return rule;
}

/* Rows [first, end) of res: one user's part of a result (res NULL: none), its columns
 * from col on. */
typedef struct rows {
    PGresult *res;
    int first, end, col;
} rows;

/* The default rule at defs[at] with the user's stored changes applied: a copy when there
 * are any (the rule itself may be shared: default_rules). false on OOM. */
static bool apply_default_settings(json_t *defs, size_t at, rows set)
{
    json_t *rule = json_array_get(defs, at);
    const char *id = json_string_value(json_object_get(rule, "rule_id"));
    PGresult *settings = set.res;
    bool copied = false;
    for (int i = set.first; settings && i < set.end; i++) {
        if (strcmp(PQgetvalue(settings, i, set.col), id) != 0) continue;
        if (!copied) {
            json_t *copy = json_deep_copy(rule);
            if (!copy || json_array_set_new(defs, at, copy) != 0) return false;
            rule = copy;
            id = json_string_value(json_object_get(rule, "rule_id"));
            copied = true;
        }
        if (!PQgetisnull(settings, i, set.col + 1))
            json_object_set_new(rule, "enabled",
                                json_boolean(PQgetvalue(settings, i, set.col + 1)[0] == 't'));
        json_t *actions = PQgetisnull(settings, i, set.col + 2)
                              ? NULL
                              : json_loads(PQgetvalue(settings, i, set.col + 2), 0, NULL);
        if (actions) json_object_set_new(rule, "actions", actions);
    }
    return true;
}

/* The composition rule (see the file comment). user_rules and settings may be NULL (none,
 * or the database could not be read). Returns the global rule set, or NULL on OOM. */
static json_t *compose_ruleset(const char *user, rows user_rules, rows settings)
{
    json_t *defaults = default_rules(user);
    json_t *global = json_object();
    if (!defaults || !global) {
        json_decref(defaults);
        json_decref(global);
        return NULL;
    }
    for (size_t k = 0; KINDS[k]; k++) {
        const char *kind = KINDS[k];
        json_t *out = json_array(), *defs = json_object_get(defaults, kind);
        size_t i;
        for (i = 0; i < json_array_size(defs); i++)
            if (!apply_default_settings(defs, i, settings)) {
                json_decref(out);
                json_decref(defaults);
                json_decref(global);
                return NULL;
            }
        size_t first_default = 0;
        if (strcmp(kind, "override") == 0 && json_array_size(defs) > 0) {
            json_array_append(out, json_array_get(defs, 0)); /* .m.rule.master */
            first_default = 1;
        }
        for (int row = user_rules.first; user_rules.res && row < user_rules.end; row++)
            if (strcmp(PQgetvalue(user_rules.res, row, 0), kind) == 0)
                json_array_append_new(out, user_rule_json(user_rules.res, row));
        for (i = first_default; i < json_array_size(defs); i++)
            json_array_append(out, json_array_get(defs, i));
        json_object_set_new(global, kind, out);
    }
    json_decref(defaults);
    return global;
}

/* The user's stored rules and settings, in one statement (every woken sync with unread
 * events runs it): the user's rules first (columns 0-5, kind never NULL), then the
 * settings of default rules (columns 6-8). $1: the user. */
static const char RULESET_SQL[] = "SELECT kind, rule_id, conditions, pattern, actions, enabled,"
                                  " NULL, NULL::boolean, NULL, position FROM push_rules WHERE user_id = $1"
                                  " UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, NULL, rule_id,"
                                  " enabled, actions, NULL FROM push_rule_defaults WHERE user_id = $1"
                                  " ORDER BY 1 NULLS LAST, 10, 2";

/* The user's global rule set from RULESET_SQL's result res (NULL: it could not be read;
 * consumed): *db_ok false then, the defaults still there. NULL only on OOM. */
static json_t *ruleset_of(const char *user, PGresult *res, bool *db_ok)
{
    *db_ok = res != NULL;
    int n = res ? PQntuples(res) : 0, split = 0;
    while (split < n && !PQgetisnull(res, split, 0)) split++;
    json_t *global = compose_ruleset(user, (rows){res, 0, split, 0}, (rows){res, split, n, 6});
    PQclear(res);
    return global;
}

bool push_rules_send(PGconn *c, const char *user)
{
    return db_query_send(c, RULESET_SQL, 1, (const char *const[]){user});
}

json_t *push_rules_take(atrium_req *r, PGresult *res, bool *db_ok)
{
    json_t *global = ruleset_of(r->user, res, db_ok);
    if (!*db_ok)
        rt_log(ATRIUM_LOG_WARN, "core", "push rules of %s evaluated without stored changes "
               "(database unavailable)", r->user);
    return global;
}

json_t *push_rules_for(atrium_req *r, PGconn *c, bool *db_ok)
{
    return push_rules_take(r, c ? acc_q(c, RULESET_SQL, 1, (const char *const[]){r->user}) : NULL, db_ok);
}

/* ---- many users' rule sets at once (the push sender) ------------------------------- */

struct push_rules_batch {
    PGresult *rules, *settings; /* ordered by user_id, then as RULESET_SQL's */
    json_t *index;              /* user_id -> [rules first, end, settings first, end] */
};

/* A PostgreSQL text[] literal of column 0 of res, every element quoted. */
static char *users_literal(PGresult *res)
{
    size_t cap = 3;
    for (int i = 0; i < PQntuples(res); i++) cap += 2 * strlen(PQgetvalue(res, i, 0)) + 3;
    char *out = malloc(cap), *o = out;
    if (!out) return NULL;
    *o++ = '{';
    for (int i = 0; i < PQntuples(res); i++) {
        if (i) *o++ = ',';
        *o++ = '"';
        for (const char *v = PQgetvalue(res, i, 0); *v; v++) {
            if (*v == '"' || *v == '\\') *o++ = '\\';
            *o++ = *v;
        }
        *o++ = '"';
    }
    *o++ = '}';
    *o = '\0';
    return out;
}

/* Index the rows of res (user_id in column col, each user's rows together) into index at
 * slot 0 (rules) or 2 (settings) of each user's entry. */
static bool index_rows(json_t *index, PGresult *res, int col, int slot)
{
    for (int first = 0, n = PQntuples(res); first < n;) {
        const char *user = PQgetvalue(res, first, col);
        int end = first + 1;
        while (end < n && strcmp(PQgetvalue(res, end, col), user) == 0) end++;
        json_t *e = json_object_get(index, user);
        if (!e) {
            e = json_pack("[iiii]", 0, 0, 0, 0);
            if (!e || json_object_set_new(index, user, e) != 0) return false;
        }
        if (json_array_set_new(e, (size_t)slot, json_integer(first)) != 0 ||
            json_array_set_new(e, (size_t)slot + 1, json_integer(end)) != 0)
            return false;
        first = end;
    }
    return true;
}

push_rules_batch *push_rules_batch_read(PGconn *c, PGresult *who)
{
    push_rules_batch *b = calloc(1, sizeof(*b));
    char *users = users_literal(who);
    const char *p[1] = {users};
    if (b && users) {
        b->rules = acc_q(c, "SELECT kind, rule_id, conditions, pattern, actions, enabled, user_id"
                            " FROM push_rules WHERE user_id = ANY($1::text[])"
                            " ORDER BY user_id, kind, position, rule_id", 1, p);
        b->settings = b->rules ? acc_q(c, "SELECT rule_id, enabled, actions, user_id"
                                          " FROM push_rule_defaults WHERE user_id = ANY($1::text[])"
                                          " ORDER BY user_id", 1, p)
                               : NULL;
        b->index = json_object();
    }
    free(users);
    if (!b || !b->settings || !b->index || !index_rows(b->index, b->rules, 6, 0) ||
        !index_rows(b->index, b->settings, 3, 2)) {
        push_rules_batch_free(b);
        return NULL;
    }
    return b;
}

json_t *push_rules_batch_for(push_rules_batch *b, const char *user)
{
    json_t *e = json_object_get(b->index, user);
    int at[4] = {0, 0, 0, 0};
    for (size_t i = 0; e && i < 4; i++) at[i] = (int)json_integer_value(json_array_get(e, i));
    return compose_ruleset(user, (rows){b->rules, at[0], at[1], 0},
                           (rows){b->settings, at[2], at[3], 0});
}

void push_rules_batch_free(push_rules_batch *b)
{
    if (!b) return;
    PQclear(b->rules);
    PQclear(b->settings);
    json_decref(b->index);
    free(b);
}

/* The rule set for a read, degraded to the defaults when PostgreSQL is unavailable. */
static json_t *ruleset_for_read(atrium_req *r)
{
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    bool db_ok = false;
    json_t *global = ruleset_of(r->user, c ? acc_q(c, RULESET_SQL, 1, (const char *const[]){r->user}) : NULL, &db_ok);
    if (c) http_db_checkin(c);
    if (!db_ok)
        rt_log(ATRIUM_LOG_WARN, "core", "push rules of %s served without stored changes "
               "(database unavailable)", r->user);
    return global;
}

/* The rule kind/rule_id inside global, or NULL. */
static json_t *find_rule(json_t *global, const char *kind, const char *rule_id)
{
    size_t i;
    json_t *rule;
    json_array_foreach(json_object_get(global, kind), i, rule)
        if (strcmp(json_string_value(json_object_get(rule, "rule_id")), rule_id) == 0) return rule;
    return NULL;
}

/* The path rule of every /pushrules/{scope}/... endpoint: the scope is "global" (the only
 * one), the kind one of KINDS and the rule ID not empty, each a 400 otherwise (the spec's
 * answer for a malformed rule path; 404 is for a rule that does not exist). Parts the route
 * has no parameter for are not checked. false after answering. */
static bool rule_path_ok(atrium_req *r)
{
    const char *scope = http_req_param(r, "scope"), *kind = http_req_param(r, "kind");
    const char *rule_id = http_req_param(r, "ruleId");
    if (scope && strcmp(scope, "global") != 0) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown push rule scope (only global)");
        return false;
    }
    if (kind && !kind_ok(kind)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown rule kind");
        return false;
    }
    if (rule_id && !*rule_id) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "Missing rule ID");
        return false;
    }
    return true;
}

/* A rule path with an empty scope, kind or rule ID (…/pushrules//override/x,
 * …/global//x, …/global/override/ for writes): 400, as the spec lists. */
static int bad_rule_path(atrium_req *r)
{
    if (!auth_request(r)) return ATRIUM_DONE;
    return http_respond_error(r, 400, "M_INVALID_PARAM",
                              "A push rule path needs a scope, a kind and a rule ID");
}

/* …/{scope}/{kind}/{ruleId}/{attr} with an attribute other than enabled and actions (those
 * have routes of their own, which win): 400, as Synapse answers an attribute it does not
 * know, after the path's other parts are checked. */
static int bad_rule_attr(atrium_req *r)
{
    if (!auth_request(r) || !rule_path_ok(r)) return ATRIUM_DONE;
    return http_respond_error(r, 400, "M_INVALID_PARAM",
                              "Unknown push rule attribute (enabled or actions)");
}

/* GET /pushrules/, /pushrules: {global: {...}}; GET /pushrules/global/: the global set. */
static int get_all(atrium_req *r)
{
    if (!auth_request(r) || !rule_path_ok(r)) return ATRIUM_DONE;
    json_t *global = ruleset_for_read(r);
    if (!global) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    return http_respond_json(r, 200, json_pack("{s:o}", "global", global));
}

static int get_global(atrium_req *r)
{
    if (!auth_request(r) || !rule_path_ok(r)) return ATRIUM_DONE;
    json_t *global = ruleset_for_read(r);
    if (!global) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    return http_respond_json(r, 200, global);
}

/* GET /pushrules/global/{kind}/: the rules of one kind. */
static int get_kind(atrium_req *r)
{
    if (!auth_request(r) || !rule_path_ok(r)) return ATRIUM_DONE;
    const char *kind = http_req_param(r, "kind");
    if (!kind_ok(kind)) return http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown rule kind");
    json_t *global = ruleset_for_read(r);
    if (!global) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    json_t *list = json_incref(json_object_get(global, kind));
    json_decref(global);
    return http_respond_json(r, 200, list);
}

/* The rule a path names, for reads: answers 400/404 and returns NULL when there is none.
 * *global_out owns the returned rule. */
static json_t *rule_of_path(atrium_req *r, json_t **global_out)
{
    const char *kind = http_req_param(r, "kind"), *rule_id = http_req_param(r, "ruleId");
    *global_out = NULL;
    if (!kind_ok(kind)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown rule kind");
        return NULL;
    }
    json_t *global = ruleset_for_read(r);
    if (!global) {
        http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
        return NULL;
    }
    json_t *rule = find_rule(global, kind, rule_id);
    if (!rule) {
        json_decref(global);
        http_respond_error(r, 404, "M_NOT_FOUND", "No such push rule");
        return NULL;
    }
    *global_out = global;
    return rule;
}

/* GET /pushrules/global/{kind}/{ruleId}[/enabled|/actions] */
static int get_rule(atrium_req *r)
{
    if (!auth_request(r) || !rule_path_ok(r)) return ATRIUM_DONE;
    json_t *global;
    json_t *rule = rule_of_path(r, &global);
    if (!rule) return ATRIUM_DONE;
    json_incref(rule);
    json_decref(global);
    return http_respond_json(r, 200, rule);
}

static int get_rule_attr(atrium_req *r, const char *attr)
{
    if (!auth_request(r) || !rule_path_ok(r)) return ATRIUM_DONE;
    json_t *global;
    json_t *rule = rule_of_path(r, &global);
    if (!rule) return ATRIUM_DONE;
    json_t *body = json_pack("{s:O}", attr, json_object_get(rule, attr));
    json_decref(global);
    return http_respond_json(r, 200, body);
}

static int get_enabled(atrium_req *r) { return get_rule_attr(r, "enabled"); }
static int get_actions(atrium_req *r) { return get_rule_attr(r, "actions"); }

/* ---- writes --------------------------------------------------------------------------------- */

/* The action strings the spec defines ("dont_notify" and "coalesce" are deprecated no-ops,
 * still accepted from older clients). */
static bool action_name_ok(const char *a)
{
    return strcmp(a, "notify") == 0 || strcmp(a, "dont_notify") == 0 ||
           strcmp(a, "coalesce") == 0;
}

/* Validate actions: a list of known action strings or {set_tweak: string, value?}. */
static bool actions_ok(atrium_req *r, json_t *actions)
{
    if (!actions) {
        http_respond_error(r, 400, "M_MISSING_PARAM", "Missing 'actions'");
        return false;
    }
    bool ok = json_is_array(actions);
    size_t i;
    json_t *a;
    json_array_foreach(actions, i, a) {
        if (json_is_string(a) ? !action_name_ok(json_string_value(a))
                              : !(json_is_object(a) &&
                                  json_is_string(json_object_get(a, "set_tweak"))))
            ok = false;
    }
    if (!ok)
        http_respond_error(r, 400, "M_BAD_JSON", "'actions' must be a list of notify, "
                           "dont_notify, coalesce and {\"set_tweak\": ...} objects");
    return ok;
}

static bool conditions_ok(atrium_req *r, json_t *conditions)
{
    bool ok = json_is_array(conditions);
    size_t i;
    json_t *c;
    json_array_foreach(conditions, i, c) {
        if (!json_is_object(c) || !json_is_string(json_object_get(c, "kind"))) ok = false;
    }
    if (!ok)
        http_respond_error(r, 400, "M_BAD_JSON", "'conditions' must be a list of objects with "
                           "a 'kind'");
    return ok;
}

/* After a change, inside the transaction: mirror the rule set into account data. */
static bool mirror_to_account_data(atrium_req *r, PGconn *c)
{
    bool db_ok;
    json_t *global = ruleset_of(r->user, acc_q(c, RULESET_SQL, 1, (const char *const[]){r->user}), &db_ok);
    json_t *content = global ? json_pack("{s:o}", "global", global) : NULL;
    char *text = content ? json_dumps(content, JSON_COMPACT) : NULL;
    json_decref(content);
    bool ok = db_ok && text && acc_account_data_store(c, r->user, "", "m.push_rules", text);
    free(text);
    return ok;
}

/* Run the statements of one change and the mirror in a transaction; answer {} or 503. */
typedef bool (*change_fn)(atrium_req *r, PGconn *c, void *arg);

static int apply_change(atrium_req *r, change_fn fn, void *arg)
{
    PGconn *c = http_db_checkout(r);
    if (!c) return ATRIUM_DONE;
    bool ok = db_begin(c);
    ok = ok && fn(r, c, arg);
    if (ok && r->response) { /* fn answered (404 ...) */
        db_rollback(c);
        http_db_checkin(c);
        return ATRIUM_DONE;
    }
    ok = ok && mirror_to_account_data(r, c) && db_commit(c);
    if (!ok) db_rollback(c);
    http_db_checkin(c);
    if (!ok) return acc_db_failed(r);
    notifier_wake_user(r->user);
    return http_respond_json(r, 200, json_object());
}

typedef struct put_args {
    const char *kind, *rule_id, *before, *after, *pattern;
    char *conditions, *actions; /* JSON text, malloc'd */
} put_args;

/* Insert or update the rule and renumber the kind's positions. */
static bool put_rule_tx(atrium_req *r, PGconn *c, void *arg)
{
    put_args *a = arg;
    const char *p[2] = {r->user, a->kind};
    PGresult *res = acc_q(c, "SELECT rule_id FROM push_rules WHERE user_id = $1 AND kind = $2"
                             " ORDER BY position, rule_id FOR UPDATE", 2, p);
    if (!res) return false;
    int n = PQntuples(res), existing = -1, anchor = -1;
    const char *anchor_id = a->before ? a->before : a->after;
    for (int i = 0; i < n; i++) {
        if (strcmp(PQgetvalue(res, i, 0), a->rule_id) == 0) existing = i;
        if (anchor_id && strcmp(PQgetvalue(res, i, 0), anchor_id) == 0) anchor = i;
    }
    if (anchor_id && (anchor < 0 || anchor == existing)) {
        PQclear(res);
        http_respond_error(r, 404, "M_NOT_FOUND", "The rule named in before/after does not exist");
        return true;
    }
    if (existing < 0 && n >= PUSHRULES_MAX_PER_KIND) {
        PQclear(res);
        http_respond_error(r, 400, "M_LIMIT_EXCEEDED", "Too many push rules of this kind");
        return true;
    }
    /* The new order, as a list of IDs: remove the rule, insert it at its place. */
    const char **order = rt_arena_alloc(r->arena, (size_t)(n + 1) * sizeof(char *));
    if (!order) {
        PQclear(res);
        return false;
    }
    int m = 0, place = 0;
    for (int i = 0; i < n; i++) {
        if (i == existing) continue;
        if (anchor_id && i == anchor) place = a->before ? m : m + 1;
        order[m++] = rt_arena_strdup(r->arena, PQgetvalue(res, i, 0));
    }
    PQclear(res);
    if (!anchor_id) place = existing >= 0 ? existing : 0; /* new rules: highest priority */
    memmove(order + place + 1, order + place, (size_t)(m - place) * sizeof(char *));
    order[place] = a->rule_id;
    m++;
    const char *ins[6] = {r->user, a->kind, a->rule_id, a->conditions, a->pattern, a->actions};
    if (!db_exec(c, "INSERT INTO push_rules (user_id, kind, rule_id, position, conditions,"
                    " pattern, actions) VALUES ($1, $2, $3, 0, $4::jsonb, $5, $6::jsonb)"
                    " ON CONFLICT (user_id, kind, rule_id) DO UPDATE SET"
                    " conditions = EXCLUDED.conditions, pattern = EXCLUDED.pattern,"
                    " actions = EXCLUDED.actions",
                 6, ins))
        return false;
    for (int i = 0; i < m; i++) {
        char pos[16];
        snprintf(pos, sizeof(pos), "%d", i);
        const char *up[4] = {r->user, a->kind, order[i], pos};
        if (!db_exec(c, "UPDATE push_rules SET position = $4::integer"
                        " WHERE user_id = $1 AND kind = $2 AND rule_id = $3", 4, up))
            return false;
    }
    return true;
}

/* PUT /pushrules/global/{kind}/{ruleId} {actions, conditions?, pattern?} ?before= ?after= */
static int put_rule(atrium_req *r)
{
    if (!auth_request(r) || !rule_path_ok(r)) return ATRIUM_DONE;
    put_args a = {.kind = http_req_param(r, "kind"), .rule_id = http_req_param(r, "ruleId"),
                  .before = http_req_query(r, "before"), .after = http_req_query(r, "after")};
    if (!kind_ok(a.kind)) return http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown rule kind");
    if (a.rule_id[0] == '.')
        return http_respond_error(r, 400, "M_INVALID_PARAM",
                                  "Rule IDs starting with '.' belong to the server");
    if (strchr(a.rule_id, '/') || strchr(a.rule_id, '\\'))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Rule IDs may not hold / or \\");
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    json_t *actions = json_object_get(body, "actions");
    if (!actions_ok(r, actions)) return ATRIUM_DONE;
    bool with_conditions = strcmp(a.kind, "override") == 0 || strcmp(a.kind, "underride") == 0;
    json_t *conditions = json_object_get(body, "conditions");
    if (with_conditions && conditions && !conditions_ok(r, conditions)) return ATRIUM_DONE;
    if (strcmp(a.kind, "content") == 0 && !http_field_string(r, body, "pattern", true, 0, &a.pattern))
        return ATRIUM_DONE;
    json_t *empty = json_array();
    a.actions = json_dumps(actions, JSON_COMPACT | JSON_ENCODE_ANY);
    a.conditions = with_conditions
                       ? json_dumps(conditions ? conditions : empty, JSON_COMPACT | JSON_ENCODE_ANY)
                       : NULL;
    json_decref(empty);
    int rc = a.actions && (a.conditions || !with_conditions)
                 ? apply_change(r, put_rule_tx, &a)
                 : http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    free(a.actions);
    free(a.conditions);
    return rc;
}

static bool delete_rule_tx(atrium_req *r, PGconn *c, void *arg)
{
    (void)arg;
    const char *p[3] = {r->user, http_req_param(r, "kind"), http_req_param(r, "ruleId")};
    PGresult *res = acc_q(c, "DELETE FROM push_rules WHERE user_id = $1 AND kind = $2"
                             " AND rule_id = $3", 3, p);
    if (!res) return false;
    bool found = strcmp(PQcmdTuples(res), "0") != 0;
    PQclear(res);
    if (!found) http_respond_error(r, 404, "M_NOT_FOUND", "No such push rule");
    return true;
}

/* DELETE /pushrules/global/{kind}/{ruleId} */
static int delete_rule(atrium_req *r)
{
    if (!auth_request(r) || !rule_path_ok(r)) return ATRIUM_DONE;
    if (!kind_ok(http_req_param(r, "kind")))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown rule kind");
    if (http_req_param(r, "ruleId")[0] == '.')
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Server-default rules cannot be deleted");
    return apply_change(r, delete_rule_tx, NULL);
}

typedef struct attr_args {
    const char *column; /* enabled | actions */
    const char *value;  /* text for SQL: "t"/"f" or JSON */
} attr_args;

/* Set enabled/actions on a user rule or on the user's copy of a default rule. */
static bool set_attr_tx(atrium_req *r, PGconn *c, void *arg)
{
    attr_args *a = arg;
    const char *kind = http_req_param(r, "kind"), *rule_id = http_req_param(r, "ruleId");
    bool is_default = rule_id[0] == '.';
    if (is_default) {
        json_t *defaults = default_rules(r->user);
        bool exists = defaults && find_rule(defaults, kind, rule_id);
        json_decref(defaults);
        if (!exists) {
            http_respond_error(r, 404, "M_NOT_FOUND", "No such push rule");
            return true;
        }
        const char *p[3] = {r->user, rule_id, a->value};
        char *sql = rt_arena_printf(r->arena,
                                    "INSERT INTO push_rule_defaults (user_id, rule_id, %s)"
                                    " VALUES ($1, $2, $3) ON CONFLICT (user_id, rule_id)"
                                    " DO UPDATE SET %s = EXCLUDED.%s",
                                    a->column, a->column, a->column);
        return sql && db_exec(c, sql, 3, p);
    }
    const char *p[4] = {r->user, kind, rule_id, a->value};
    char *sql = rt_arena_printf(r->arena, "UPDATE push_rules SET %s = $4 WHERE user_id = $1"
                                          " AND kind = $2 AND rule_id = $3", a->column);
    PGresult *res = sql ? acc_q(c, sql, 4, p) : NULL;
    if (!res) return false;
    bool found = strcmp(PQcmdTuples(res), "0") != 0;
    PQclear(res);
    if (!found) http_respond_error(r, 404, "M_NOT_FOUND", "No such push rule");
    return true;
}

/* PUT /pushrules/global/{kind}/{ruleId}/enabled {enabled} */
static int put_enabled(atrium_req *r)
{
    if (!auth_request(r) || !rule_path_ok(r)) return ATRIUM_DONE;
    if (!kind_ok(http_req_param(r, "kind")))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown rule kind");
    json_t *body = http_req_json(r);
    if (!body) return ATRIUM_DONE;
    json_t *v = json_object_get(body, "enabled");
    if (!v) return http_respond_error(r, 400, "M_MISSING_PARAM", "Missing 'enabled'");
    if (!json_is_boolean(v))
        return http_respond_error(r, 400, "M_BAD_JSON", "'enabled' must be true or false");
    attr_args a = {"enabled", json_is_true(v) ? "t" : "f"};
    return apply_change(r, set_attr_tx, &a);
}

/* PUT /pushrules/global/{kind}/{ruleId}/actions {actions} */
static int put_actions(atrium_req *r)
{
    if (!auth_request(r) || !rule_path_ok(r)) return ATRIUM_DONE;
    if (!kind_ok(http_req_param(r, "kind")))
        return http_respond_error(r, 400, "M_INVALID_PARAM", "Unknown rule kind");
    json_t *body = http_req_json(r);
    if (!body || !actions_ok(r, json_object_get(body, "actions"))) return ATRIUM_DONE;
    char *text = json_dumps(json_object_get(body, "actions"), JSON_COMPACT);
    if (!text) return http_respond_error(r, 500, "M_UNKNOWN", "Out of memory");
    attr_args a = {"actions", text};
    int rc = apply_change(r, set_attr_tx, &a);
    free(text);
    return rc;
}

int push_rules_routes(http_server *s)
{
#define PR "/_matrix/client/v3/pushrules"
#define RULE_PATH PR "/{scope}/{kind}/{ruleId}"
    static const atrium_route routes[] = {
        HTTP_ROUTE("GET", PR, get_all, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", PR "/", get_all, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", PR "/{scope}", get_global, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", PR "/{scope}/", get_global, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", PR "/{scope}/{kind}", get_kind, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", PR "/{scope}/{kind}/", get_kind, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", RULE_PATH, get_rule, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("PUT", RULE_PATH, put_rule, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("DELETE", RULE_PATH, delete_rule, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", RULE_PATH "/enabled", get_enabled, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("PUT", RULE_PATH "/enabled", put_enabled, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", RULE_PATH "/actions", get_actions, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("PUT", RULE_PATH "/actions", put_actions, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", RULE_PATH "/{attr}", bad_rule_attr, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("PUT", RULE_PATH "/{attr}", bad_rule_attr, ACC_MAX_BODY_BYTES),
        /* Empty parts: a literal "" segment matches only an empty one. */
        HTTP_ROUTE("PUT", PR "//{kind}/{ruleId}", bad_rule_path, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("DELETE", PR "//{kind}/{ruleId}", bad_rule_path, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", PR "//{kind}/{ruleId}", bad_rule_path, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("PUT", PR "/{scope}//{ruleId}", bad_rule_path, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("DELETE", PR "/{scope}//{ruleId}", bad_rule_path, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("GET", PR "/{scope}//{ruleId}", bad_rule_path, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("PUT", PR "/{scope}/{kind}/", bad_rule_path, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("DELETE", PR "/{scope}/{kind}/", bad_rule_path, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("PUT", PR "/{scope}/{kind}", bad_rule_path, ACC_MAX_BODY_BYTES),
        HTTP_ROUTE("DELETE", PR "/{scope}/{kind}", bad_rule_path, ACC_MAX_BODY_BYTES),
    };
#undef RULE_PATH
#undef PR
    return HTTP_ROUTES_ADD(s, routes, "core");
}
