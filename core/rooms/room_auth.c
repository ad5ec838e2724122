/*
 * core/rooms/room_auth.c - the authorization rules (see room_auth.h).
 *
 * One function per rule family, in the spec's order: the create event, m.room.aliases
 * (v1-5), membership events, then the checks every other event passes (sender joined,
 * m.room.third_party_invite, type level, user-named state keys), the power-levels change
 * rules and, in v1-2, redactions. Where room versions differ, the rule reads the flag of
 * room_version that names the difference, at the place the spec's text changes, so each
 * rule is written once for all eleven versions. Each refusal writes the reason a client
 * (or the operator reading why a PDU was rejected) will read.
 */
#include <ctype.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/base64.h"
#include "core/rooms/canonical_json.h"
#include "core/rooms/room_auth.h"

#define ED25519_PUBLIC_KEY_BYTES 32
#define ED25519_SIGNATURE_BYTES 64
#define LEVEL_STRING_MAX_BYTES 64 /* longer strings are no power level */
#define TPI_MAX_PUBLIC_KEYS 16    /* keys of one m.room.third_party_invite tried, at most */

static bool refuse(char why[ROOM_AUTH_WHY_LEN], const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static bool refuse(char why[ROOM_AUTH_WHY_LEN], const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, ROOM_AUTH_WHY_LEN, fmt, ap);
    va_end(ap);
    return false;
}

