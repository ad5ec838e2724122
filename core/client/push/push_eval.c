/*
 * core/client/push/push_eval.c - the push rule evaluator: one composed rule set, one event, one
 * verdict (notify, highlight), following the spec's v1.11 rules for rule order, the
 * condition kinds and the actions.
 *
 * Decisions owned here:
 *   - Glob matching (event_match, content rules, the display name): '*' any run of
 *     characters, '?' exactly one character (a UTF-8 code point), case-insensitive (ASCII,
 *     Latin-1, Latin Extended-A, Greek and Cyrillic letters fold; other scripts compare
 *     exactly). For the key content.body the pattern may match any part of the body that
 *     starts and ends at a word boundary: the character before it and the one after it are
 *     not in [A-Za-z0-9_] (or are the ends of the body). Any other key must match the whole
 *     value. Only string values match. Patterns run as a small NFA over the text, so no
 *     pattern makes matching exponential; each state step counts against PUSH_MAX_STEPS.
 *   - Dotted keys: '.' separates object keys; "\." is a dot inside a key and "\\" a
 *     backslash; any other backslash is itself. Arrays are not indexed.
 *   - Sender power: users[sender], else users_default, else 0; without power levels the
 *     creator has PUSH_CREATOR_LEVEL. Needed: notifications[key], else 50.
 *   - A rule set is read once into a program (push_program_new: keys split, patterns
 *     compiled, actions judged) and run against each event; push_eval is the two in one.
 *     /sync judges up to 99 unread events a room with one user's rules, and reading the
 *     JSON at every event was a third of the server's CPU in a sliding-sync first
 *     response (docs/performance-sliding-sync.md, "Push rules read once"). Two shortcuts
 *     leave the NFA: a whole value against an ASCII pattern without wildcards is a byte
 *     comparison, and a words-mode pattern whose first character starts no word of the
 *     body cannot match. Both spend exactly the steps the NFA would have, so
 *     PUSH_MAX_STEPS cuts every rule set off at the same point as before.
 * What this file does not do: read rules or room state (push_rules.c,
 * core/client/sync/sync_rooms.c), deliver pushes, or know about threads.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/client/push/push_eval.h"
#include "atrium/parse.h"

#define GLOB_ANY_ONE (-1)         /* '?' */
#define GLOB_STAR (-2)            /* '*' (a run of them is one) */
#define INVALID_BYTE_BASE 0xDC00u /* an invalid UTF-8 byte b reads as this + b */
#define MEMBER_COUNT_MAX_DIGITS 18 /* room_member_count "is" values fit an int64_t */

static const char *const KIND_ORDER[] = {"override", "content", "room", "sender", "underride",
                                         NULL};
static const char *const LEGACY_MENTION_RULES[] = {".m.rule.contains_display_name",
                                                   ".m.rule.contains_user_name",
                                                   ".m.rule.roomnotif", NULL};

/* What word_scan found in the text words-mode patterns read (content.body): its code
 * points, how many start a word, and which ASCII characters (folded) start one. */
typedef struct word_scan {
    const char *text; /* NULL until scanned */
    int64_t chars, starts;
    uint64_t first[2]; /* bit c: an ASCII character folding to c starts a word */
} word_scan;

typedef struct eval_ctx {
    const json_t *event;
    const push_room *room;
    int64_t steps_left;
    bool out_of_steps;
    word_scan words;
} eval_ctx;

/* Spend n steps of the event's budget; false (and remembered) once it ran out. */
static bool spend(eval_ctx *cx, int64_t n)
{
    if (cx->steps_left < n) {
        cx->steps_left = 0;
        cx->out_of_steps = true;
        return false;
    }
    cx->steps_left -= n;
    return true;
}

/* ---- text ------------------------------------------------------------------------------- */

/* The code point at s[*i] (len bytes in all, *i < len), advancing *i. An invalid byte
 * stands for itself (INVALID_BYTE_BASE + byte). */
