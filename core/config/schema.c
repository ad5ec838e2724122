/*
 * core/config/schema.c - checking a configuration tree against what is expected: the typed
 * reads and the unknown-key check (for the core and for plugins alike), and the engine of
 * settings tables: one row per key (struct cfg_setting) drives reading into a struct, the
 * unknown-key check of every map the rows reach, the commented YAML of --generate-config and
 * the Markdown tables of the READMEs.
 *
 * Because all four are driven by the same rows, a generated file always says what the loader
 * would do and the documentation cannot drift from either. A YAML null counts as absent: a
 * typed read gives its default and cfg_check_keys sees an empty map. This file knows no key
 * names: the core's rows are in settings.c, a plugin's come from its descriptor. It does not
 * parse YAML or read the environment (config.c built the tree and applied ATRIUM__* first),
 * and it does not decide how a setting is used. No global mutable state; any thread.
 */
#include "core/config/config.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "atrium/parse.h"

enum {
    SCHEMA_TEXT_BYTES = 512,          /* scratch for paths, places and lists */
    SCHEMA_QUOTE_BYTES = 64,          /* a bad value is quoted up to this many bytes */
    SCHEMA_SUGGEST_MAX_DISTANCE = 2,  /* edits at most for a "did you mean" */
    SCHEMA_SUGGEST_MAX_KEY_BYTES = 64, /* longer keys get no suggestion */
    /* Distinct keys one map of a table may declare, and the bytes of their names: a key
     * past either bound would be refused as unknown (the media plugin has about 60). */
    SCHEMA_MAX_KEYS_PER_MAP = 128,
    SCHEMA_KEY_NAMES_BYTES = 4096,
    SCHEMA_MAX_DEPTH = 8,             /* map levels in one setting's path */
    SCHEMA_WRAP_COLUMN = 92,          /* generated comments are wrapped before this */
};

/* ---- typed reads ---------------------------------------------------------------------- */

/* Decimal only: an optional sign and digits. 0, -1 for garbage, -2 for overflow. */
static int parse_decimal(const char *s, int64_t *out)
{
    int rc = atrium_parse_int64(s + (*s == '+' && s[1] != '-'), INT64_MIN, INT64_MAX, out);
    return rc == 0 ? 0 : rc == ATRIUM_E_LIMIT ? -2 : -1;
}

int cfg_read_int(const cfg_node *n, const char *path, int64_t def, int64_t min, int64_t max,
                 int64_t *out, char *err, size_t errlen)
{
    *out = def; /* defined on every path, even an error */
    const cfg_node *v = cfg_get(n, path);
    if (cfg_is_absent(v))
        return 0;
    if (v->kind != CFG_SCALAR)
        return cfg_error(v, err, errlen, "expected an integer in %" PRId64 "..%" PRId64
                         ", found %s", min, max, cfg_kind_name(v));
    int64_t x = 0;
    int rc = parse_decimal(v->value, &x);
    if (rc == -1)
        return cfg_error(v, err, errlen, "expected a decimal integer in %" PRId64 "..%" PRId64
                         ", got \"%.*s\"", min, max, SCHEMA_QUOTE_BYTES, v->value);
    if (rc == -2 || x < min || x > max)
        return cfg_error(v, err, errlen, "%.*s is out of range (allowed %" PRId64 "..%" PRId64
                         ")", SCHEMA_QUOTE_BYTES, v->value, min, max);
    *out = x;
    return 0;
}

int cfg_read_bool(const cfg_node *n, const char *path, bool def, bool *out, char *err,
                  size_t errlen)
{
    static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no", "off"};
    *out = def; /* defined on every path, even an error */
    const cfg_node *v = cfg_get(n, path);
    if (cfg_is_absent(v))
        return 0;
    for (size_t i = 0; v->kind == CFG_SCALAR && i < sizeof yes / sizeof *yes; i++) {
        if (strcasecmp(v->value, yes[i]) == 0 || strcasecmp(v->value, no[i]) == 0) {
            *out = strcasecmp(v->value, yes[i]) == 0;
            return 0;
        }
    }
    if (v->kind != CFG_SCALAR)
        return cfg_error(v, err, errlen, "expected true or false, found %s", cfg_kind_name(v));
    return cfg_error(v, err, errlen, "expected true or false (yes/no and on/off also work), "
                     "got \"%.*s\"", SCHEMA_QUOTE_BYTES, v->value);
}

