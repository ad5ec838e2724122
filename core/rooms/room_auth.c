/*
 * core/rooms/room_auth.c - the authorization rules (see room_auth.h).
 *
 * One function per rule family, in the spec's order: the create event, membership events,
 * then the checks every other event passes (sender joined, type level, user-named state
 * keys), then the power-levels change rules. Each refusal writes the reason a client will
 * read in the M_FORBIDDEN error.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/rooms/room_auth.h"

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

const char *room_auth_creator(const room_auth_state *st)
{
    if (!st->create) return NULL;
    if (st->version->creator_is_sender)
        return json_string_value(json_object_get(st->create, "sender"));
    return json_string_value(json_object_get(json_object_get(st->create, "content"), "creator"));
}

/* An integer member of the power levels, or def when absent or not an integer. */
static int64_t pl_int(const json_t *obj, const char *key, int64_t def)
{
    json_t *v = obj ? json_object_get(obj, key) : NULL;
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : def;
}

int64_t room_auth_user_level(const room_auth_state *st, const char *user_id)
{
    if (!st->power_levels)
        return is(user_id, room_auth_creator(st)) ? ROOM_AUTH_CREATOR_LEVEL_NO_PL : 0;
    json_t *users = json_object_get(st->power_levels, "users");
    json_t *v = json_is_object(users) ? json_object_get(users, user_id) : NULL;
    if (json_is_integer(v)) return json_integer_value(v);
    return pl_int(st->power_levels, "users_default", 0);
}

int64_t room_auth_event_level(const room_auth_state *st, const char *type, bool is_state)
{
    if (!st->power_levels) return is_state ? ROOM_AUTH_STATE_DEFAULT_NO_PL : 0;
    json_t *events = json_object_get(st->power_levels, "events");
    json_t *v = json_is_object(events) ? json_object_get(events, type) : NULL;
    if (json_is_integer(v)) return json_integer_value(v);
    return is_state ? pl_int(st->power_levels, "state_default", ROOM_AUTH_STATE_DEFAULT)
                    : pl_int(st->power_levels, "events_default", 0);
}

int64_t room_auth_action_level(const room_auth_state *st, const char *action)
{
    int64_t def = strcmp(action, "invite") == 0 ? ROOM_AUTH_INVITE_DEFAULT : ROOM_AUTH_ACTION_DEFAULT;
    return pl_int(st->power_levels, action, def);
}

/* ---- m.room.create ------------------------------------------------------------------ */

static bool allows_create(const room_auth_state *st, const char *sender, const json_t *content,
                          char why[ROOM_AUTH_WHY_LEN])
{
    if (st->create) return refuse(why, "The room already has a create event");
    if (!room_auth_domain(sender)[0]) return refuse(why, "The creator is not a user ID");
    json_t *ver = json_object_get(content, "room_version");
    if (ver && (!json_is_string(ver) || !room_version_find(json_string_value(ver))))
        return refuse(why, "Unsupported room version");
    if (!st->version->creator_is_sender && !json_is_string(json_object_get(content, "creator")))
        return refuse(why, "The create event lacks a creator");
    return true;
}

/* ---- m.room.member ------------------------------------------------------------------ */

static bool allows_join(const room_auth_state *st, const char *target, const char *sender,
                        char why[ROOM_AUTH_WHY_LEN])
{
    if (st->only_create && is(target, room_auth_creator(st))) return true;
    if (!is(sender, target)) return refuse(why, "You cannot join someone else to a room");
    if (is(st->target_membership, "ban")) return refuse(why, "You are banned from this room");
    const char *rule = st->join_rules ? json_string_value(json_object_get(st->join_rules, "join_rule"))
                                      : NULL;
    if (is(rule, "public")) return true;
    if (is(rule, "invite") || is(rule, "knock") || is(rule, "restricted") ||
        is(rule, "knock_restricted")) {
        if (is(st->target_membership, "join") || is(st->target_membership, "invite")) return true;
        return refuse(why, "You are not invited to this room");
    }
    return refuse(why, "This room cannot be joined");
}