static uint32_t next_cp(const unsigned char *s, size_t len, size_t *i)
{
    unsigned char b = s[*i];
    size_t need = b < 0x80 ? 0 : (b & 0xE0) == 0xC0 ? 1 : (b & 0xF0) == 0xE0 ? 2
                                 : (b & 0xF8) == 0xF0 ? 3 : 4;
    if (need == 0) {
        (*i)++;
        return b;
    }
    if (need > 3 || *i + need >= len) {
        (*i)++;
        return INVALID_BYTE_BASE + b;
    }
    uint32_t cp = b & (0x3Fu >> need);
    for (size_t k = 1; k <= need; k++) {
        unsigned char c = s[*i + k];
        if ((c & 0xC0) != 0x80) {
            (*i)++;
            return INVALID_BYTE_BASE + b;
        }
        cp = (cp << 6) | (c & 0x3Fu);
    }
    *i += need + 1;
    return cp;
}

/* The case-folded form of c (see the file comment for which letters fold). */
static uint32_t fold(uint32_t c)
{
    if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if ((c >= 0x100 && c <= 0x137 && c != 0x130) || (c >= 0x14A && c <= 0x177)) return c | 1;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return c & 1 ? c + 1 : c;
    if (c == 0x178) return 0xFF;
    if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;
    if (c == 0x3C2) return 0x3C3; /* final sigma */
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    return c;
}

/* The word characters of the spec's word boundary: [A-Za-z0-9_]. */
static bool is_word_cp(uint32_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_';
}

/* ---- glob matching ---------------------------------------------------------------------- */

/* A compiled pattern: folded code points, GLOB_ANY_ONE, GLOB_STAR (tok has room for
 * PUSH_MAX_PATTERN_BYTES of them). ascii: only ASCII code points, no wildcard (a whole
 * value then matches by a byte comparison, ascii_match). */
typedef struct glob {
    int32_t *tok;
    size_t n;
    bool ascii;
} glob;

/* Compile pattern (literal: no wildcards, for display names) into g (g->tok set by the
 * caller). false when it is too long. */
static bool glob_compile(glob *g, const char *pattern, size_t len, bool literal)
{
    g->n = 0;
    g->ascii = true;
    if (len > PUSH_MAX_PATTERN_BYTES) return false;
    const unsigned char *s = (const unsigned char *)pattern;
    for (size_t i = 0; i < len;) {
        uint32_t c = next_cp(s, len, &i);
        int32_t t = (int32_t)fold(c);
        if (!literal && c == '*') t = GLOB_STAR;
        if (!literal && c == '?') t = GLOB_ANY_ONE;
        if (t == GLOB_STAR && g->n > 0 && g->tok[g->n - 1] == GLOB_STAR) continue;
        g->ascii = g->ascii && t >= 0 && t < 0x80;
        g->tok[g->n++] = t; /* n <= len <= PUSH_MAX_PATTERN_BYTES */
    }
    return true;
}

/* The live states of the NFA: state k = "tokens before k matched". */
typedef struct state_set {
    uint16_t list[PUSH_MAX_PATTERN_BYTES + 1];
    uint8_t in[PUSH_MAX_PATTERN_BYTES + 1];
    size_t n;
} state_set;

static void set_clear(state_set *s)
{
    for (size_t i = 0; i < s->n; i++) s->in[s->list[i]] = 0;
    s->n = 0;
}

/* Add state k and what it reaches without input (past a star). */
static void set_add(state_set *s, const glob *g, size_t k)
{
    for (;;) {
        if (!s->in[k]) {
            s->in[k] = 1;
            s->list[s->n++] = (uint16_t)k;
        }
        if (k < g->n && g->tok[k] == GLOB_STAR)
            k++;
        else
            return;
    }
}

/* Consume code point c (folded): from -> to (cleared first). false when out of steps. */
static bool set_step(eval_ctx *cx, const glob *g, const state_set *from, state_set *to,
                     uint32_t c)
{
    set_clear(to);
    if (!spend(cx, (int64_t)from->n + 1)) return false;
    for (size_t i = 0; i < from->n; i++) {
        size_t k = from->list[i];
        if (k >= g->n) continue;
        int32_t t = g->tok[k];
        if (t == GLOB_STAR)
            set_add(to, g, k);
        else if (t == GLOB_ANY_ONE || (uint32_t)t == c)
            set_add(to, g, k + 1);
    }
    return true;
}