int cfg_read_string(const cfg_node *n, const char *path, const char *def, const char **out,
                    char *err, size_t errlen)
{
    *out = def; /* defined on every path, even an error */
    const cfg_node *v = cfg_get(n, path);
    if (cfg_is_absent(v))
        return 0;
    if (v->kind != CFG_SCALAR)
        return cfg_error(v, err, errlen, "expected a single value (a string), found %s",
                         cfg_kind_name(v));
    *out = v->value;
    return 0;
}

int cfg_read_string_list(const cfg_node *n, const char *path, const char ***out,
                         size_t *n_out, char *err, size_t errlen)
{
    *out = NULL;
    *n_out = 0;
    const cfg_node *v = cfg_get(n, path);
    if (cfg_is_absent(v))
        return 0;
    if (v->kind == CFG_MAP)
        return cfg_error(v, err, errlen, "expected a list of strings, found a map");
    size_t count = 0;
    if (v->kind == CFG_SCALAR) {
        count = 1;
    } else {
        for (const cfg_node *c = v->first_child; c != NULL; c = c->next, count++)
            if (c->kind != CFG_SCALAR || c->null_value)
                return cfg_error(c, err, errlen, "expected a string, found %s", cfg_kind_name(c));
    }
    if (count == 0)
        return 0;
    const char **items = malloc(count * sizeof *items);
    if (items == NULL)
        return cfg_error(v, err, errlen, "out of memory");
    if (v->kind == CFG_SCALAR) {
        items[0] = v->value;
    } else {
        size_t i = 0;
        for (const cfg_node *c = v->first_child; c != NULL; c = c->next)
            items[i++] = c->value;
    }
    *out = items;
    *n_out = count;
    return 0;
}

/* ---- unknown keys ----------------------------------------------------------------------- */

/* Optimal string alignment distance (a swap of two neighbours is one edit), ignoring case;
 * INT_MAX for keys too long to be worth a suggestion. */
static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > SCHEMA_SUGGEST_MAX_KEY_BYTES || lb > SCHEMA_SUGGEST_MAX_KEY_BYTES)
        return INT_MAX;
    int d[SCHEMA_SUGGEST_MAX_KEY_BYTES + 1][SCHEMA_SUGGEST_MAX_KEY_BYTES + 1];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        for (size_t j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            int best = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[la][lb];
}

/* The allowed key an operator most likely meant: a near spelling, or the key with its unit
 * suffix left off ("shutdown_grace" for "shutdown_grace_ms"). NULL when none is close. */
static const char *nearest_key(const char *const *allowed, const char *key)
{
    const char *best = NULL;
    int best_d = SCHEMA_SUGGEST_MAX_DISTANCE + 1;
    size_t klen = strlen(key);
    for (size_t i = 0; allowed[i] != NULL; i++) {
        int d = edit_distance(key, allowed[i]);
        if (strncmp(allowed[i], key, klen) == 0 && allowed[i][klen] == '_')
            d = 1;
        if (d < best_d && (size_t)d < strlen(allowed[i])) {
            best = allowed[i];
            best_d = d;
        }
    }
    return best;
}

int cfg_check_keys(const cfg_node *n, const char *const *allowed, char *err, size_t errlen)
{
    if (cfg_is_absent(n))
        return 0;
    if (n->kind != CFG_MAP)
        return cfg_error(n, err, errlen, "expected a map of keys, found %s", cfg_kind_name(n));
    for (const cfg_node *c = n->first_child; c != NULL; c = c->next) {
        bool known = false;
        for (size_t i = 0; allowed[i] != NULL && !known; i++)
            known = strcmp(allowed[i], c->key) == 0;
        if (known)
            continue;
        const char *near = nearest_key(allowed, c->key);
        if (near != NULL)
            return cfg_error(c, err, errlen, "unknown key (did you mean %s?)", near);
        char list[SCHEMA_TEXT_BYTES];
        size_t pos = 0;
        list[0] = '\0';
        for (size_t i = 0; allowed[i] != NULL && pos < sizeof list; i++)
            pos += (size_t)snprintf(list + pos, sizeof list - pos, "%s%s", i ? ", " : "",
                                    allowed[i]);
        return cfg_error(c, err, errlen, "unknown key (allowed here: %s)",
                         allowed[0] ? list : "none");
    }
    return 0;
}

