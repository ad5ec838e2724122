/*
 * core/config/config.c - YAML text into the cfg_node tree, environment overrides, look-ups,
 * and the one error format that names a key and the place it was set.
 *
 * This file owns the reading half of the configuration: one tree per configuration,
 * every node tagged with its origin (file path or environment variable) and 1-based line, the
 * one error format, and the one environment rule ATRIUM__A__B=value -> a.b. It deliberately
 * knows no key names and judges no values: typed reads, unknown keys and the core's own keys
 * live in schema.c, and each plugin validates its own plugins.<name> subtree. YAML features
 * that a configuration does not need (anchors, aliases, complex keys, several documents) are
 * refused with a clear error rather than half-supported.
 *
 * Two readings this file gives the header: a YAML null (`key:`, `~`, `null`) is "absent"
 * (cfg_is_absent), and the root node of a tree has line 0, so a missing top-level key is
 * reported against the file as a whole.
 *
 * No global state: any thread may call any function on a tree it owns; a finished tree is
 * only read, so several threads may read it at once.
 */
#include "core/config/config.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

enum {
    CFG_MAX_DEPTH = 64,                  /* nesting levels in one file or one env value */
    CFG_MAX_FILE_BYTES = 4 * 1024 * 1024, /* a configuration file larger than this is refused */
    CFG_FILE_CHUNK_BYTES = 16 * 1024,    /* read granularity for cfg_load_file */
    CFG_MAX_ENV_SEGMENTS = 32,           /* keys in one ATRIUM__A__B... name */
    CFG_TEXT_BYTES = 512,                /* scratch for paths, places and messages */
};

#define CFG_ENV_PREFIX "ATRIUM__"
#define CFG_ENV_SEPARATOR "__"
#define CFG_NO_ORIGIN "(configuration)"

/* A tree's root is the first member of this, so the root pointer is the tree pointer. The
 * tree owns the origin strings its nodes point at. */
struct cfg_origin {
    struct cfg_origin *next;
    char name[];
};

struct cfg_tree {
    cfg_node root;
    struct cfg_origin *origins;
};

/* ---- nodes --------------------------------------------------------------------------- */

static cfg_node *node_new(cfg_kind kind, const char *origin, int line)
{
    cfg_node *n = calloc(1, sizeof *n);
    if (n != NULL) {
        n->kind = kind;
        n->origin = origin;
        n->line = line;
    }
    return n;
}

/* Frees n and everything below it; does not unlink n from its parent. */
static void node_free(cfg_node *n);

static void free_children(cfg_node *n)
{
    cfg_node *c = n->first_child;
    while (c != NULL) {
        cfg_node *next = c->next;
        node_free(c);
        c = next;
    }
    n->first_child = n->last_child = NULL;
}

static void node_free(cfg_node *n)
{
    if (n == NULL)
        return;
    free_children(n);
    free(n->key);
    free(n->value);
    free(n);
}

static void node_append(cfg_node *parent, cfg_node *child)
{
    child->parent = parent;
    child->next = NULL;
    if (parent->last_child != NULL)
        parent->last_child->next = child;
    else
        parent->first_child = child;
    parent->last_child = child;
}

/* Puts repl where old was among parent's children; old is unlinked, not freed. */
static void node_replace(cfg_node *parent, cfg_node *old, cfg_node *repl)
{
    cfg_node **link = &parent->first_child;
    while (*link != old) {
        assert(*link != NULL && "node_replace: old is a child of parent");
        link = &(*link)->next;
    }
    repl->parent = parent;
    repl->next = old->next;
    *link = repl;
    if (parent->last_child == old)
        parent->last_child = repl;
    old->next = NULL;
}

static cfg_node *map_find(const cfg_node *map, const char *key, size_t key_len)
{
    for (cfg_node *c = map->first_child; c != NULL; c = c->next)
        if (c->key != NULL && strlen(c->key) == key_len && memcmp(c->key, key, key_len) == 0)
            return c;
    return NULL;
}

bool cfg_is_absent(const cfg_node *n)
{
    return n == NULL || (n->kind == CFG_SCALAR && n->null_value);
}

const char *cfg_kind_name(const cfg_node *n)
{
    switch (n->kind) {
    case CFG_MAP: return "a map";
    case CFG_SEQ: return "a list";
    default: return n->null_value ? "an empty value" : "a single value";
    }
}

cfg_node *cfg_new_map(void)
{
    struct cfg_tree *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    t->root.kind = CFG_MAP;
    return &t->root;
}