/* Does g match text (len bytes)? words: any part between word boundaries (content.body),
 * else the whole text. */
static bool glob_match(eval_ctx *cx, const glob *g, const char *text, size_t len, bool words)
{
    state_set a, b; /* only the states of this pattern need a clean start */
    a.n = b.n = 0;
    memset(a.in, 0, g->n + 1);
    memset(b.in, 0, g->n + 1);
    state_set *cur = &a, *next = &b;
    const unsigned char *s = (const unsigned char *)text;
    uint32_t prev = 0;
    bool at_start = true;
    if (!words) set_add(cur, g, 0);
    for (size_t i = 0;;) {
        size_t at = i;
        uint32_t c = i < len ? next_cp(s, len, &i) : 0;
        bool end = at >= len;
        if (words) {
            if (at_start || !is_word_cp(prev)) set_add(cur, g, 0);
            if (cur->in[g->n] && (end || !is_word_cp(c))) return true;
        }
        if (end) return !words && cur->in[g->n];
        if (!words && cur->n == 0) return false;
        if (!set_step(cx, g, cur, next, fold(c))) return false;
        state_set *swap = cur;
        cur = next;
        next = swap;
        prev = c;
        at_start = false;
    }
}

/* A whole text against an ASCII pattern without wildcards (g->ascii), spending the steps
 * glob_match would: two for each code point it consumes, up to and including the first
 * that cannot match (a byte of 0x80 or more starts a code point that folds to no ASCII
 * one). */
static bool ascii_match(eval_ctx *cx, const glob *g, const char *text, size_t len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < g->n && i < len && s[i] < 0x80 && (int32_t)fold(s[i]) == g->tok[i]) i++;
    bool match = i == g->n && len == g->n;
    size_t consumed = match || i >= len ? i : i + 1;
    return spend(cx, 2 * (int64_t)consumed) && match;
}

/* Scan text for word_first (once an event: every words-mode pattern reads the same body). */
static const word_scan *word_scan_of(eval_ctx *cx, const char *text, size_t len)
{
    word_scan *w = &cx->words;
    if (w->text == text) return w;
    *w = (word_scan){.text = text};
    const unsigned char *s = (const unsigned char *)text;
    uint32_t prev = 0;
    for (size_t i = 0; i < len;) {
        bool starts = w->chars == 0 || !is_word_cp(prev);
        uint32_t c = next_cp(s, len, &i), f = fold(c);
        w->chars++;
        w->starts += starts;
        if (starts && f < 0x80) w->first[f >> 6] |= 1ull << (f & 63);
        prev = c;
    }
    return w;
}

/* A words-mode match that cannot succeed because the pattern's first token (an ASCII
 * character) starts no word of the text: what glob_match would spend on it (each code
 * point consumed costs one step, two where a word starts: state 0 alone is live then, and
 * nothing else ever is), without walking the states. -1 when the shortcut does not apply. */
static int64_t words_miss_steps(eval_ctx *cx, const glob *g, const char *text, size_t len)
{
    if (g->n == 0 || g->tok[0] < 0 || g->tok[0] >= 0x80) return -1;
    const word_scan *w = word_scan_of(cx, text, len);
    uint32_t t = (uint32_t)g->tok[0];
    return w->first[t >> 6] & (1ull << (t & 63)) ? -1 : w->chars + w->starts;
}

/* Does g match value? Only strings match; words as glob_match's. */
static bool glob_matches(eval_ctx *cx, const glob *g, const json_t *value, bool words)
{
    if (!json_is_string(value)) return false;
    const char *text = json_string_value(value);
    size_t len = json_string_length(value);
    if (!words && g->ascii) return ascii_match(cx, g, text, len);
    int64_t miss = words ? words_miss_steps(cx, g, text, len) : -1;
    if (miss >= 0) {
        spend(cx, miss);
        return false;
    }
    return glob_match(cx, g, text, len, words);
}

/* ---- event properties ------------------------------------------------------------------- */

static void *carve(push_program *p, size_t n);

/* A dotted key split into its object keys: parts[0..n) in one allocation with the parts
 * themselves. parts NULL: a key too long or too deep, never present. */
