/*
 * core/client/appservice/as_registry.c - the registry of application services: every
 * registration file of app_service_config_files read and checked once at start-up, then
 * read without a lock by any thread (it never changes while the server runs).
 *
 * Decisions owned here:
 *   - A registration file is read with the configuration's own YAML reader
 *     (core/config/config.h), so an error is one line naming the file, the line and the
 *     key, the same shape as any configuration error. Keys this server does not read
 *     (bridges write their own, such as push_ephemeral or org.matrix.msc3202) are ignored,
 *     as Synapse ignores them.
 *   - Namespaces are POSIX extended regular expressions (regcomp, REG_EXTENDED), compiled
 *     as "^(<regex>)": anchored at the start only, the way Python's re.match (Synapse's)
 *     reads a registration, so "@irc_.*" and "@_discord_[0-9]+" both match whole user IDs.
 *     Perl classes (\d, \w, (?:...)) are not POSIX: "\d" is refused or read as "d".
 *   - Two services may not share an id, an as_token or an hs_token: the second file is
 *     refused, so a token always names one service.
 */
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/accounts/accounts.h"
#include "core/client/appservice/appservice.h"
#include "core/client/auth/auth.h"

#define AS_REGEX_MAX_BYTES 1024 /* one namespace's regex */

static struct {
    as_service *services;
    cfg_node **trees; /* each file's tree, which the services' strings point into */
    size_t n;
} R;

/* The child of map n under key (which may hold dots: de.sorunome.msc2409.push_ephemeral),
 * or NULL. */
static const cfg_node *child(const cfg_node *n, const char *key)
{
    if (!n || n->kind != CFG_MAP) return NULL;
    for (const cfg_node *c = n->first_child; c; c = c->next)
        if (c->key && strcmp(c->key, key) == 0) return c;
    return NULL;
}

/* A required non-empty string under key; NULL after writing err. */
static const char *required_string(const cfg_node *root, const char *key, char *err,
                                   size_t errlen)
{
    const cfg_node *n = child(root, key);
    if (!n || cfg_is_absent(n)) {
        cfg_error(root, err, errlen, "%s is missing", key);
        return NULL;
    }
    if (n->kind != CFG_SCALAR || !n->value[0]) {
        cfg_error(n, err, errlen, "expected a non-empty string, found %s", cfg_kind_name(n));
        return NULL;
    }
    return n->value;
}

/* A boolean under key (a dotted key allowed), def when absent. -1 after writing err. */
static int bool_key(const cfg_node *root, const char *key, bool def, bool *out, char *err,
                    size_t errlen)
{
    const cfg_node *n = child(root, key);
    *out = def;
    if (!n || cfg_is_absent(n)) return 0;
    if (n->kind == CFG_SCALAR && strcmp(n->value, "true") == 0) *out = true;
    else if (n->kind == CFG_SCALAR && strcmp(n->value, "false") == 0) *out = false;
    else return cfg_error(n, err, errlen, "expected true or false");
    return 0;
}

/* One namespace list (namespaces.<kind>): a list of {regex, exclusive}. */
static int read_namespaces(const cfg_node *ns, const char *kind, as_namespace **out,
                           size_t *n_out, char *err, size_t errlen)
{
    const cfg_node *list = child(ns, kind);
    *out = NULL;
    *n_out = 0;
    if (!list || cfg_is_absent(list)) return 0;
    if (list->kind != CFG_SEQ)
        return cfg_error(list, err, errlen, "expected a list of {regex, exclusive}");
    size_t count = 0;
    for (const cfg_node *c = list->first_child; c; c = c->next) count++;
    *out = calloc(count ? count : 1, sizeof(**out));
    if (!*out) return cfg_error(list, err, errlen, "out of memory");
    for (const cfg_node *c = list->first_child; c; c = c->next) {
        const cfg_node *re = child(c, "regex");
        if (c->kind != CFG_MAP)
            return cfg_error(c, err, errlen, "expected a map {regex, exclusive}");
        if (!re || re->kind != CFG_SCALAR || !re->value[0])
            return cfg_error(re ? re : c, err, errlen, "regex: expected a non-empty string");
        as_namespace *a = &(*out)[*n_out];
        if (bool_key(c, "exclusive", false, &a->exclusive, err, errlen) < 0) return -1;
        a->regex = re->value;
        char anchored[AS_REGEX_MAX_BYTES + 8];
        if (strlen(re->value) > AS_REGEX_MAX_BYTES)
            return cfg_error(re, err, errlen, "longer than %d bytes", AS_REGEX_MAX_BYTES);
        snprintf(anchored, sizeof(anchored), "^(%s)", re->value);
        int rc = regcomp(&a->re, anchored, REG_EXTENDED | REG_NOSUB);
        if (rc != 0) {
            char why[160];
            regerror(rc, &a->re, why, sizeof(why));
            return cfg_error(re, err, errlen, "\"%.80s\" is not a POSIX extended regular "
                             "expression: %s", re->value, why);
        }
        (*n_out)++;
    }
    return 0;
}