/* ---- settings tables: reading ------------------------------------------------------------ */

const struct cfg_setting *cfg_settings_find(const struct cfg_setting *rows, size_t n_rows,
                                            const char *path)
{
    for (size_t i = 0; i < n_rows; i++)
        if (strcmp(rows[i].path, path) == 0)
            return &rows[i];
    return NULL;
}

/* A required key that is absent: reported at the nearest map that exists, with the
 * environment variable that could also set it. */
static int missing_key(const cfg_node *root, const char *path, const char *hint, char *err,
                       size_t errlen)
{
    char parent[SCHEMA_TEXT_BYTES], where[SCHEMA_TEXT_BYTES], env[SCHEMA_TEXT_BYTES];
    const cfg_node *at = root;
    snprintf(parent, sizeof parent, "%s", path);
    for (char *dot = strrchr(parent, '.'); dot != NULL; dot = strrchr(parent, '.')) {
        *dot = '\0';
        if ((at = cfg_get(root, parent)) != NULL)
            break;
        at = root;
    }
    char full[SCHEMA_TEXT_BYTES];
    cfg_path(root, full, sizeof full); /* a table read below the top: plugins.media */
    size_t pos = (size_t)snprintf(env, sizeof env, "ATRIUM__");
    for (const char *c = full; *c != '\0' && pos + 2 < sizeof env; c++) {
        if (*c == '.') {
            env[pos++] = '_';
            env[pos++] = '_';
        } else {
            env[pos++] = (char)toupper((unsigned char)*c);
        }
    }
    if (full[0] != '\0' && pos + 2 < sizeof env) {
        env[pos++] = '_';
        env[pos++] = '_';
    }
    for (const char *c = path; *c != '\0' && pos + 2 < sizeof env; c++) {
        if (*c == '.') {
            env[pos++] = '_';
            env[pos++] = '_';
        } else {
            env[pos++] = (char)toupper((unsigned char)*c);
        }
    }
    env[pos] = '\0';
    return cfg_error(NULL, err, errlen, "%s: %s%s%s: required key is missing (%s; or set %s)",
                     cfg_where(at, where, sizeof where), full, full[0] ? "." : "", path, hint,
                     env);
}

static int read_string_row(const cfg_node *n, const struct cfg_setting *r, const char **out,
                           char *err, size_t errlen)
{
    if (cfg_read_string(n, r->path, (r->flags & CFG_F_REQUIRED) ? NULL : r->def_string, out,
                        err, errlen) < 0)
        return -1;
    if (*out == NULL && (r->flags & CFG_F_REQUIRED))
        return missing_key(n, r->path, r->help, err, errlen);
    if (*out == NULL)
        return 0; /* no default: NULL says "not given" */
    if ((*out)[0] != '\0')
        return 0;
    if (r->flags & CFG_F_REQUIRED)
        return cfg_error(cfg_get(n, r->path), err, errlen, "must not be empty (%s)", r->help);
    if (r->flags & CFG_F_NONEMPTY)
        return cfg_error(cfg_get(n, r->path), err, errlen, "must not be empty; leave the key "
                         "out for the default (%s)", r->def_string);
    return 0;
}