typedef struct key_path {
    char **parts;
    size_t n;
} key_path;

/* Split key (see the file comment) with p's memory. false on out of memory. */
static bool key_path_compile(push_program *p, key_path *kp, const char *key)
{
    *kp = (key_path){0};
    size_t klen = strlen(key);
    if (klen > PUSH_MAX_KEY_BYTES) return true;
    char buf[PUSH_MAX_KEY_BYTES + 1]; /* the parts, each ended by a NUL: at most klen + 1 */
    size_t used = 0, n = 0;
    for (size_t i = 0;;) {
        while (i < klen && key[i] != '.') {
            if (key[i] == '\\' && i + 1 < klen && (key[i + 1] == '.' || key[i + 1] == '\\')) i++;
            buf[used++] = key[i++];
        }
        buf[used++] = '\0';
        n++;
        if (i >= klen) break;
        i++; /* the separating dot */
    }
    if (n > PUSH_MAX_KEY_DEPTH) return true;
    char **parts = carve(p, n * sizeof(*parts) + used);
    if (!parts) return false;
    char *text = (char *)(parts + n);
    memcpy(text, buf, used);
    for (size_t k = 0, at = 0; k < n; k++) {
        parts[k] = text + at;
        at += strlen(text + at) + 1;
    }
    kp->parts = parts;
    kp->n = n;
    return true;
}

/* The value at kp inside event, or NULL. */
static const json_t *path_get(const json_t *event, const key_path *kp)
{
    if (!kp->parts) return NULL;
    const json_t *v = event;
    for (size_t i = 0; v && i < kp->n; i++)
        v = json_is_object(v) ? json_object_get(v, kp->parts[i]) : NULL;
    return v;
}

/* The JSON values event_property_is/contains compare: strings, integers, booleans, null. */
static bool is_scalar(const json_t *v)
{
    return json_is_string(v) || json_is_integer(v) || json_is_boolean(v) || json_is_null(v);
}

/* The string member name of obj, or NULL. */
static const char *str_of(const json_t *obj, const char *name)
{
    return json_string_value(json_object_get(obj, name));
}

/* ---- the compiled rule set ---------------------------------------------------------------
 * push_program_new reads a rule set once into the structures below; push_program_run
 * then reads only the event. Every shape the JSON can take maps onto one of them with the
 * verdict and the steps the rule's text gives (the file comment and push_eval.h). */

typedef enum cond_kind {
    COND_FALSE,   /* not an object, or no kind: fails without spending */
    COND_UNKNOWN, /* an unknown kind or a malformed condition: spends its step, fails */
    COND_EVENT_MATCH,
    COND_PROPERTY_IS,
    COND_PROPERTY_CONTAINS,
    COND_DISPLAY_NAME,
    COND_MEMBER_COUNT,
    COND_SENDER_PERMISSION,
} cond_kind;

enum { OP_EQ, OP_LT, OP_GT, OP_LE, OP_GE };

typedef struct pcond {
    cond_kind kind;
    key_path key;         /* event_match, event_property_is/contains */
    glob pattern;         /* event_match */
    bool words;           /* event_match on content.body */
    const json_t *value;  /* event_property_is/contains: a scalar (borrowed) */
    int op;               /* room_member_count */
    int64_t count;        /* room_member_count */
    const char *notify_key; /* sender_notification_permission (borrowed) */
} pcond;

typedef enum rule_shape {
    RULE_CONDITIONS, /* override, underride: every condition (none: always) */
    RULE_CONTENT,    /* its pattern on content.body as words */
    RULE_ROOM,       /* its rule_id is the event's room */
    RULE_SENDER,     /* its rule_id is the event's sender */
    RULE_NEVER,      /* a shape that never matches (after its step) */
} rule_shape;

typedef struct prule {
    rule_shape shape;
    const char *rule_id;    /* borrowed; NULL when absent */
    bool legacy;            /* a legacy mention rule: skipped for events with m.mentions */
    glob pattern;           /* RULE_CONTENT */
    pcond *conds;           /* RULE_CONDITIONS */
    size_t n_conds;
    bool notify, highlight; /* the verdict of its actions */
} prule;