static bool is(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

const char *room_auth_domain(const char *id)
{
    const char *c = id ? strchr(id, ':') : NULL;
    return c ? c + 1 : "";
}

bool room_auth_is_user_id(const char *id)
{
    if (!id || id[0] != '@' || strlen(id) > EVENT_MAX_ID_BYTES) return false;
    const char *colon = strchr(id, ':');
    return colon && colon > id + 1 && colon[1] != '\0';
}

const char *room_auth_creator(const room_auth_state *st)
{
    if (!st->create) return NULL;
    if (st->version->creator_is_sender)
        return json_string_value(json_object_get(st->create, "sender"));
    return json_string_value(json_object_get(json_object_get(st->create, "content"), "creator"));
}

/* ---- power levels as numbers -------------------------------------------------------- */

/* Before v10: " +0050 " is 50 (the spec's "stringy power levels"). */
static bool level_from_string(const char *s, int64_t *out)
{
    if (strlen(s) > LEVEL_STRING_MAX_BYTES) return false;
    while (isspace((unsigned char)*s)) s++;
    bool neg = false;
    if (*s == '+' || *s == '-') neg = *s++ == '-';
    if (!isdigit((unsigned char)*s)) return false;
    int64_t n = 0;
    while (isdigit((unsigned char)*s)) {
        int d = *s++ - '0';
        if (n > (INT64_MAX - d) / 10) return false;
        n = n * 10 + d;
    }
    while (isspace((unsigned char)*s)) s++;
    if (*s) return false;
    *out = neg ? -n : n;
    return true;
}

bool room_auth_level_value(const room_version *v, const json_t *val, int64_t *out)
{
    if (json_is_integer(val)) {
        *out = json_integer_value(val);
        return true;
    }
    if (v->integer_power_levels) return false;
    if (json_is_string(val)) return level_from_string(json_string_value(val), out);
    if (json_is_real(val) && !v->strict_canonical_json) {
        /* v1-5 ("floaty power levels"): truncated at the decimal point. */
        double d = json_real_value(val);
        if (!isfinite(d) || d >= 9.2e18 || d <= -9.2e18) return false;
        *out = (int64_t)trunc(d);
        return true;
    }
    return false;
}

/* The level at key of obj, or def when absent or not a level. */
static int64_t level_at(const room_auth_state *st, const json_t *obj, const char *key, int64_t def)
{
    int64_t n;
    const json_t *val = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    return val && room_auth_level_value(st->version, val, &n) ? n : def;
}

int64_t room_auth_user_level(const room_auth_state *st, const char *user_id)
{
    if (!st->power_levels)
        return is(user_id, room_auth_creator(st)) ? ROOM_AUTH_CREATOR_LEVEL_NO_PL : 0;
    int64_t def = level_at(st, st->power_levels, "users_default", 0);
    return level_at(st, json_object_get(st->power_levels, "users"), user_id, def);
}

int64_t room_auth_event_level(const room_auth_state *st, const char *type, bool is_state)
{
    if (!st->power_levels) return is_state ? ROOM_AUTH_STATE_DEFAULT_NO_PL : 0;
    int64_t def = is_state ? level_at(st, st->power_levels, "state_default", ROOM_AUTH_STATE_DEFAULT)
                           : level_at(st, st->power_levels, "events_default", 0);
    return level_at(st, json_object_get(st->power_levels, "events"), type, def);
}

int64_t room_auth_action_level(const room_auth_state *st, const char *action)
{
    int64_t def = strcmp(action, "invite") == 0 ? ROOM_AUTH_INVITE_DEFAULT : ROOM_AUTH_ACTION_DEFAULT;
    return level_at(st, st->power_levels, action, def);
}

/* ---- m.room.create ------------------------------------------------------------------ */

static bool allows_create(const room_auth_state *st, const char *sender, const json_t *content,
                          char why[ROOM_AUTH_WHY_LEN])
{
    if (st->pdu) {
        const json_t *prev = json_object_get(st->pdu, "prev_events");
        if (json_array_size(prev) > 0) return refuse(why, "A create event cannot have prev_events");
        const char *room_id = json_string_value(json_object_get(st->pdu, "room_id"));
        if (strcmp(room_auth_domain(room_id), room_auth_domain(sender)) != 0)
            return refuse(why, "The room ID's server is not the creator's");
    } else if (st->create) {
        return refuse(why, "The room already has a create event");
    }
    if (!room_auth_domain(sender)[0]) return refuse(why, "The creator is not a user ID");
    json_t *ver = json_object_get(content, "room_version");
    if (ver && (!json_is_string(ver) || !room_version_find(json_string_value(ver))))
        return refuse(why, "Unsupported room version");
    if (!st->version->creator_is_sender && !json_object_get(content, "creator"))
        return refuse(why, "The create event lacks a creator");
    return true;
}

/* ---- m.room.member ------------------------------------------------------------------ */

static const char *membership_of(const json_t *member_event)
{
    return json_string_value(json_object_get(json_object_get(member_event, "content"),
                                             "membership"));
}

static const char *join_rule(const room_auth_state *st)
{
    return st->join_rules ? json_string_value(json_object_get(st->join_rules, "join_rule")) : NULL;
}

/* v8+ restricted (v10+ also knock_restricted): a joined user who may invite vouches. */
static bool allows_restricted_join(const room_auth_state *st, const json_t *content,
                                   char why[ROOM_AUTH_WHY_LEN])
{
    if (is(st->target_membership, "join") || is(st->target_membership, "invite")) return true;
    const char *via = json_string_value(json_object_get(content, "join_authorised_via_users_server"));
    if (!via) return refuse(why, "This room is restricted: a join needs an authorising user");
    if (!st->get) return refuse(why, "The authorising user's membership is unknown here");
    if (!is(membership_of(st->get(st->get_ctx, "m.room.member", via)), "join"))
        return refuse(why, "The authorising user is not in the room");
    if (room_auth_user_level(st, via) < room_auth_action_level(st, "invite"))
        return refuse(why, "The authorising user may not invite users");
    return true;
}

static bool allows_join(const room_auth_state *st, const char *target, const char *sender,
                        const json_t *content, char why[ROOM_AUTH_WHY_LEN])
{
    const room_version *v = st->version;
    if (st->only_create && is(target, room_auth_creator(st))) return true;
    if (!is(sender, target)) return refuse(why, "You cannot join someone else to a room");
    if (is(st->target_membership, "ban")) return refuse(why, "You are banned from this room");
    const char *rule = join_rule(st);
    if (is(rule, "invite") || (v->knock && is(rule, "knock"))) {
        if (is(st->target_membership, "join") || is(st->target_membership, "invite")) return true;
        return refuse(why, "You are not invited to this room");
    }
    if ((v->restricted_join && is(rule, "restricted")) ||
        (v->knock_restricted && is(rule, "knock_restricted")))
        return allows_restricted_join(st, content, why);
    if (is(rule, "public")) return true;
    return refuse(why, "This room cannot be joined");
}

/* Does any signature on `signed` verify with one of the public keys of the
 * m.room.third_party_invite content (public_key, public_keys[].public_key)? */
static bool third_party_signature_ok(const json_t *signed_obj, const json_t *tpi_content)
{
    unsigned char keys[TPI_MAX_PUBLIC_KEYS][ED25519_PUBLIC_KEY_BYTES];
    size_t nkeys = 0;
    const char *one = json_string_value(json_object_get(tpi_content, "public_key"));
    if (one && rt_b64_decode_exact(one, keys[nkeys], ED25519_PUBLIC_KEY_BYTES) == 0) nkeys++;
    const json_t *list = json_object_get(tpi_content, "public_keys");
    for (size_t i = 0; i < json_array_size(list) && nkeys < TPI_MAX_PUBLIC_KEYS; i++) {
        const char *k = json_string_value(json_object_get(json_array_get(list, i), "public_key"));
        if (k && rt_b64_decode_exact(k, keys[nkeys], ED25519_PUBLIC_KEY_BYTES) == 0) nkeys++;
    }
    const json_t *sigs = json_object_get(signed_obj, "signatures");
    if (!nkeys || !json_is_object(sigs)) return false;
    json_t *copy = json_copy((json_t *)signed_obj);
    if (!copy) return false;
    json_object_del(copy, "signatures");
    json_object_del(copy, "unsigned");
    size_t len;
    char *canon = cjson_encode(copy, &len);
    json_decref(copy);
    if (!canon) return false;
    bool ok = false;
    const char *server, *key_id;
    json_t *by_server, *sig;
    json_object_foreach((json_t *)sigs, server, by_server) {
        if (!json_is_object(by_server)) continue;
        json_object_foreach(by_server, key_id, sig) {
            unsigned char raw[ED25519_SIGNATURE_BYTES];
            if (ok || strncmp(key_id, "ed25519:", 8) != 0 || !json_is_string(sig) ||
                rt_b64_decode_exact(json_string_value(sig), raw, sizeof(raw)) < 0)
                continue;
            for (size_t k = 0; k < nkeys && !ok; k++)
                ok = crypto_sign_verify_detached(raw, (const unsigned char *)canon, len, keys[k]) == 0;
        }
    }
    free(canon);
    return ok;
}

static bool allows_third_party_invite(const room_auth_state *st, const char *target,
                                      const char *sender, const json_t *tpi,
                                      char why[ROOM_AUTH_WHY_LEN])
{
    if (is(st->target_membership, "ban")) return refuse(why, "The user is banned from the room");
    const json_t *signed_obj = json_object_get(tpi, "signed");
    if (!json_is_object(signed_obj)) return refuse(why, "The third-party invite is not signed");
    const char *mxid = json_string_value(json_object_get(signed_obj, "mxid"));
    const char *token = json_string_value(json_object_get(signed_obj, "token"));
    if (!mxid || !token) return refuse(why, "The third-party invite lacks mxid or token");
    if (!is(mxid, target)) return refuse(why, "The third-party invite is for another user");
    if (!st->get) return refuse(why, "The room's third-party invites are unknown here");
    const json_t *ev = st->get(st->get_ctx, "m.room.third_party_invite", token);
    if (!ev) return refuse(why, "No third-party invite in the room has this token");
    if (!is(json_string_value(json_object_get(ev, "sender")), sender))
        return refuse(why, "The third-party invite was made by someone else");
    if (!third_party_signature_ok(signed_obj, json_object_get(ev, "content")))
        return refuse(why, "The third-party invite's signature matches none of its keys");
    return true;
}

static bool allows_invite(const room_auth_state *st, const char *target, const char *sender,
                          const json_t *content, char why[ROOM_AUTH_WHY_LEN])
{
    const json_t *tpi = json_object_get(content, "third_party_invite");
    if (tpi) return allows_third_party_invite(st, target, sender, tpi, why);
    if (!is(st->sender_membership, "join")) return refuse(why, "You are not in this room");
    if (is(st->target_membership, "join")) return refuse(why, "The user is already in the room");
    if (is(st->target_membership, "ban")) return refuse(why, "The user is banned from the room");
    if (room_auth_user_level(st, sender) < room_auth_action_level(st, "invite"))
        return refuse(why, "You do not have permission to invite users");
    return true;
}

static bool allows_leave(const room_auth_state *st, const char *target, const char *sender,
                         char why[ROOM_AUTH_WHY_LEN])
{
    if (is(sender, target)) {
        if (is(st->target_membership, "join") || is(st->target_membership, "invite") ||
            (st->version->knock && is(st->target_membership, "knock")))
            return true;
        return refuse(why, "You are not in this room");
    }
    if (!is(st->sender_membership, "join")) return refuse(why, "You are not in this room");
    int64_t mine = room_auth_user_level(st, sender), theirs = room_auth_user_level(st, target);
    if (is(st->target_membership, "ban") && mine < room_auth_action_level(st, "ban"))
        return refuse(why, "You do not have permission to unban users");
    if (mine >= room_auth_action_level(st, "kick") && theirs < mine) return true;
    return refuse(why, "You do not have permission to kick this user");
}

static bool allows_ban(const room_auth_state *st, const char *target, const char *sender,
                       char why[ROOM_AUTH_WHY_LEN])
{
    if (!is(st->sender_membership, "join")) return refuse(why, "You are not in this room");
    int64_t mine = room_auth_user_level(st, sender), theirs = room_auth_user_level(st, target);
    if (mine >= room_auth_action_level(st, "ban") && theirs < mine) return true;
    return refuse(why, "You do not have permission to ban this user");
}

static bool allows_knock(const room_auth_state *st, const char *target, const char *sender,
                         char why[ROOM_AUTH_WHY_LEN])
{
    const char *rule = join_rule(st);
    if (!is(rule, "knock") && !(st->version->knock_restricted && is(rule, "knock_restricted")))
        return refuse(why, "This room does not accept knocks");
    if (!is(sender, target)) return refuse(why, "You cannot knock for someone else");
    if (is(st->target_membership, "ban") || is(st->target_membership, "join") ||
        is(st->target_membership, "invite"))
        return refuse(why, "You cannot knock on this room");
    return true;
}

static bool allows_member(const room_auth_state *st, const char *target, const char *sender,
                          const json_t *content, char why[ROOM_AUTH_WHY_LEN])
{
    const char *membership = json_string_value(json_object_get(content, "membership"));
    if (!target || !membership) return refuse(why, "A membership event needs a state key and a membership");
    if (!room_auth_is_user_id(target))
        return refuse(why, "The state key of a membership event must be a user ID");
    if (!st->pdu && st->version->restricted_join) {
        /* The local write path signs as the sender's server only (and, for a template, the
         * co-signing server): an authorising user of another server could not have signed
         * (rule "validly signed by the homeserver of the user ID denoted by the key"). */
        const char *via = json_string_value(json_object_get(content, "join_authorised_via_users_server"));
        if (via && strcmp(room_auth_domain(via), room_auth_domain(sender)) != 0 &&
            !(st->cosigner && strcmp(room_auth_domain(via), st->cosigner) == 0))
            return refuse(why, "The authorising user must be of this server");
    }
    if (strcmp(membership, "join") == 0) return allows_join(st, target, sender, content, why);
    if (strcmp(membership, "invite") == 0) return allows_invite(st, target, sender, content, why);
    if (strcmp(membership, "leave") == 0) return allows_leave(st, target, sender, why);
    if (strcmp(membership, "ban") == 0) return allows_ban(st, target, sender, why);
    if (st->version->knock && strcmp(membership, "knock") == 0)
        return allows_knock(st, target, sender, why);
    return refuse(why, "Unknown membership \"%.32s\" in room version %s", membership,
                  st->version->id);
}

/* ---- m.room.power_levels ------------------------------------------------------------ */

static const char *const PL_LEVEL_KEYS[] = {"users_default", "events_default", "state_default",
                                            "ban", "redact", "kick", "invite", NULL};

/* users: an object whose keys are user IDs and whose values are levels (every version);
 * v10+: the top-level levels integers, events and notifications objects of integers.
 * strict applies the v10 rules to any version: the local write path does, because the
 * spec asks servers to keep users from sending new string levels ("Definitions",
 * server-server API) although older versions accept them from other servers. */
static bool power_levels_well_formed(const room_version *v, bool strict, const json_t *content,
                                     char why[ROOM_AUTH_WHY_LEN])
{
    int64_t n;
    const json_t *users = json_object_get(content, "users");
    if (users) {
        if (!json_is_object(users)) return refuse(why, "\"users\" must be an object");
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)users, k, val) {
            if (!room_auth_is_user_id(k)) return refuse(why, "\"users\" keys must be user IDs");
            if (strict ? !json_is_integer(val) : !room_auth_level_value(v, val, &n))
                return refuse(why, "Levels in \"users\" must be integers");
        }
    }
    if (!v->integer_power_levels && !strict) return true;
    for (size_t i = 0; PL_LEVEL_KEYS[i]; i++) {
        json_t *val = json_object_get(content, PL_LEVEL_KEYS[i]);
        if (val && !json_is_integer(val)) return refuse(why, "\"%s\" must be an integer", PL_LEVEL_KEYS[i]);
    }
    static const char *const MAPS[] = {"events", "notifications", NULL};
    for (size_t i = 0; MAPS[i]; i++) {
        json_t *m = json_object_get(content, MAPS[i]);
        if (!m) continue;
        if (!json_is_object(m)) return refuse(why, "\"%s\" must be an object", MAPS[i]);
        const char *k;
        json_t *val;
        json_object_foreach(m, k, val)
            if (!json_is_integer(val)) return refuse(why, "Levels in \"%s\" must be integers", MAPS[i]);
    }
    return true;
}