static int read_enum_row(const cfg_node *n, const struct cfg_setting *r, const char **out,
                         char *err, size_t errlen)
{
    const char *given;
    if (cfg_read_string(n, r->path, r->def_string, &given, err, errlen) < 0)
        return -1;
    for (size_t i = 0; r->values[i] != NULL; i++) {
        if (strcasecmp(given, r->values[i]) == 0) {
            *out = r->values[i];
            return 0;
        }
    }
    char list[SCHEMA_TEXT_BYTES];
    size_t pos = 0;
    list[0] = '\0';
    for (size_t i = 0; r->values[i] != NULL && pos < sizeof list; i++)
        pos += (size_t)snprintf(list + pos, sizeof list - pos, "%s%s", i ? ", " : "",
                                r->values[i]);
    return cfg_error(cfg_get(n, r->path), err, errlen, "\"%.*s\" is not a %s (allowed: %s)",
                     SCHEMA_QUOTE_BYTES, given, r->unit ? r->unit : "allowed value", list);
}

static int read_list_row(const cfg_node *n, const struct cfg_setting *r, const char ***out,
                         size_t *count, char *err, size_t errlen)
{
    if (!cfg_is_absent(cfg_get(n, r->path)) || r->values == NULL)
        return cfg_read_string_list(n, r->path, out, count, err, errlen);
    size_t k = 0;
    while (r->values[k] != NULL)
        k++;
    *out = NULL;
    *count = 0;
    if (k == 0)
        return 0;
    if ((*out = malloc(k * sizeof **out)) == NULL)
        return cfg_error(n, err, errlen, "out of memory");
    memcpy(*out, r->values, k * sizeof **out);
    *count = k;
    return 0;
}

static int read_row(const cfg_node *n, const struct cfg_setting *r, void *base, char *err,
                    size_t errlen)
{
    char *field = (char *)base + r->offset;
    if ((r->flags & CFG_F_KEEP) && cfg_is_absent(cfg_get(n, r->path)))
        return 0;
    int64_t v;
    bool b;
    switch (r->type) {
    case CFG_T_INT:
    case CFG_T_INT64:
        if (cfg_read_int(n, r->path, r->def, r->min, r->max, &v, err, errlen) < 0)
            return -1;
        if (r->type == CFG_T_INT)
            *(int *)(void *)field = (int)v; /* an int row's range fits an int (asserted) */
        else
            *(int64_t *)(void *)field = v;
        break;
    case CFG_T_BOOL:
        if (cfg_read_bool(n, r->path, r->def != 0, &b, err, errlen) < 0)
            return -1;
        *(bool *)(void *)field = b;
        break;
    case CFG_T_STRING:
        if (read_string_row(n, r, (const char **)(void *)field, err, errlen) < 0)
            return -1;
        break;
    case CFG_T_ENUM:
        if (read_enum_row(n, r, (const char **)(void *)field, err, errlen) < 0)
            return -1;
        break;
    case CFG_T_STRING_LIST:
        if (read_list_row(n, r, (const char ***)(void *)field,
                          (size_t *)(void *)((char *)base + r->count_offset), err, errlen) < 0)
            return -1;
        break;
    case CFG_T_TREE: {
        const cfg_node *t = cfg_get(n, r->path);
        bool want_map = r->def_string && r->def_string[0] == '{';
        if (cfg_is_absent(t))
            t = NULL;
        else if (t->kind != (want_map ? CFG_MAP : CFG_SEQ))
            return cfg_error(t, err, errlen, "expected %s, found %s", want_map ? "a map" : "a list",
                             cfg_kind_name(t));
        *(const cfg_node **)(void *)field = t;
        break;
    }
    }
    if (r->check != NULL && r->check(cfg_get(n, r->path), field, err, errlen) < 0)
        return -1;
    return 0;
}

int cfg_settings_read(const cfg_node *n, const struct cfg_setting *rows, size_t n_rows,
                      void *base, char *err, size_t errlen)
{
    for (size_t i = 0; i < n_rows; i++) {
        assert(rows[i].type != CFG_T_INT || (rows[i].min >= INT_MIN && rows[i].max <= INT_MAX));
        assert(rows[i].type != CFG_T_ENUM || rows[i].values != NULL);
        if (read_row(n, &rows[i], base, err, errlen) < 0)
            return -1;
    }
    return 0;
}