void cfg_free(cfg_node *root)
{
    if (root == NULL)
        return;
    assert(root->parent == NULL && "cfg_free takes the root of a tree");
    struct cfg_tree *t = (struct cfg_tree *)root;
    free_children(root);
    struct cfg_origin *o = t->origins;
    while (o != NULL) {
        struct cfg_origin *next = o->next;
        free(o);
        o = next;
    }
    free(t);
}

/* The tree that `root` heads keeps one copy of each origin name for its nodes to point at. */
static const char *tree_intern(cfg_node *root, const char *name, size_t len)
{
    struct cfg_tree *t = (struct cfg_tree *)root;
    for (struct cfg_origin *o = t->origins; o != NULL; o = o->next)
        if (strlen(o->name) == len && memcmp(o->name, name, len) == 0)
            return o->name;
    struct cfg_origin *o = malloc(sizeof *o + len + 1);
    if (o == NULL)
        return NULL;
    memcpy(o->name, name, len);
    o->name[len] = '\0';
    o->next = t->origins;
    t->origins = o;
    return o->name;
}

/* ---- paths, places, errors ----------------------------------------------------------- */

static size_t path_put(const cfg_node *n, char *buf, size_t len, size_t pos)
{
    if (n == NULL || (n->parent == NULL && n->key == NULL))
        return pos; /* the root has no name */
    pos = path_put(n->parent, buf, len, pos);
    int w;
    char *at = pos < len ? buf + pos : NULL;
    size_t room = pos < len ? len - pos : 0;
    if (n->key != NULL) {
        w = snprintf(at, room, "%s%s", pos > 0 ? "." : "", n->key);
    } else {
        size_t index = 0;
        for (const cfg_node *s = n->parent ? n->parent->first_child : n; s != n; s = s->next)
            index++;
        w = snprintf(at, room, "[%zu]", index);
    }
    return pos + (w > 0 ? (size_t)w : 0);
}

const char *cfg_path(const cfg_node *n, char *buf, size_t len)
{
    if (len == 0)
        return buf;
    buf[0] = '\0';
    path_put(n, buf, len, 0);
    return buf;
}

static const char *format_where(const char *origin, int line, char *buf, size_t len)
{
    if (origin == NULL)
        origin = CFG_NO_ORIGIN;
    if (line > 0)
        snprintf(buf, len, "%s:%d", origin, line);
    else
        snprintf(buf, len, "%s", origin);
    return buf;
}

const char *cfg_where(const cfg_node *n, char *buf, size_t len)
{
    return format_where(n ? n->origin : NULL, n ? n->line : 0, buf, len);
}

/* "<where>: <path>: <message>", leaving out the path when it is empty (the root). */
static void error_at(char *err, size_t errlen, const char *where, const char *path,
                     const char *fmt, va_list ap)
{
    if (err == NULL || errlen == 0)
        return;
    char msg[CFG_TEXT_BYTES];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (path != NULL && path[0] != '\0')
        snprintf(err, errlen, "%s: %s: %s", where, path, msg);
    else
        snprintf(err, errlen, "%s: %s", where, msg);
}

int cfg_error(const cfg_node *n, char *err, size_t errlen, const char *fmt, ...)
{
    char where[CFG_TEXT_BYTES], path[CFG_TEXT_BYTES];
    va_list ap;
    va_start(ap, fmt);
    if (n == NULL && err != NULL && errlen > 0)
        vsnprintf(err, errlen, fmt, ap);
    else if (n != NULL)
        error_at(err, errlen, cfg_where(n, where, sizeof where),
                 cfg_path(n, path, sizeof path), fmt, ap);
    va_end(ap);
    return -1;
}

/* ---- YAML -> nodes --------------------------------------------------------------------- */

struct parser {
    const char *origin;   /* interned in the destination tree */
    bool with_lines;      /* false for env values: their nodes get line 0 */
    const char *top_key;  /* key for the document's top node (full dotted path for env) */
    cfg_node *top;        /* the document's top node, owner of everything parsed */
    cfg_node *stack[CFG_MAX_DEPTH];
    int depth;
    char *key;            /* a map key read, waiting for its value */
    int key_line;
    char *err;
    size_t errlen;
};

static int parser_line(const struct parser *p, yaml_mark_t mark)
{
    return p->with_lines ? (int)mark.line + 1 : 0;
}