static bool allows_invite(const room_auth_state *st, const char *sender, const json_t *content,
                          char why[ROOM_AUTH_WHY_LEN])
{
    if (json_object_get(content, "third_party_invite"))
        return refuse(why, "Third-party invites are not supported");
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
            is(st->target_membership, "knock"))
            return true;
        return refuse(why, "You are not in this room");
    }
    if (!is(st->sender_membership, "join")) return refuse(why, "You are not in this room");
    int64_t mine = room_auth_user_level(st, sender), theirs = room_auth_user_level(st, target);
    if (is(st->target_membership, "ban") && mine < room_auth_action_level(st, "ban"))
        return refuse(why, "You do not have permission to unban users");
    if (is(st->target_membership, "ban")) return true; /* unban: ban level and above */
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
    const char *rule = st->join_rules ? json_string_value(json_object_get(st->join_rules, "join_rule"))
                                      : NULL;
    if (!is(rule, "knock") && !is(rule, "knock_restricted"))
        return refuse(why, "This room does not accept knocks");
    if (!is(sender, target)) return refuse(why, "You cannot knock for someone else");
    if (is(st->target_membership, "ban") || is(st->target_membership, "join"))
        return refuse(why, "You cannot knock on this room");
    return true;
}

static bool allows_member(const room_auth_state *st, const char *target, const char *sender,
                          const json_t *content, char why[ROOM_AUTH_WHY_LEN])
{
    const char *membership = json_string_value(json_object_get(content, "membership"));
    if (!target || !membership) return refuse(why, "A membership event needs a state key and a membership");
    if (target[0] != '@' || !strchr(target, ':'))
        return refuse(why, "The state key of a membership event must be a user ID");
    if (json_object_get(content, "join_authorised_via_users_server"))
        return refuse(why, "Restricted joins are not supported");
    if (strcmp(membership, "join") == 0) return allows_join(st, target, sender, why);
    if (strcmp(membership, "invite") == 0) return allows_invite(st, sender, content, why);
    if (strcmp(membership, "leave") == 0) return allows_leave(st, target, sender, why);
    if (strcmp(membership, "ban") == 0) return allows_ban(st, target, sender, why);
    if (strcmp(membership, "knock") == 0) return allows_knock(st, target, sender, why);
    return refuse(why, "Unknown membership \"%.32s\"", membership);
}

/* ---- m.room.power_levels ------------------------------------------------------------ */

static const char *const PL_LEVEL_KEYS[] = {"users_default", "events_default", "state_default",
                                            "ban", "redact", "kick", "invite", NULL};

/* v10+: every level must be an integer; users keys must be user IDs. */
static bool power_levels_well_formed(const json_t *content, char why[ROOM_AUTH_WHY_LEN])
{
    for (size_t i = 0; PL_LEVEL_KEYS[i]; i++) {
        json_t *v = json_object_get(content, PL_LEVEL_KEYS[i]);
        if (v && !json_is_integer(v)) return refuse(why, "\"%s\" must be an integer", PL_LEVEL_KEYS[i]);
    }
    static const char *const MAPS[] = {"events", "users", "notifications", NULL};
    for (size_t i = 0; MAPS[i]; i++) {
        json_t *m = json_object_get(content, MAPS[i]);
        if (!m) continue;
        if (!json_is_object(m)) return refuse(why, "\"%s\" must be an object", MAPS[i]);
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) {
            if (!json_is_integer(v)) return refuse(why, "Levels in \"%s\" must be integers", MAPS[i]);
            if (i == 1 && (k[0] != '@' || !strchr(k, ':')))
                return refuse(why, "\"users\" keys must be user IDs");
        }
    }
    return true;
}

/* A changed level must be within the sender's reach on both sides. */
static bool level_change_ok(const json_t *old_v, const json_t *new_v, int64_t mine)
{
    if (json_equal((json_t *)old_v, (json_t *)new_v)) return true;
    if (old_v && json_integer_value(old_v) > mine) return false;
    if (new_v && json_integer_value(new_v) > mine) return false;
    return true;
}

static bool map_changes_ok(const json_t *old_m, const json_t *new_m, int64_t mine, bool users,
                           const char *sender)
{
    const json_t *sides[2] = {old_m, new_m};
    for (int s = 0; s < 2; s++) {
        if (!json_is_object(sides[s])) continue;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)sides[s], k, v) {
            json_t *ov = json_is_object(old_m) ? json_object_get(old_m, k) : NULL;
            json_t *nv = json_is_object(new_m) ? json_object_get(new_m, k) : NULL;
            if (json_equal(ov, nv)) continue;
            if (users) {
                /* Another user at or above the sender's level cannot be changed. */
                if (ov && !is(k, sender) && json_integer_value(ov) >= mine) return false;
                if (nv && json_integer_value(nv) > mine) return false;
            } else if (!level_change_ok(ov, nv, mine)) {
                return false;
            }
        }
    }
    return true;
}