void cfg_settings_release(const struct cfg_setting *rows, size_t n_rows, void *base)
{
    for (size_t i = 0; i < n_rows; i++) {
        if (rows[i].type != CFG_T_STRING_LIST)
            continue;
        const char ***list = (const char ***)(void *)((char *)base + rows[i].offset);
        free(*list);
        *list = NULL;
        *(size_t *)(void *)((char *)base + rows[i].count_offset) = 0;
    }
}

/* ---- settings tables: unknown keys ------------------------------------------------------- */

/* The distinct keys of the map at `prefix` ("" for the top, else "server.http.") that the
 * rows declare, in row order, then `extra`; copied into buf, pointers in keys (NULL-ended). */
static void map_keys(const struct cfg_setting *rows, size_t n_rows, const char *prefix,
                     const char *const *extra, char *buf, size_t buflen, const char **keys)
{
    size_t n = 0, used = 0, plen = strlen(prefix);
    for (size_t i = 0; i < n_rows && n + 1 < SCHEMA_MAX_KEYS_PER_MAP; i++) {
        const char *p = rows[i].path;
        if (strncmp(p, prefix, plen) != 0)
            continue;
        const char *seg = p + plen, *dot = strchr(seg, '.');
        size_t len = dot ? (size_t)(dot - seg) : strlen(seg);
        bool seen = false;
        for (size_t k = 0; k < n && !seen; k++)
            seen = strlen(keys[k]) == len && strncmp(keys[k], seg, len) == 0;
        if (seen || used + len + 1 > buflen)
            continue;
        memcpy(buf + used, seg, len);
        buf[used + len] = '\0';
        keys[n++] = buf + used;
        used += len + 1;
    }
    for (size_t k = 0; extra != NULL && extra[k] != NULL && n + 1 < SCHEMA_MAX_KEYS_PER_MAP; k++)
        keys[n++] = extra[k];
    keys[n] = NULL;
}

static int check_map(const cfg_node *n, const struct cfg_setting *rows, size_t n_rows,
                     const char *prefix, const char *const *extra, int depth, char *err,
                     size_t errlen)
{
    char buf[SCHEMA_KEY_NAMES_BYTES];
    const char *keys[SCHEMA_MAX_KEYS_PER_MAP];
    map_keys(rows, n_rows, prefix, extra, buf, sizeof buf, keys);
    if (cfg_check_keys(n, keys, err, errlen) < 0)
        return -1;
    if (cfg_is_absent(n) || depth == SCHEMA_MAX_DEPTH)
        return 0;
    for (size_t k = 0; keys[k] != NULL; k++) {
        char below[SCHEMA_TEXT_BYTES];
        snprintf(below, sizeof below, "%s%s.", prefix, keys[k]);
        bool is_map = false;
        for (size_t i = 0; i < n_rows && !is_map; i++)
            is_map = strncmp(rows[i].path, below, strlen(below)) == 0;
        if (is_map && check_map(cfg_get(n, keys[k]), rows, n_rows, below, NULL, depth + 1, err,
                                errlen) < 0)
            return -1;
    }
    return 0;
}

int cfg_settings_check_keys(const cfg_node *n, const struct cfg_setting *rows, size_t n_rows,
                            const char *const *extra, char *err, size_t errlen)
{
    return check_map(n, rows, n_rows, "", extra, 0, err, errlen);
}

/* ---- settings tables: --generate-config ---------------------------------------------------- */