/* An error at `line` about key `key` of container `at` (either may be NULL). */
static int __attribute__((format(printf, 5, 6)))
parse_error(struct parser *p, int line, const cfg_node *at, const char *key, const char *fmt,
            ...)
{
    char where[CFG_TEXT_BYTES], path[CFG_TEXT_BYTES];
    path[0] = '\0';
    if (at != NULL)
        cfg_path(at, path, sizeof path);
    else if (p->top_key != NULL)
        snprintf(path, sizeof path, "%s", p->top_key);
    if (key != NULL) {
        size_t used = strlen(path);
        snprintf(path + used, sizeof path - used, "%s%s", used ? "." : "", key);
    }
    va_list ap;
    va_start(ap, fmt);
    error_at(p->err, p->errlen, format_where(p->origin, line, where, sizeof where), path, fmt,
             ap);
    va_end(ap);
    return -1;
}

static bool is_null_text(const char *s, size_t len, yaml_scalar_style_t style)
{
    if (style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    return len == 0 || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 ||
           strcmp(s, "Null") == 0 || strcmp(s, "NULL") == 0;
}

/* Creates a node for the value now being read and hangs it where the parse stands: as the
 * document's top, as the pending key's value, or as the next list item. */
static cfg_node *parser_attach(struct parser *p, cfg_kind kind, int line)
{
    cfg_node *parent = p->depth > 0 ? p->stack[p->depth - 1] : NULL;
    cfg_node *n = node_new(kind, p->origin, line);
    if (n == NULL) {
        parse_error(p, line, parent, NULL, "out of memory");
        return NULL;
    }
    if (parent == NULL) {
        if (p->top_key != NULL && (n->key = strdup(p->top_key)) == NULL) {
            free(n);
            parse_error(p, line, NULL, NULL, "out of memory");
            return NULL;
        }
        p->top = n;
    } else if (parent->kind == CFG_MAP) {
        n->key = p->key;
        n->line = p->key_line; /* the `key: value` line, the one an operator looks for */
        p->key = NULL;
        node_append(parent, n);
    } else {
        node_append(parent, n);
    }
    return n;
}

static bool parser_wants_key(const struct parser *p)
{
    return p->depth > 0 && p->stack[p->depth - 1]->kind == CFG_MAP && p->key == NULL;
}

static int parser_scalar(struct parser *p, const yaml_event_t *ev)
{
    const char *text = (const char *)ev->data.scalar.value;
    size_t len = ev->data.scalar.length;
    int line = parser_line(p, ev->start_mark);
    cfg_node *parent = p->depth > 0 ? p->stack[p->depth - 1] : NULL;
    bool is_null = is_null_text(text, len, ev->data.scalar.style);

    if (ev->data.scalar.anchor != NULL)
        return parse_error(p, line, parent, p->key,
                           "anchors (&%s) are not supported; write the value out in full",
                           (const char *)ev->data.scalar.anchor);
    if (memchr(text, '\0', len) != NULL)
        return parse_error(p, line, parent, p->key, "contains a NUL character");
    if (parser_wants_key(p)) {
        if (is_null)
            return parse_error(p, line, parent, NULL, "a key must not be empty or null");
        const cfg_node *dup = map_find(parent, text, len);
        if (dup != NULL && p->with_lines)
            return parse_error(p, line, parent, text, "duplicate key (first set at line %d)",
                               dup->line);
        if (dup != NULL)
            return parse_error(p, line, parent, text, "duplicate key");
        if ((p->key = strndup(text, len)) == NULL)
            return parse_error(p, line, parent, NULL, "out of memory");
        p->key_line = line;
        return 0;
    }
    cfg_node *n = parser_attach(p, CFG_SCALAR, line);
    if (n == NULL)
        return -1;
    n->null_value = is_null;
    if ((n->value = strndup(is_null ? "" : text, is_null ? 0 : len)) == NULL)
        return parse_error(p, line, n, NULL, "out of memory");
    return 0;
}

static int parser_open(struct parser *p, const yaml_event_t *ev, cfg_kind kind)
{
    const yaml_char_t *anchor = kind == CFG_MAP ? ev->data.mapping_start.anchor
                                                : ev->data.sequence_start.anchor;
    int line = parser_line(p, ev->start_mark);
    cfg_node *parent = p->depth > 0 ? p->stack[p->depth - 1] : NULL;
    if (anchor != NULL)
        return parse_error(p, line, parent, p->key,
                           "anchors (&%s) are not supported; write the value out in full",
                           (const char *)anchor);
    if (parser_wants_key(p))
        return parse_error(p, line, parent, NULL, "a key must be a single value, not %s",
                           kind == CFG_MAP ? "a map" : "a list");
    if (p->depth == CFG_MAX_DEPTH)
        return parse_error(p, line, parent, p->key, "nested deeper than %d levels",
                           CFG_MAX_DEPTH);
    cfg_node *n = parser_attach(p, kind, line);
    if (n == NULL)
        return -1;
    p->stack[p->depth++] = n;
    return 0;
}

static int parser_syntax_error(struct parser *p, const yaml_parser_t *yp)
{
    if (yp->error == YAML_MEMORY_ERROR)
        return parse_error(p, 0, NULL, NULL, "out of memory while reading YAML");
    int line = p->with_lines ? (int)yp->problem_mark.line + 1 : 0;
    const char *problem = yp->problem ? yp->problem : "unreadable input";
    if (yp->context != NULL && p->with_lines)
        return parse_error(p, line, NULL, NULL, "YAML syntax error: %s (%s at line %zu)",
                           problem, yp->context, yp->context_mark.line + 1);
    if (yp->context != NULL)
        return parse_error(p, line, NULL, NULL, "YAML syntax error: %s (%s)", problem,
                           yp->context);
    return parse_error(p, line, NULL, NULL, "YAML syntax error: %s", problem);
}

/* Parses one YAML document into a detached node (NULL with err set). The top node carries
 * top_key and no parent; an empty document gives a null scalar. */
static cfg_node *parse_yaml(const char *text, size_t len, const char *origin, bool with_lines,
                            const char *top_key, char *err, size_t errlen)
{
    struct parser p = {.origin = origin, .with_lines = with_lines, .top_key = top_key,
                       .err = err, .errlen = errlen};
    yaml_parser_t yp;
    if (!yaml_parser_initialize(&yp)) {
        parse_error(&p, 0, NULL, NULL, "out of memory");
        return NULL;
    }
    yaml_parser_set_input_string(&yp, (const unsigned char *)text, len);
    int documents = 0, rc = 0;
    bool done = false;
    while (!done && rc == 0) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&yp, &ev)) {
            parser_syntax_error(&p, &yp);
            rc = -1;
            break;
        }
        switch (ev.type) {
        case YAML_DOCUMENT_START_EVENT:
            if (++documents > 1)
                rc = parse_error(&p, parser_line(&p, ev.start_mark), NULL, NULL,
                                 "a second YAML document (---) starts here; "
                                 "the configuration is one document");
            break;
        case YAML_ALIAS_EVENT:
            rc = parse_error(&p, parser_line(&p, ev.start_mark),
                             p.depth > 0 ? p.stack[p.depth - 1] : NULL, p.key,
                             "aliases (*%s) are not supported; write the value out in full",
                             (const char *)ev.data.alias.anchor);
            break;
        case YAML_SCALAR_EVENT: rc = parser_scalar(&p, &ev); break;
        case YAML_SEQUENCE_START_EVENT: rc = parser_open(&p, &ev, CFG_SEQ); break;
        case YAML_MAPPING_START_EVENT: rc = parser_open(&p, &ev, CFG_MAP); break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: p.depth--; break;
        case YAML_STREAM_END_EVENT: done = true; break;
        default: break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&yp);
    free(p.key);
    p.key = NULL;
    if (rc == 0 && p.top == NULL) {
        p.top = parser_attach(&p, CFG_SCALAR, with_lines ? 1 : 0);
        if (p.top != NULL && (p.top->value = strdup("")) != NULL)
            p.top->null_value = true;
        else
            rc = parse_error(&p, 0, NULL, NULL, "out of memory");
    }
    if (rc != 0) {
        node_free(p.top);
        return NULL;
    }
    return p.top;
}