/* One level, before and after: present flags and values. */
typedef struct level_pair {
    bool had, has;
    int64_t old_v, new_v;
} level_pair;

static level_pair pair_of(const room_version *v, const json_t *old_obj, const json_t *new_obj,
                          const char *key)
{
    level_pair p = {0};
    const json_t *o = json_is_object(old_obj) ? json_object_get(old_obj, key) : NULL;
    const json_t *n = json_is_object(new_obj) ? json_object_get(new_obj, key) : NULL;
    p.had = o && room_auth_level_value(v, o, &p.old_v);
    p.has = n && room_auth_level_value(v, n, &p.new_v);
    return p;
}

static bool pair_changed(const level_pair *p)
{
    return p->had != p->has || (p->had && p->old_v != p->new_v);
}

/* A changed level must be within the sender's reach on both sides. */
static bool level_change_ok(const level_pair *p, int64_t mine)
{
    if (!pair_changed(p)) return true;
    if (p->had && p->old_v > mine) return false;
    if (p->has && p->new_v > mine) return false;
    return true;
}

static bool map_changes_ok(const room_version *v, const json_t *old_m, const json_t *new_m,
                           int64_t mine, bool users, const char *sender)
{
    const json_t *sides[2] = {old_m, new_m};
    for (int s = 0; s < 2; s++) {
        if (!json_is_object(sides[s])) continue;
        const char *k;
        json_t *val;
        json_object_foreach((json_t *)sides[s], k, val) {
            level_pair p = pair_of(v, old_m, new_m, k);
            if (!pair_changed(&p)) continue;
            if (users) {
                /* Another user at or above the sender's level cannot be changed. */
                if (p.had && !is(k, sender) && p.old_v >= mine) return false;
                if (p.has && p.new_v > mine) return false;
            } else if (!level_change_ok(&p, mine)) {
                return false;
            }
        }
    }
    return true;
}