/* The program's memory: blocks carved in order, freed together. */
typedef struct block {
    struct block *next;
    size_t used, cap;
    max_align_t data[];
} block;
#define BLOCK_BYTES 4096

struct push_program {
    json_t *global; /* held: the rules borrow from it */
    prule *rules;
    size_t n;
    block *blocks; /* the newest first */
};

/* n bytes of p's memory (zeroed), or NULL on out of memory. */
static void *carve(push_program *p, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
    block *b = p->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > BLOCK_BYTES ? n : BLOCK_BYTES;
        if (!(b = calloc(1, sizeof(*b) + cap))) return NULL;
        b->cap = cap;
        b->next = p->blocks;
        p->blocks = b;
    }
    void *out = (char *)b->data + b->used;
    b->used += n;
    return out;
}

/* A glob of pattern into g (its tokens in p's memory). false on out of memory; a pattern
 * too long leaves g->tok NULL (never matches). */
static bool glob_new(push_program *p, glob *g, const char *pattern, bool literal)
{
    *g = (glob){0};
    size_t len = strlen(pattern);
    if (len > PUSH_MAX_PATTERN_BYTES) return true;
    if (!(g->tok = carve(p, (len + 1) * sizeof(*g->tok)))) return false;
    glob_compile(g, pattern, len, literal);
    return true;
}

/* room_member_count's "is": an optional ==, <, >, <= or >= and a decimal count. */
static bool member_count_parse(const char *is, int *op, int64_t *count)
{
    static const char *const OPS[] = {"==", "<=", ">=", "<", ">", NULL};
    static const int OP_OF[] = {OP_EQ, OP_LE, OP_GE, OP_LT, OP_GT};
    *op = OP_EQ;
    for (size_t i = 0; OPS[i]; i++) {
        if (strncmp(is, OPS[i], strlen(OPS[i])) == 0) {
            *op = OP_OF[i];
            is += strlen(OPS[i]);
            break;
        }
    }
    size_t digits = strspn(is, "0123456789");
    return digits > 0 && digits <= MEMBER_COUNT_MAX_DIGITS && is[digits] == '\0' &&
           atrium_parse_int64(is, 0, INT64_MAX, count) == 0;
}

/* One condition (any JSON) into c. false on out of memory. */
static bool cond_compile(push_program *p, pcond *c, const json_t *cond)
{
    *c = (pcond){.kind = COND_FALSE};
    const char *kind = json_is_object(cond) ? str_of(cond, "kind") : NULL;
    if (!kind) return true;
    c->kind = COND_UNKNOWN;
    const char *key = str_of(cond, "key"), *pattern = str_of(cond, "pattern");
    const json_t *value = json_object_get(cond, "value");
    if (strcmp(kind, "event_match") == 0 && key && pattern) {
        c->kind = COND_EVENT_MATCH;
        c->words = strcmp(key, "content.body") == 0;
        return key_path_compile(p, &c->key, key) && glob_new(p, &c->pattern, pattern, false);
    }
    bool is = strcmp(kind, "event_property_is") == 0;
    if ((is || strcmp(kind, "event_property_contains") == 0) && key && is_scalar(value)) {
        c->kind = is ? COND_PROPERTY_IS : COND_PROPERTY_CONTAINS;
        c->value = value;
        return key_path_compile(p, &c->key, key);
    }
    if (strcmp(kind, "contains_display_name") == 0) c->kind = COND_DISPLAY_NAME;
    const char *count = str_of(cond, "is");
    if (strcmp(kind, "room_member_count") == 0 && count &&
        member_count_parse(count, &c->op, &c->count))
        c->kind = COND_MEMBER_COUNT;
    if (strcmp(kind, "sender_notification_permission") == 0 && key) {
        c->kind = COND_SENDER_PERMISSION;
        c->notify_key = key;
    }
    return true;
}

/* The verdict of a rule's actions: "notify" notifies, a highlight tweak without a value or
 * with value true highlights (the last one counts), and only with a notification. */