/* ---- loading -------------------------------------------------------------------------- */

static cfg_node *load_text(const char *text, size_t len, const char *origin, char *err,
                           size_t errlen)
{
    cfg_node *root = cfg_new_map();
    const char *o = root ? tree_intern(root, origin, strlen(origin)) : NULL;
    if (o == NULL) {
        cfg_free(root);
        cfg_error(NULL, err, errlen, "%s: out of memory", origin);
        return NULL;
    }
    root->origin = o;
    cfg_node *top = parse_yaml(text, len, o, true, NULL, err, errlen);
    if (top == NULL) {
        cfg_free(root);
        return NULL;
    }
    if (top->kind != CFG_MAP && !cfg_is_absent(top)) {
        cfg_error(top, err, errlen, "the top level must be a map of `key: value` lines, not %s",
                  cfg_kind_name(top));
        node_free(top);
        cfg_free(root);
        return NULL;
    }
    /* Move the document's map into the tree's root; the root keeps line 0 (the whole file). */
    root->first_child = top->first_child;
    root->last_child = top->last_child;
    for (cfg_node *c = root->first_child; c != NULL; c = c->next)
        c->parent = root;
    top->first_child = top->last_child = NULL;
    node_free(top);
    return root;
}

cfg_node *cfg_load_string(const char *text, const char *origin, char *err, size_t errlen)
{
    if (origin == NULL)
        origin = "(string)";
    if (text == NULL) {
        cfg_error(NULL, err, errlen, "%s: no configuration text", origin);
        return NULL;
    }
    return load_text(text, strlen(text), origin, err, errlen);
}