static bool allows_power_levels(const room_auth_state *st, const char *sender,
                                const json_t *content, char why[ROOM_AUTH_WHY_LEN])
{
    const room_version *v = st->version;
    if (!power_levels_well_formed(v, !st->pdu, content, why)) return false;
    if (!st->power_levels) return true;
    int64_t mine = room_auth_user_level(st, sender);
    for (size_t i = 0; PL_LEVEL_KEYS[i]; i++) {
        level_pair p = pair_of(v, st->power_levels, content, PL_LEVEL_KEYS[i]);
        if (!level_change_ok(&p, mine))
            return refuse(why, "You cannot change \"%s\" beyond your own power level",
                          PL_LEVEL_KEYS[i]);
    }
    if (!map_changes_ok(v, json_object_get(st->power_levels, "events"),
                        json_object_get(content, "events"), mine, false, sender))
        return refuse(why, "You cannot change event levels beyond your own power level");
    if (v->notifications_power_levels &&
        !map_changes_ok(v, json_object_get(st->power_levels, "notifications"),
                        json_object_get(content, "notifications"), mine, false, sender))
        return refuse(why, "You cannot change notification levels beyond your own power level");
    if (!map_changes_ok(v, json_object_get(st->power_levels, "users"),
                        json_object_get(content, "users"), mine, true, sender))
        return refuse(why, "You cannot change the level of a user at or above your own, or "
                           "raise anyone above it");
    return true;
}