static void actions_verdict(const json_t *actions, prule *r)
{
    bool highlight = false;
    for (size_t i = 0; json_is_array(actions) && i < json_array_size(actions); i++) {
        const json_t *a = json_array_get(actions, i);
        if (json_is_string(a) && strcmp(json_string_value(a), "notify") == 0) r->notify = true;
        const char *tweak = str_of(a, "set_tweak");
        if (tweak && strcmp(tweak, "highlight") == 0) {
            const json_t *value = json_object_get(a, "value");
            highlight = !value || json_is_true(value);
        }
    }
    r->highlight = r->notify && highlight;
}

/* One enabled rule (an object) of kind into r. false on out of memory. */
static bool rule_compile(push_program *p, prule *r, const char *kind, const json_t *rule)
{
    *r = (prule){.rule_id = str_of(rule, "rule_id")};
    for (size_t i = 0; r->rule_id && LEGACY_MENTION_RULES[i]; i++)
        r->legacy = r->legacy || strcmp(r->rule_id, LEGACY_MENTION_RULES[i]) == 0;
    actions_verdict(json_object_get(rule, "actions"), r);
    if (strcmp(kind, "content") == 0) {
        const char *pattern = str_of(rule, "pattern");
        r->shape = pattern ? RULE_CONTENT : RULE_NEVER;
        return !pattern || glob_new(p, &r->pattern, pattern, false);
    }
    if (strcmp(kind, "room") == 0 || strcmp(kind, "sender") == 0) {
        r->shape = !r->rule_id ? RULE_NEVER : kind[0] == 'r' ? RULE_ROOM : RULE_SENDER;
        return true;
    }
    const json_t *conditions = json_object_get(rule, "conditions");
    r->shape = !conditions || json_is_array(conditions) ? RULE_CONDITIONS : RULE_NEVER;
    size_t n = json_array_size(conditions);
    if (n == 0) return true;
    if (!(r->conds = carve(p, n * sizeof(*r->conds)))) return false;
    for (; r->n_conds < n; r->n_conds++)
        if (!cond_compile(p, &r->conds[r->n_conds], json_array_get(conditions, r->n_conds)))
            return false;
    return true;
}

push_program *push_program_new(const json_t *global)
{
    push_program *p = calloc(1, sizeof(*p));
    if (!p) return NULL;
    p->global = json_incref((json_t *)global);
    size_t cap = 0;
    for (size_t k = 0; json_is_object(global) && KIND_ORDER[k]; k++)
        cap += json_array_size(json_object_get(global, KIND_ORDER[k]));
    if (cap > 0 && !(p->rules = carve(p, cap * sizeof(*p->rules)))) {
        push_program_free(p);
        return NULL;
    }
    for (size_t k = 0; cap > 0 && KIND_ORDER[k]; k++) {
        const json_t *rules = json_object_get(global, KIND_ORDER[k]);
        for (size_t i = 0; i < json_array_size(rules); i++) {
            const json_t *rule = json_array_get(rules, i);
            const json_t *enabled = json_object_get(rule, "enabled");
            if (!json_is_object(rule) || (enabled && !json_is_true(enabled))) continue;
            if (!rule_compile(p, &p->rules[p->n++], KIND_ORDER[k], rule)) {
                push_program_free(p);
                return NULL;
            }
        }
    }
    return p;
}

