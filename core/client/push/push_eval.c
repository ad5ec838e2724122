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
 * What this file does not do: read rules or room state (push_rules.c,
 * core/client/sync/sync_rooms.c), deliver pushes, or know about threads.
 */
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

typedef struct eval_ctx {
    const json_t *event;
    const push_room *room;
    int64_t steps_left;
    bool out_of_steps;
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

/* A compiled pattern: folded code points, GLOB_ANY_ONE, GLOB_STAR. */
typedef struct glob {
    int32_t tok[PUSH_MAX_PATTERN_BYTES];
    size_t n;
} glob;

/* Compile pattern (literal: no wildcards, for display names). false when it is too long. */
static bool glob_compile(glob *g, const char *pattern, size_t len, bool literal)
{
    g->n = 0;
    if (len > PUSH_MAX_PATTERN_BYTES) return false;
    const unsigned char *s = (const unsigned char *)pattern;
    for (size_t i = 0; i < len;) {
        uint32_t c = next_cp(s, len, &i);
        int32_t t = (int32_t)fold(c);
        if (!literal && c == '*') t = GLOB_STAR;
        if (!literal && c == '?') t = GLOB_ANY_ONE;
        if (t == GLOB_STAR && g->n > 0 && g->tok[g->n - 1] == GLOB_STAR) continue;
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

/* Compile and match; false for a pattern too long or a budget spent. */
static bool pattern_matches(eval_ctx *cx, const char *pattern, const json_t *value, bool words,
                            bool literal)
{
    if (!json_is_string(value)) return false;
    glob g;
    return glob_compile(&g, pattern, strlen(pattern), literal) &&
           glob_match(cx, &g, json_string_value(value), json_string_length(value), words);
}

/* ---- event properties ------------------------------------------------------------------- */

/* The value at dotted key inside event, or NULL (absent, key too long or too deep). */
static const json_t *event_property(const json_t *event, const char *key)
{
    size_t klen = strlen(key);
    if (klen > PUSH_MAX_KEY_BYTES) return NULL;
    char part[PUSH_MAX_KEY_BYTES + 1];
    const json_t *v = event;
    size_t depth = 0;
    for (size_t i = 0;;) {
        size_t n = 0;
        while (i < klen && key[i] != '.') {
            if (key[i] == '\\' && i + 1 < klen && (key[i + 1] == '.' || key[i + 1] == '\\')) i++;
            part[n++] = key[i++];
        }
        part[n] = '\0';
        if (++depth > PUSH_MAX_KEY_DEPTH || !json_is_object(v)) return NULL;
        v = json_object_get(v, part);
        if (!v || i >= klen) return v;
        i++; /* the separating dot */
    }
}

/* The JSON values event_property_is/contains compare: strings, integers, booleans, null. */
static bool is_scalar(const json_t *v)
{
    return json_is_string(v) || json_is_integer(v) || json_is_boolean(v) || json_is_null(v);
}

/* ---- conditions ------------------------------------------------------------------------- */

/* The string member name of obj, or NULL. */
static const char *str_of(const json_t *obj, const char *name)
{
    return json_string_value(json_object_get(obj, name));
}

static bool cond_event_match(eval_ctx *cx, const json_t *cond)
{
    const char *key = str_of(cond, "key"), *pattern = str_of(cond, "pattern");
    if (!key || !pattern) return false;
    return pattern_matches(cx, pattern, event_property(cx->event, key),
                           strcmp(key, "content.body") == 0, false);
}

static bool cond_property_is(eval_ctx *cx, const json_t *cond)
{
    const char *key = str_of(cond, "key");
    const json_t *want = json_object_get(cond, "value");
    if (!key || !is_scalar(want)) return false;
    const json_t *v = event_property(cx->event, key);
    return is_scalar(v) && json_equal((json_t *)v, (json_t *)want);
}

static bool cond_property_contains(eval_ctx *cx, const json_t *cond)
{
    const char *key = str_of(cond, "key");
    const json_t *want = json_object_get(cond, "value");
    if (!key || !is_scalar(want)) return false;
    const json_t *list = event_property(cx->event, key);
    if (!json_is_array(list) || !spend(cx, (int64_t)json_array_size(list))) return false;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const json_t *v = json_array_get(list, i);
        if (is_scalar(v) && json_equal((json_t *)v, (json_t *)want)) return true;
    }
    return false;
}

static bool cond_display_name(eval_ctx *cx)
{
    const char *name = cx->room->display_name;
    if (!name || !name[0]) return false;
    return pattern_matches(cx, name, event_property(cx->event, "content.body"), true, true);
}

/* room_member_count: "is" is an optional ==, <, >, <= or >= and a decimal count. */
static bool cond_member_count(eval_ctx *cx, const json_t *cond)
{
    const char *is = str_of(cond, "is");
    if (!is) return false;
    const char *op = "==";
    static const char *const OPS[] = {"==", "<=", ">=", "<", ">", NULL};
    for (size_t i = 0; OPS[i]; i++) {
        if (strncmp(is, OPS[i], strlen(OPS[i])) == 0) {
            op = OPS[i];
            is += strlen(OPS[i]);
            break;
        }
    }
    size_t digits = strspn(is, "0123456789");
    if (digits == 0 || digits > MEMBER_COUNT_MAX_DIGITS || is[digits] != '\0') return false;
    int64_t want, have = cx->room->member_count;
    if (atrium_parse_int64(is, 0, INT64_MAX, &want) != 0) return false;
    if (strcmp(op, "<") == 0) return have < want;
    if (strcmp(op, ">") == 0) return have > want;
    if (strcmp(op, "<=") == 0) return have <= want;
    if (strcmp(op, ">=") == 0) return have >= want;
    return have == want;
}

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

static bool cond_sender_permission(eval_ctx *cx, const json_t *cond)
{
    const char *key = str_of(cond, "key"), *sender = str_of(cx->event, "sender");
    if (!key || !sender) return false;
    const json_t *needed = json_object_get(json_object_get(cx->room->power_levels,
                                                           "notifications"), key);
    int64_t level = json_is_integer(needed) ? json_integer_value(needed)
                                            : PUSH_DEFAULT_NOTIFY_LEVEL;
    return sender_level(cx->room, sender) >= level;
}

/* One condition; an unknown kind or a malformed condition does not match. */
static bool condition_matches(eval_ctx *cx, const json_t *cond)
{
    const char *kind = str_of(cond, "kind");
    if (!kind || !spend(cx, 1)) return false;
    if (strcmp(kind, "event_match") == 0) return cond_event_match(cx, cond);
    if (strcmp(kind, "event_property_is") == 0) return cond_property_is(cx, cond);
    if (strcmp(kind, "event_property_contains") == 0) return cond_property_contains(cx, cond);
    if (strcmp(kind, "contains_display_name") == 0) return cond_display_name(cx);
    if (strcmp(kind, "room_member_count") == 0) return cond_member_count(cx, cond);
    if (strcmp(kind, "sender_notification_permission") == 0)
        return cond_sender_permission(cx, cond);
    return false;
}

/* ---- rules ------------------------------------------------------------------------------ */

/* Does rule (of kind) match the event? Conditions absent: always (override, underride). */
static bool rule_matches(eval_ctx *cx, const char *kind, const json_t *rule)
{
    const char *rule_id = str_of(rule, "rule_id");
    if (strcmp(kind, "content") == 0) {
        const char *pattern = str_of(rule, "pattern");
        return pattern && pattern_matches(cx, pattern, event_property(cx->event, "content.body"),
                                          true, false);
    }
    if (strcmp(kind, "room") == 0) {
        const char *room_id = str_of(cx->event, "room_id");
        return rule_id && room_id && strcmp(rule_id, room_id) == 0;
    }
    if (strcmp(kind, "sender") == 0) {
        const char *sender = str_of(cx->event, "sender");
        return rule_id && sender && strcmp(rule_id, sender) == 0;
    }
    const json_t *conditions = json_object_get(rule, "conditions");
    if (!conditions) return true;
    if (!json_is_array(conditions)) return false;
    for (size_t i = 0; i < json_array_size(conditions); i++) {
        const json_t *cond = json_array_get(conditions, i);
        if (!json_is_object(cond) || !condition_matches(cx, cond)) return false;
    }
    return true;
}

/* Is rule switched on? "enabled" true or absent; anything else switches it off. */
static bool rule_enabled(const json_t *rule)
{
    const json_t *enabled = json_object_get(rule, "enabled");
    return !enabled || json_is_true(enabled);
}

/* A legacy mention rule, skipped for events that carry m.mentions? */
static bool legacy_mention_skipped(const json_t *rule, bool has_mentions)
{
    const char *rule_id = str_of(rule, "rule_id");
    if (!has_mentions || !rule_id) return false;
    for (size_t i = 0; LEGACY_MENTION_RULES[i]; i++)
        if (strcmp(rule_id, LEGACY_MENTION_RULES[i]) == 0) return true;
    return false;
}

/* The verdict of a matched rule's actions. */
static void apply_actions(const json_t *actions, push_outcome *out)
{
    bool highlight = false;
    for (size_t i = 0; json_is_array(actions) && i < json_array_size(actions); i++) {
        const json_t *a = json_array_get(actions, i);
        if (json_is_string(a) && strcmp(json_string_value(a), "notify") == 0) out->notify = true;
        const char *tweak = str_of(a, "set_tweak");
        if (tweak && strcmp(tweak, "highlight") == 0) {
            const json_t *value = json_object_get(a, "value");
            highlight = !value || json_is_true(value);
        }
    }
    out->highlight = out->notify && highlight;
}

push_outcome push_eval(const json_t *global, const json_t *event, const push_room *room)
{
    push_outcome out = {0};
    if (!json_is_object(global) || !json_is_object(event) || !room) return out;
    eval_ctx cx = {.event = event, .room = room, .steps_left = PUSH_MAX_STEPS};
    bool has_mentions = json_object_get(json_object_get(event, "content"), "m.mentions") != NULL;
    for (size_t k = 0; KIND_ORDER[k]; k++) {
        const json_t *rules = json_object_get(global, KIND_ORDER[k]);
        for (size_t i = 0; json_is_array(rules) && i < json_array_size(rules); i++) {
            const json_t *rule = json_array_get(rules, i);
            if (!json_is_object(rule) || !rule_enabled(rule) ||
                legacy_mention_skipped(rule, has_mentions) || !spend(&cx, 1))
                continue;
            if (rule_matches(&cx, KIND_ORDER[k], rule)) {
                out.rule_id = str_of(rule, "rule_id");
                apply_actions(json_object_get(rule, "actions"), &out);
                out.out_of_steps = cx.out_of_steps;
                return out;
            }
        }
    }
    out.out_of_steps = cx.out_of_steps;
    return out;
}