/* ---- m.room.redaction (v1-2) -------------------------------------------------------- */

static bool allows_redaction_v1(const room_auth_state *st, const char *sender,
                                char why[ROOM_AUTH_WHY_LEN])
{
    if (room_auth_user_level(st, sender) >= room_auth_action_level(st, "redact")) return true;
    /* The local write path knows no PDU yet; it allows a redaction only of the sender's
     * own events or with the redact level (room_auth_may_redact), both allowed here. */
    if (!st->pdu) return true;
    const char *own = st->pdu ? json_string_value(json_object_get(st->pdu, "event_id")) : NULL;
    const char *target = st->pdu ? json_string_value(json_object_get(st->pdu, "redacts")) : NULL;
    if (own && target && strcmp(event_id_domain(own), event_id_domain(target)) == 0 &&
        event_id_domain(own)[0])
        return true;
    return refuse(why, "You may redact only events of your own server");
}

/* ---- the rules ---------------------------------------------------------------------- */

bool room_auth_allows(const room_auth_state *st, const char *type, const char *state_key,
                      const char *sender, const json_t *content, char why[ROOM_AUTH_WHY_LEN])
{
    why[0] = '\0';
    const room_version *v = st->version;
    if (!v || !type || !sender || !json_is_object(content)) return refuse(why, "Malformed event");
    if (strcmp(type, "m.room.create") == 0) {
        if (!is(state_key, "")) return refuse(why, "The create event's state key must be empty");
        return allows_create(st, sender, content, why);
    }
    if (!st->create) return refuse(why, "The room has no create event");
    const char *create_sender = json_string_value(json_object_get(st->create, "sender"));
    json_t *federate = json_object_get(json_object_get(st->create, "content"), "m.federate");
    if (json_is_false(federate) && strcmp(room_auth_domain(sender), room_auth_domain(create_sender)) != 0)
        return refuse(why, "This room does not federate");
    if (v->aliases_auth_rule && strcmp(type, "m.room.aliases") == 0) {
        if (!state_key) return refuse(why, "m.room.aliases needs a state key");
        if (strcmp(room_auth_domain(sender), state_key) != 0)
            return refuse(why, "m.room.aliases may be set only for the sender's own server");
        return true;
    }
    if (strcmp(type, "m.room.member") == 0) return allows_member(st, state_key, sender, content, why);
    if (!is(st->sender_membership, "join")) return refuse(why, "You are not in this room");
    if (strcmp(type, "m.room.third_party_invite") == 0) {
        if (room_auth_user_level(st, sender) >= room_auth_action_level(st, "invite")) return true;
        return refuse(why, "You do not have permission to invite users");
    }
    if (room_auth_user_level(st, sender) < room_auth_event_level(st, type, state_key != NULL))
        return refuse(why, "You do not have permission to send %.64s events", type);
    if (state_key && state_key[0] == '@' && strcmp(state_key, sender) != 0)
        return refuse(why, "Only %.64s may set state under their own user ID", state_key);
    if (strcmp(type, "m.room.power_levels") == 0 && is(state_key, ""))
        return allows_power_levels(st, sender, content, why);
    if (v->redaction_auth_rule && strcmp(type, "m.room.redaction") == 0)
        return allows_redaction_v1(st, sender, why);
    return true;
}