void push_program_free(push_program *p)
{
    if (!p) return;
    for (block *b = p->blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    json_decref(p->global);
    free(p);
}

/* ---- running it ------------------------------------------------------------------------- */

/* The sender's power level in the room (see the file comment). */
static int64_t sender_level(const push_room *room, const char *sender)
{
    const json_t *pl = room->power_levels;
    if (!json_is_object(pl))
        return room->creator && strcmp(room->creator, sender) == 0 ? PUSH_CREATOR_LEVEL : 0;
    const json_t *own = json_object_get(json_object_get(pl, "users"), sender);
    if (json_is_integer(own)) return json_integer_value(own);
    const json_t *def = json_object_get(pl, "users_default");
    return json_is_integer(def) ? json_integer_value(def) : 0;
}

/* The event's content.body, or NULL. */
static const json_t *body_of(const json_t *event)
{
    return json_object_get(json_object_get(event, "content"), "body");
}

static bool cond_display_name(eval_ctx *cx)
{
    const char *name = cx->room->display_name;
    const json_t *body = body_of(cx->event);
    if (!name || !name[0] || !json_is_string(body)) return false;
    int32_t tok[PUSH_MAX_PATTERN_BYTES];
    glob g = {.tok = tok};
    return glob_compile(&g, name, strlen(name), true) && glob_matches(cx, &g, body, true);
}

static bool cond_member_count(eval_ctx *cx, const pcond *c)
{
    int64_t have = cx->room->member_count;
    switch (c->op) {
    case OP_LT: return have < c->count;
    case OP_GT: return have > c->count;
    case OP_LE: return have <= c->count;
    case OP_GE: return have >= c->count;
    default: return have == c->count;
    }
}

static bool cond_sender_permission(eval_ctx *cx, const pcond *c)
{
    const char *sender = str_of(cx->event, "sender");
    if (!sender) return false;
    const json_t *needed = json_object_get(json_object_get(cx->room->power_levels, "notifications"),
                                           c->notify_key);
    int64_t level =
        json_is_integer(needed) ? json_integer_value(needed) : PUSH_DEFAULT_NOTIFY_LEVEL;
    return sender_level(cx->room, sender) >= level;
}

static bool cond_property_contains(eval_ctx *cx, const pcond *c)
{
    const json_t *list = path_get(cx->event, &c->key);
    if (!json_is_array(list) || !spend(cx, (int64_t)json_array_size(list))) return false;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *v = json_array_get(list, i);
        if (is_scalar(v) && json_equal((json_t *)v, (json_t *)c->value)) return true;
    }
    return false;
}

/* One condition; what fails to compile never matches. */
static bool cond_run(eval_ctx *cx, const pcond *c)
{
    if (c->kind == COND_FALSE || !spend(cx, 1)) return false;
    switch (c->kind) {
    case COND_EVENT_MATCH:
        return c->pattern.tok &&
               glob_matches(cx, &c->pattern, path_get(cx->event, &c->key), c->words);
    case COND_PROPERTY_IS: {
        const json_t *v = path_get(cx->event, &c->key);
        return is_scalar(v) && json_equal((json_t *)v, (json_t *)c->value);
    }
    case COND_PROPERTY_CONTAINS: return cond_property_contains(cx, c);
    case COND_DISPLAY_NAME: return cond_display_name(cx);
    case COND_MEMBER_COUNT: return cond_member_count(cx, c);
    case COND_SENDER_PERMISSION: return cond_sender_permission(cx, c);
    default: return false;
    }
}

static bool rule_run(eval_ctx *cx, const prule *r)
{
    const char *id;
    switch (r->shape) {
    case RULE_CONTENT:
        return r->pattern.tok && glob_matches(cx, &r->pattern, body_of(cx->event), true);
    case RULE_ROOM: return (id = str_of(cx->event, "room_id")) && strcmp(r->rule_id, id) == 0;
    case RULE_SENDER: return (id = str_of(cx->event, "sender")) && strcmp(r->rule_id, id) == 0;
    case RULE_CONDITIONS:
        for (size_t i = 0; i < r->n_conds; i++)
            if (!cond_run(cx, &r->conds[i])) return false;
        return true;
    default: return false;
    }
}

push_outcome push_program_run(const push_program *p, const json_t *event, const push_room *room)
{
    push_outcome out = {0};
    if (!p || !json_is_object(event) || !room) return out;
    eval_ctx cx = {.event = event, .room = room, .steps_left = PUSH_MAX_STEPS};
    bool has_mentions = json_object_get(json_object_get(event, "content"), "m.mentions") != NULL;
    for (size_t i = 0; i < p->n; i++) {
        const prule *r = &p->rules[i];
        if ((r->legacy && has_mentions) || !spend(&cx, 1)) continue;
        if (rule_run(&cx, r)) {
            out.rule_id = r->rule_id;
            out.notify = r->notify;
            out.highlight = r->highlight;
            break;
        }
    }
    out.out_of_steps = cx.out_of_steps;
    return out;
}

push_outcome push_eval(const json_t *global, const json_t *event, const push_room *room)
{
    push_program *p = push_program_new(global);
    push_outcome out = push_program_run(p, event, room);
    push_program_free(p);
    return out;
}