/* url: an http(s) URL or null. */
static int read_url(const cfg_node *root, const char **out, char *err, size_t errlen)
{
    const cfg_node *n = child(root, "url");
    *out = NULL;
    if (!n || cfg_is_absent(n)) return 0;
    if (n->kind != CFG_SCALAR ||
        (strncmp(n->value, "http://", 7) != 0 && strncmp(n->value, "https://", 8) != 0))
        return cfg_error(n, err, errlen, "expected an http:// or https:// URL, or null");
    *out = n->value;
    return 0;
}

/* protocols: a list of strings (absent or null: none). */
static int read_protocols(const cfg_node *root, as_service *s, char *err, size_t errlen)
{
    const cfg_node *n = child(root, "protocols");
    if (!n || cfg_is_absent(n)) return 0;
    if (n->kind != CFG_SEQ) return cfg_error(n, err, errlen, "expected a list of strings");
    size_t count = 0;
    for (const cfg_node *c = n->first_child; c; c = c->next) count++;
    s->protocols = calloc(count ? count : 1, sizeof(*s->protocols));
    if (!s->protocols) return cfg_error(n, err, errlen, "out of memory");
    for (const cfg_node *c = n->first_child; c; c = c->next) {
        if (c->kind != CFG_SCALAR || !c->value[0])
            return cfg_error(c, err, errlen, "expected a non-empty string");
        s->protocols[s->n_protocols++] = c->value;
    }
    return 0;
}

/* Read one file's tree into s. 0 or -1 with err. */
static int read_service(const struct core_config *cfg, const cfg_node *root, as_service *s,
                        char *err, size_t errlen)
{
    if (root->kind != CFG_MAP)
        return cfg_error(root, err, errlen, "a registration is a map (id, url, as_token, ...)");
    if (!(s->id = required_string(root, "id", err, errlen)) ||
        !(s->as_token = required_string(root, "as_token", err, errlen)) ||
        !(s->hs_token = required_string(root, "hs_token", err, errlen)))
        return -1;
    if (strlen(s->id) >= AS_ID_MAX_BYTES)
        return cfg_error(child(root, "id"), err, errlen, "longer than %d bytes",
                         AS_ID_MAX_BYTES - 1);
    const char *lp = required_string(root, "sender_localpart", err, errlen);
    if (!lp) return -1;
    if (!acc_localpart_ok(cfg, lp))
        return cfg_error(child(root, "sender_localpart"), err, errlen, "a localpart holds only "
                         "a-z, 0-9 and . _ = - / +");
    size_t len = strlen(lp) + strlen(cfg->server_name) + 3;
    if (!(s->sender = malloc(len))) return cfg_error(root, err, errlen, "out of memory");
    snprintf(s->sender, len, "@%s:%s", lp, cfg->server_name);
    const cfg_node *ns = child(root, "namespaces");
    if (ns && !cfg_is_absent(ns) && ns->kind != CFG_MAP)
        return cfg_error(ns, err, errlen, "expected a map of users, aliases and rooms");
    bool eph, eph_unstable;
    if (read_url(root, &s->url, err, errlen) < 0 ||
        read_namespaces(ns, "users", &s->users, &s->n_users, err, errlen) < 0 ||
        read_namespaces(ns, "aliases", &s->aliases, &s->n_aliases, err, errlen) < 0 ||
        read_namespaces(ns, "rooms", &s->rooms, &s->n_rooms, err, errlen) < 0 ||
        read_protocols(root, s, err, errlen) < 0 ||
        bool_key(root, "rate_limited", true, &s->rate_limited, err, errlen) < 0 ||
        bool_key(root, "receive_ephemeral", false, &eph, err, errlen) < 0 ||
        bool_key(root, "de.sorunome.msc2409.push_ephemeral", false, &eph_unstable, err,
                 errlen) < 0)
        return -1;
    s->receive_ephemeral = eph || eph_unstable;
    return 0;
}