void cfg_yaml_quote(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* Comment lines at indent, wrapped at word boundaries before SCHEMA_WRAP_COLUMN. */
static void put_wrapped(FILE *f, int indent, const char *text)
{
    int width = SCHEMA_WRAP_COLUMN - indent - 2;
    while (*text != '\0') {
        int len = (int)strlen(text);
        if (len > width) {
            int cut = width;
            while (cut > 0 && text[cut] != ' ')
                cut--;
            len = cut > 0 ? cut : width;
        }
        fprintf(f, "%*s# %.*s\n", indent, "", len, text);
        text += len;
        while (*text == ' ')
            text++;
    }
}

/* The row's default as YAML. */
static void put_default(FILE *f, const struct cfg_setting *r)
{
    switch (r->type) {
    case CFG_T_INT:
    case CFG_T_INT64: fprintf(f, "%" PRId64, r->def); break;
    case CFG_T_BOOL: fputs(r->def ? "true" : "false", f); break;
    case CFG_T_ENUM: fputs(r->def_string, f); break;
    case CFG_T_STRING: cfg_yaml_quote(f, r->def_string ? r->def_string : ""); break;
    case CFG_T_STRING_LIST:
        fputc('[', f);
        for (size_t i = 0; r->values != NULL && r->values[i] != NULL; i++) {
            fputs(i ? ", " : "", f);
            cfg_yaml_quote(f, r->values[i]);
        }
        fputc(']', f);
        break;
    case CFG_T_TREE: fputs(r->def_string, f); break;
    }
}

/* What the row allows, in words ("1..256 ms", "true or false"), into buf. */
static const char *allowed_text(const struct cfg_setting *r, bool markdown, char *buf,
                                size_t len)
{
    const char *tick = markdown ? "`" : "";
    size_t pos = 0;
    buf[0] = '\0';
    switch (r->type) {
    case CFG_T_INT:
    case CFG_T_INT64:
        snprintf(buf, len, "%" PRId64 "..%" PRId64 "%s%s", r->min, r->max, r->unit ? " " : "",
                 r->unit ? r->unit : "");
        break;
    case CFG_T_BOOL: snprintf(buf, len, "true or false"); break;
    case CFG_T_STRING:
        snprintf(buf, len, "%s", (r->flags & (CFG_F_REQUIRED | CFG_F_NONEMPTY))
                                     ? "a non-empty string" : "a string");
        break;
    case CFG_T_STRING_LIST: snprintf(buf, len, "a list of strings"); break;
    case CFG_T_TREE:
        snprintf(buf, len, "%s", r->def_string[0] == '{' ? "a map" : "a list of maps");
        break;
    case CFG_T_ENUM:
        for (size_t i = 0; r->values[i] != NULL && pos < len; i++)
            pos += (size_t)snprintf(buf + pos, len - pos, "%s%s%s%s", i ? ", " : "", tick,
                                    r->values[i], tick);
        break;
    }
    return buf;
}

static const struct cfg_value *value_for(const struct cfg_value *values, size_t n,
                                         const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(values[i].path, path) == 0)
            return &values[i];
    return NULL;
}

static const char *section_for(const struct cfg_section *sections, size_t n, const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(sections[i].path, path) == 0)
            return sections[i].help;
    return NULL;
}

/* The number of map segments of `path` (its dots), and each map's length in ends[]. */
static int map_depth(const char *path, size_t *ends)
{
    int d = 0;
    for (const char *c = path; *c != '\0' && d < SCHEMA_MAX_DEPTH; c++)
        if (*c == '.')
            ends[d++] = (size_t)(c - path);
    return d;
}

static void write_row(FILE *f, int indent, const struct cfg_setting *r,
                      const struct cfg_value *v)
{
    char allowed[SCHEMA_TEXT_BYTES], text[SCHEMA_TEXT_BYTES * 2];
    const char *leaf = strrchr(r->path, '.');
    leaf = leaf ? leaf + 1 : r->path;
    snprintf(text, sizeof text, "%s Allowed: %s.", r->help,
             allowed_text(r, false, allowed, sizeof allowed));
    put_wrapped(f, indent, text);
    if (r->default_doc != NULL) {
        snprintf(text, sizeof text, "Default: %s.", r->default_doc);
        put_wrapped(f, indent, text);
    }
    if (v != NULL && v->note != NULL)
        put_wrapped(f, indent, v->note);
    if ((r->flags & CFG_F_KEEP) || (v != NULL && v->yaml == NULL)) {
        fprintf(f, "%*s# %s: ", indent, "", leaf);
        if (r->flags & CFG_F_KEEP)
            fprintf(f, "(%s)", r->default_doc ? r->default_doc : "computed at start");
        else
            put_default(f, r);
        fputc('\n', f);
        return;
    }
    fprintf(f, "%*s%s: ", indent, "", leaf);
    if (v != NULL)
        fputs(v->yaml, f);
    else
        put_default(f, r);
    fputc('\n', f);
}