static bool allows_power_levels(const room_auth_state *st, const char *sender,
                                const json_t *content, char why[ROOM_AUTH_WHY_LEN])
{
    if (!power_levels_well_formed(content, why)) return false;
    if (!st->power_levels) return true;
    int64_t mine = room_auth_user_level(st, sender);
    for (size_t i = 0; PL_LEVEL_KEYS[i]; i++)
        if (!level_change_ok(json_object_get(st->power_levels, PL_LEVEL_KEYS[i]),
                             json_object_get(content, PL_LEVEL_KEYS[i]), mine))
            return refuse(why, "You cannot change \"%s\" beyond your own power level",
                          PL_LEVEL_KEYS[i]);
    if (!map_changes_ok(json_object_get(st->power_levels, "events"), json_object_get(content, "events"),
                        mine, false, sender))
        return refuse(why, "You cannot change event levels beyond your own power level");
    if (!map_changes_ok(json_object_get(st->power_levels, "users"), json_object_get(content, "users"),
                        mine, true, sender))
        return refuse(why, "You cannot change the level of a user at or above your own, or "
                           "raise anyone above it");
    return true;
}

/* ---- the rules ---------------------------------------------------------------------- */

bool room_auth_allows(const room_auth_state *st, const char *type, const char *state_key,
                      const char *sender, const json_t *content, char why[ROOM_AUTH_WHY_LEN])
{
    why[0] = '\0';
    if (!type || !sender || !json_is_object(content)) return refuse(why, "Malformed event");
    if (strcmp(type, "m.room.create") == 0) {
        if (!is(state_key, "")) return refuse(why, "The create event's state key must be empty");
        return allows_create(st, sender, content, why);
    }
    if (!st->create) return refuse(why, "The room has no create event");
    const char *create_sender = json_string_value(json_object_get(st->create, "sender"));
    json_t *federate = json_object_get(json_object_get(st->create, "content"), "m.federate");
    if (json_is_false(federate) && strcmp(room_auth_domain(sender), room_auth_domain(create_sender)) != 0)
        return refuse(why, "This room does not federate");
    if (strcmp(type, "m.room.member") == 0) return allows_member(st, state_key, sender, content, why);
    if (!is(st->sender_membership, "join")) return refuse(why, "You are not in this room");
    if (room_auth_user_level(st, sender) < room_auth_event_level(st, type, state_key != NULL))
        return refuse(why, "You do not have permission to send %.64s events", type);
    if (state_key && state_key[0] == '@' && strcmp(state_key, sender) != 0)
        return refuse(why, "Only %.64s may set state under their own user ID", state_key);
    if (strcmp(type, "m.room.power_levels") == 0 && is(state_key, ""))
        return allows_power_levels(st, sender, content, why);
    return true;
}

bool room_auth_may_redact(const room_auth_state *st, const char *sender,
                          const char *original_sender)
{
    if (is(sender, original_sender)) return true;
    return room_auth_user_level(st, sender) >= room_auth_action_level(st, "redact");
}

/* ---- a whole event against a state ---------------------------------------------------- */

static const char *membership_of(const json_t *member_event)
{
    return json_string_value(json_object_get(json_object_get(member_event, "content"),
                                             "membership"));
}

bool room_auth_check_event(const room_version *v, const json_t *pdu, room_state_get_fn get,
                           void *ctx, char why[ROOM_AUTH_WHY_LEN])
{
    why[0] = '\0';
    const char *type = json_string_value(json_object_get(pdu, "type"));
    const char *sender = json_string_value(json_object_get(pdu, "sender"));
    const char *state_key = event_state_key(pdu);
    const json_t *content = json_object_get(pdu, "content");
    if (!v || !type || !sender) return refuse(why, "Malformed event");
    room_auth_state st = {.version = v};
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
        const json_t *p0 = json_array_get(prev, 0);
        const char *prev_id = json_is_string(p0) ? json_string_value(p0)
                                                 : json_string_value(json_array_get(p0, 0));
        st.only_create = prev_id && event_compute_id(v, st.create, create_id) == 0 &&
                         strcmp(prev_id, create_id) == 0;
    }
    return room_auth_allows(&st, type, state_key, sender, content, why);
}