/* The second service to use an id or a token is refused. */
static int check_unique(const cfg_node *root, size_t i, char *err, size_t errlen)
{
    const as_service *s = &R.services[i];
    for (size_t j = 0; j < i; j++) {
        const as_service *o = &R.services[j];
        if (strcmp(o->id, s->id) == 0)
            return cfg_error(child(root, "id"), err, errlen, "the id \"%s\" is already the "
                             "id of another application service", s->id);
        if (strcmp(o->as_token, s->as_token) == 0 || strcmp(o->hs_token, s->as_token) == 0)
            return cfg_error(child(root, "as_token"), err, errlen, "another application "
                             "service (%s) already uses this token", o->id);
        if (strcmp(o->hs_token, s->hs_token) == 0 || strcmp(o->as_token, s->hs_token) == 0)
            return cfg_error(child(root, "hs_token"), err, errlen, "another application "
                             "service (%s) already uses this token", o->id);
    }
    if (strcmp(s->as_token, s->hs_token) == 0)
        return cfg_error(child(root, "hs_token"), err, errlen, "must differ from as_token");
    return 0;
}

int as_registry_load(const struct core_config *cfg, char *err, size_t errlen)
{
    size_t n = cfg->n_app_service_config_files;
    if (n == 0) return 0;
    R.services = calloc(n, sizeof(*R.services));
    R.trees = calloc(n, sizeof(*R.trees));
    if (!R.services || !R.trees) {
        snprintf(err, errlen, "app_service_config_files: out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const char *path = cfg->app_service_config_files[i];
        char why[512];
        R.trees[i] = cfg_load_file(path, why, sizeof(why));
        if (!R.trees[i]) {
            snprintf(err, errlen, "app_service_config_files: %s", why);
            return -1;
        }
        R.n = i + 1;
        if (read_service(cfg, R.trees[i], &R.services[i], err, errlen) < 0 ||
            check_unique(R.trees[i], i, err, errlen) < 0)
            return -1;
    }
    return 0;
}

static void free_namespaces(as_namespace *ns, size_t n)
{
    for (size_t i = 0; i < n; i++) regfree(&ns[i].re);
    free(ns);
}

void as_registry_free(void)
{
    for (size_t i = 0; i < R.n; i++) {
        as_service *s = &R.services[i];
        /* A namespace list that failed half-way has regfree'd nothing it did not compile:
         * its count only grows after a successful regcomp. */
        free_namespaces(s->users, s->n_users);
        free_namespaces(s->aliases, s->n_aliases);
        free_namespaces(s->rooms, s->n_rooms);
        free(s->protocols);
        free(s->sender);
        cfg_free(R.trees[i]);
    }
    free(R.services);
    free(R.trees);
    memset(&R, 0, sizeof(R));
}

size_t as_count(void) { return R.n; }

const as_service *as_at(size_t i) { return i < R.n ? &R.services[i] : NULL; }

const as_service *as_by_id(const char *id)
{
    for (size_t i = 0; id && i < R.n; i++)
        if (strcmp(R.services[i].id, id) == 0) return &R.services[i];
    return NULL;
}

const as_service *as_by_token(const char *token)
{
    if (!token) return NULL;
    size_t len = strlen(token);
    for (size_t i = 0; i < R.n; i++) {
        const char *t = R.services[i].as_token;
        if (strlen(t) == len && sodium_memcmp(t, token, len) == 0) return &R.services[i];
    }
    return NULL;
}

const as_service *as_of_request(atrium_req *r)
{
    return R.n ? as_by_token(auth_token_of(r)) : NULL;
}

static bool matches(const as_namespace *ns, size_t n, const char *s, bool exclusive_only)
{
    for (size_t i = 0; s && i < n; i++)
        if ((!exclusive_only || ns[i].exclusive) && regexec(&ns[i].re, s, 0, NULL, 0) == 0)
            return true;
    return false;
}

bool as_user_in(const as_service *s, const char *user_id)
{
    return user_id && (strcmp(user_id, s->sender) == 0 ||
                       matches(s->users, s->n_users, user_id, false));
}

bool as_alias_in(const as_service *s, const char *alias)
{
    return matches(s->aliases, s->n_aliases, alias, false);
}

bool as_room_in(const as_service *s, const char *room_id)
{
    return matches(s->rooms, s->n_rooms, room_id, false);
}

bool as_user_exclusive_elsewhere(const char *user_id, const as_service *except)
{
    for (size_t i = 0; i < R.n; i++) {
        const as_service *s = &R.services[i];
        if (s == except) continue;
        if (matches(s->users, s->n_users, user_id, true) || strcmp(user_id, s->sender) == 0)
            return true;
    }
    return false;
}

bool as_alias_exclusive_elsewhere(const char *alias, const as_service *except)
{
    for (size_t i = 0; i < R.n; i++)
        if (&R.services[i] != except &&
            matches(R.services[i].aliases, R.services[i].n_aliases, alias, true))
            return true;
    return false;
}