void cfg_settings_write(FILE *f, int indent, const struct cfg_setting *rows, size_t n_rows,
                        const struct cfg_section *sections, size_t n_sections,
                        const struct cfg_value *values, size_t n_values)
{
    size_t prev_ends[SCHEMA_MAX_DEPTH];
    int prev_depth = 0;
    const char *prev = "";
    for (size_t i = 0; i < n_rows; i++) {
        const char *path = rows[i].path;
        size_t ends[SCHEMA_MAX_DEPTH];
        int depth = map_depth(path, ends), same = 0;
        while (same < depth && same < prev_depth && ends[same] == prev_ends[same] &&
               strncmp(path, prev, ends[same]) == 0)
            same++;
        for (int d = same; d < depth; d++) {
            char map[SCHEMA_TEXT_BYTES];
            snprintf(map, sizeof map, "%.*s", (int)ends[d], path);
            if (d == 0 && i > 0)
                fputc('\n', f);
            const char *help = section_for(sections, n_sections, map);
            if (help != NULL)
                put_wrapped(f, indent + 2 * d, help);
            const char *seg = d == 0 ? map : map + ends[d - 1] + 1;
            fprintf(f, "%*s%s:\n", indent + 2 * d, "", seg);
        }
        if (depth == 0 && prev_depth > 0)
            fputc('\n', f);
        write_row(f, indent + 2 * depth, &rows[i], value_for(values, n_values, path));
        memcpy(prev_ends, ends, sizeof ends);
        prev_depth = depth;
        prev = path;
    }
}

/* ---- settings tables: Markdown ------------------------------------------------------------ */

/* Text for a table cell: '|' escaped, newlines as spaces. */
static void put_cell(FILE *f, const char *s)
{
    for (; *s != '\0'; s++) {
        if (*s == '|')
            fputs("\\|", f);
        else
            fputc(*s == '\n' ? ' ' : *s, f);
    }
}

static void put_markdown_default(FILE *f, const struct cfg_setting *r)
{
    if (r->default_doc != NULL) {
        put_cell(f, r->default_doc);
        return;
    }
    if (r->flags & CFG_F_REQUIRED) {
        fputs("(required)", f);
        return;
    }
    switch (r->type) {
    case CFG_T_INT:
    case CFG_T_INT64: fprintf(f, "`%" PRId64 "`", r->def); break;
    case CFG_T_BOOL: fputs(r->def ? "`true`" : "`false`", f); break;
    case CFG_T_ENUM: fprintf(f, "`%s`", r->def_string); break;
    case CFG_T_STRING:
        if (r->def_string == NULL)
            fputs("(none)", f);
        else
            fprintf(f, "`\"%s\"`", r->def_string);
        break;
    case CFG_T_STRING_LIST:
        if (r->values == NULL || r->values[0] == NULL)
            fputs("`[]`", f);
        for (size_t i = 0; r->values != NULL && r->values[i] != NULL; i++)
            fprintf(f, "%s`%s`", i ? ", " : "", r->values[i]);
        break;
    case CFG_T_TREE: fprintf(f, "`%s`", r->def_string); break;
    }
}

void cfg_settings_print_markdown(FILE *f, const char *prefix, const struct cfg_setting *rows,
                                 size_t n_rows)
{
    char allowed[SCHEMA_TEXT_BYTES];
    fputs("| key | default | allowed | meaning |\n| --- | --- | --- | --- |\n", f);
    for (size_t i = 0; i < n_rows; i++) {
        fprintf(f, "| `%s%s` | ", prefix, rows[i].path);
        put_markdown_default(f, &rows[i]);
        fputs(" | ", f);
        put_cell(f, allowed_text(&rows[i], true, allowed, sizeof allowed));
        fputs(" | ", f);
        put_cell(f, rows[i].help);
        fputs(" |\n", f);
    }
}