bool room_auth_may_redact(const room_auth_state *st, const char *sender,
                          const char *original_sender)
{
    if (is(sender, original_sender)) return true;
    return room_auth_user_level(st, sender) >= room_auth_action_level(st, "redact");
}

/* ---- a whole event against a state ---------------------------------------------------- */

bool room_auth_check_event(const room_version *v, const json_t *pdu, room_state_get_fn get,
                           void *ctx, char why[ROOM_AUTH_WHY_LEN])
{
    why[0] = '\0';
    const char *type = json_string_value(json_object_get(pdu, "type"));
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    const char *state_key = event_state_key(pdu);
    const json_t *content = json_object_get(pdu, "content");
    if (!v || !type || !sender) return refuse(why, "Malformed event");
    room_auth_state st = {.version = v, .pdu = pdu, .get = get, .get_ctx = ctx};
    st.create = get(ctx, "m.room.create", "");
    const json_t *pl = get(ctx, "m.room.power_levels", "");
    const json_t *jr = get(ctx, "m.room.join_rules", "");
    st.power_levels = pl ? json_object_get(pl, "content") : NULL;
    st.join_rules = jr ? json_object_get(jr, "content") : NULL;
    st.sender_membership = membership_of(get(ctx, "m.room.member", sender));
    bool member = strcmp(type, "m.room.member") == 0;
    if (member && state_key) st.target_membership = membership_of(get(ctx, "m.room.member", state_key));
    /* The creator's first join: its only previous event is the create event. */
    const json_t *prev = json_object_get(pdu, "prev_events");
    if (st.create && json_is_array(prev) && json_array_size(prev) == 1) {
        char create_id[EVENT_ID_LEN];
        const char *prev_id = event_ref_id(json_array_get(prev, 0));
        st.only_create = prev_id && event_compute_id(v, st.create, create_id) == 0 &&
                         strcmp(prev_id, create_id) == 0;
    }
    return room_auth_allows(&st, type, state_key, sender, content, why);
}