cfg_node *cfg_load_file(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        cfg_error(NULL, err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    bool oom = false;
    for (;;) {
        if (cap - len < CFG_FILE_CHUNK_BYTES) {
            char *bigger = realloc(text, cap + CFG_FILE_CHUNK_BYTES);
            if ((oom = bigger == NULL))
                break;
            text = bigger;
            cap += CFG_FILE_CHUNK_BYTES;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0 || len > CFG_MAX_FILE_BYTES)
            break;
    }
    int read_errno = errno;
    bool failed = ferror(f) || oom;
    fclose(f);
    cfg_node *root = NULL;
    if (failed)
        cfg_error(NULL, err, errlen, "%s: cannot read: %s", path,
                  oom ? "out of memory" : strerror(read_errno));
    else if (len > CFG_MAX_FILE_BYTES)
        cfg_error(NULL, err, errlen, "%s: larger than %d bytes; is this a configuration file?",
                  path, CFG_MAX_FILE_BYTES);
    else
        root = load_text(text, len, path, err, errlen);
    free(text);
    return root;
}

/* ---- environment ----------------------------------------------------------------------- */

static size_t env_name_len(const char *entry)
{
    const char *eq = strchr(entry, '=');
    return eq ? (size_t)(eq - entry) : strlen(entry);
}

/* Sorted by name, so a result never depends on the order of environ. */
static int env_compare(const void *a, const void *b)
{
    const char *x = *(const char *const *)a, *y = *(const char *const *)b;
    size_t lx = env_name_len(x), ly = env_name_len(y);
    int c = memcmp(x, y, lx < ly ? lx : ly);
    return c != 0 ? c : (lx > ly) - (lx < ly);
}

/* "ATRIUM__SERVER__HTTP__PORT" -> "server.http.port" (malloc'd), or NULL with err set. */
static char *env_key_path(const char *name, char *err, size_t errlen)
{
    const char *s = name + strlen(CFG_ENV_PREFIX);
    char *dotted = malloc(strlen(s) + 1), *d = dotted;
    int segments = 1;
    if (dotted == NULL) {
        cfg_error(NULL, err, errlen, "%s: out of memory", name);
        return NULL;
    }
    for (; *s != '\0'; s++) {
        if (strncmp(s, CFG_ENV_SEPARATOR, strlen(CFG_ENV_SEPARATOR)) == 0) {
            *d++ = '.';
            s += strlen(CFG_ENV_SEPARATOR) - 1;
            segments++;
        } else if (isalnum((unsigned char)*s) || *s == '_') {
            *d++ = (char)tolower((unsigned char)*s);
        } else {
            cfg_error(NULL, err, errlen, "%s: a name may only hold letters, digits and '_'",
                      name);
            goto fail;
        }
    }
    *d = '\0';
    if (dotted[0] == '\0' || dotted[0] == '.' || d[-1] == '.' || strstr(dotted, "..")) {
        cfg_error(NULL, err, errlen, "%s: empty key segment (\"__\" separates keys; check for "
                  "a doubled or trailing underscore)", name);
        goto fail;
    }
    if (segments > CFG_MAX_ENV_SEGMENTS) {
        cfg_error(NULL, err, errlen, "%s: more than %d key segments", name,
                  CFG_MAX_ENV_SEGMENTS);
        goto fail;
    }
    return dotted;
fail:
    free(dotted);
    return NULL;
}

/* Applies one ATRIUM__A__B=value. On a bad name or value the tree is unchanged. */
static int env_apply_one(cfg_node *root, const char *entry, char *err, size_t errlen)
{
    size_t name_len = env_name_len(entry);
    const char *name = tree_intern(root, entry, name_len);
    if (name == NULL)
        return cfg_error(NULL, err, errlen, "%.*s: out of memory", (int)name_len, entry);
    char *dotted = env_key_path(name, err, errlen);
    if (dotted == NULL)
        return -1;
    /* Parsed with the whole dotted path as its key, so errors name the real key. */
    const char *text = entry + name_len + 1;
    cfg_node *value = parse_yaml(text, strlen(text), name, false, dotted, err, errlen);
    const char *leaf = strrchr(dotted, '.');
    char *leaf_key = value ? strdup(leaf ? leaf + 1 : dotted) : NULL;
    int rc = -1;
    if (value != NULL && leaf_key == NULL)
        cfg_error(NULL, err, errlen, "%s: out of memory", name);
    if (leaf_key == NULL)
        goto out;

    /* Walk down, making missing maps. A conflict can only come before the first change:
     * once a map is made or a null turned into one, everything below it is new. */
    cfg_node *cur = root;
    for (const char *seg = dotted, *dot; (dot = strchr(seg, '.')) != NULL; seg = dot + 1) {
        cfg_node *c = map_find(cur, seg, (size_t)(dot - seg));
        if (c != NULL && c->kind != CFG_MAP && !cfg_is_absent(c)) {
            char where[CFG_TEXT_BYTES], path[CFG_TEXT_BYTES];
            cfg_error(NULL, err, errlen, "%s: %s: cannot set this key: %s (set at %s) is %s, "
                      "not a map", name, dotted, cfg_path(c, path, sizeof path),
                      cfg_where(c, where, sizeof where), cfg_kind_name(c));
            goto out;
        }
        if (c == NULL) {
            if ((c = node_new(CFG_MAP, name, 0)) == NULL ||
                (c->key = strndup(seg, (size_t)(dot - seg))) == NULL) {
                free(c);
                cfg_error(NULL, err, errlen, "%s: out of memory", name);
                goto out;
            }
            node_append(cur, c);
        } else if (c->kind == CFG_SCALAR) { /* a null written as `key:` becomes the map */
            c->kind = CFG_MAP;
            c->null_value = false;
            free(c->value);
            c->value = NULL;
        }
        cur = c;
    }
    free(value->key);
    value->key = leaf_key;
    leaf_key = NULL;
    cfg_node *old = map_find(cur, value->key, strlen(value->key));
    if (old != NULL)
        node_replace(cur, old, value);
    else
        node_append(cur, value);
    node_free(old);
    value = NULL;
    rc = 0;
out:
    node_free(value);
    free(leaf_key);
    free(dotted);
    return rc;
}

int cfg_apply_env(cfg_node *root, char *const *envp, char *err, size_t errlen)
{
    if (root == NULL || root->parent != NULL || root->kind != CFG_MAP)
        return cfg_error(NULL, err, errlen, "environment: no configuration tree to apply to");
    if (envp == NULL)
        return 0;
    size_t n = 0;
    for (size_t i = 0; envp[i] != NULL; i++)
        if (strncmp(envp[i], CFG_ENV_PREFIX, strlen(CFG_ENV_PREFIX)) == 0)
            n++;
    if (n == 0)
        return 0;
    const char **vars = malloc(n * sizeof *vars);
    if (vars == NULL)
        return cfg_error(NULL, err, errlen, "environment: out of memory");
    n = 0;
    for (size_t i = 0; envp[i] != NULL; i++)
        if (strncmp(envp[i], CFG_ENV_PREFIX, strlen(CFG_ENV_PREFIX)) == 0 &&
            strchr(envp[i], '=') != NULL)
            vars[n++] = envp[i];
    qsort(vars, n, sizeof *vars, env_compare);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = env_apply_one(root, vars[i], err, errlen);
    free(vars);
    return rc;
}

/* ---- look-ups ----------------------------------------------------------------------- */

cfg_node *cfg_get(const cfg_node *n, const char *path)
{
    if (n == NULL || path == NULL)
        return NULL;
    const char *s = path;
    while (*s != '\0') {
        if (n->kind != CFG_MAP)
            return NULL;
        const char *dot = strchr(s, '.');
        size_t len = dot ? (size_t)(dot - s) : strlen(s);
        n = map_find(n, s, len);
        if (n == NULL)
            return NULL;
        s += dot ? len + 1 : len;
    }
    return (cfg_node *)n;
}