/* ---- the event's own auth events (rule 2) --------------------------------------------- */

/* Does auth events selection pick (type, state_key) for pdu? */
static bool selected(const room_version *v, const json_t *pdu, const char *type, const char *sk)
{
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    if (is(type, "m.room.create") || is(type, "m.room.power_levels")) return is(sk, "");
    if (is(type, "m.room.member") && is(sk, sender)) return true;
    const char *ev_type = json_string_value(json_object_get(pdu, "type"));
    if (!is(ev_type, "m.room.member")) return false;
    const json_t *content = json_object_get(pdu, "content");
    const char *membership = json_string_value(json_object_get(content, "membership"));
    if (is(type, "m.room.member") && is(sk, event_state_key(pdu))) return true;
    bool joinish = is(membership, "join") || is(membership, "invite") || is(membership, "knock");
    if (is(type, "m.room.join_rules")) return joinish && is(sk, "");
    if (is(type, "m.room.third_party_invite")) {
        const json_t *tpi = json_object_get(content, "third_party_invite");
        const char *token = json_string_value(json_object_get(json_object_get(tpi, "signed"), "token"));
        return is(membership, "invite") && is(sk, token);
    }
    if (is(type, "m.room.member") && v->restricted_join && is(membership, "join"))
        return is(sk, json_string_value(json_object_get(content, "join_authorised_via_users_server")));
    return false;
}

bool room_auth_check_auth_events(const room_version *v, const json_t *pdu,
                                 const json_t *const *auth, size_t n,
                                 char why[ROOM_AUTH_WHY_LEN])
{
    why[0] = '\0';
    const char *type = json_string_value(json_object_get(pdu, "type"));
    if (!v || !type) return refuse(why, "Malformed event");
    if (strcmp(type, "m.room.create") == 0) return true;
    const char *room_id = json_string_value(json_object_get(pdu, "room_id"));
    bool have_create = false;
    for (size_t i = 0; i < n; i++) {
        const char *t = json_string_value(json_object_get(auth[i], "type"));
        const char *sk = event_state_key(auth[i]);
        if (!t || !sk) return refuse(why, "An auth event is not a state event");
        if (!is(json_string_value(json_object_get(auth[i], "room_id")), room_id))
            return refuse(why, "An auth event belongs to another room");
        for (size_t j = 0; j < i; j++)
            if (is(t, json_string_value(json_object_get(auth[j], "type"))) &&
                is(sk, event_state_key(auth[j])))
                return refuse(why, "The auth events hold %.64s twice", t);
        if (!selected(v, pdu, t, sk))
            return refuse(why, "The auth events hold %.64s (%.64s), which this event's auth "
                          "does not depend on", t, sk);
        if (strcmp(t, "m.room.create") == 0) have_create = true;
    }
    if (!have_create) return refuse(why, "The auth events hold no m.room.create");
    return true;
}

const json_t *room_auth_list_get(void *list, const char *type, const char *state_key)
{
    const room_auth_list *l = list;
    for (size_t i = 0; i < l->n; i++)
        if (is(json_string_value(json_object_get(l->events[i], "type")), type) &&
            is(event_state_key(l->events[i]), state_key))
            return l->events[i];
    return NULL;
}
