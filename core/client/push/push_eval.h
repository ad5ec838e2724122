/*
 * core/client/push/push_eval.h - evaluating a user's push rules against one event: which rule
 * decides, whether the event notifies and whether it highlights (spec v1.11, "Push
 * rules"). /sync's unread_notifications counts come from here.
 *
 * The evaluator is pure: no database, no request, no globals. The caller gives it the
 * user's composed global rule set (push_rules.c, push_rules_for), the event in the
 * federation (PDU) format as stored, and what the conditions read about the room. It
 * pushes nothing anywhere: the push sender (push_send.c) does.
 * Internal prefix: push_.
 */
#ifndef ATRIUM_CORE_PUSH_EVAL_H
#define ATRIUM_CORE_PUSH_EVAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define PUSH_MAX_PATTERN_BYTES 512   /* longer glob patterns and display names never match */
#define PUSH_MAX_KEY_BYTES 512       /* longer dotted keys never match */
#define PUSH_MAX_KEY_DEPTH 16        /* dotted keys with more components never match */
#define PUSH_MAX_STEPS 2000000       /* matching work for one event; past it nothing matches */
#define PUSH_DEFAULT_NOTIFY_LEVEL 50 /* notifications.<key> when the room does not set it */
#define PUSH_CREATOR_LEVEL 100       /* the creator's level in a room without power levels */

/* What the conditions read about the room and the user; every pointer is borrowed. */
typedef struct push_room {
    const char *display_name;   /* the user's current display name in the room; NULL or ""
                                 * when none (contains_display_name then never matches) */
    int64_t member_count;       /* joined members (room_member_count) */
    const json_t *power_levels; /* content of the room's m.room.power_levels, or NULL */
    const char *creator;        /* the room's creator (power without power_levels), or NULL */
} push_room;

/* The verdict for one event. rule_id points into the rule set (NULL when no rule matched:
 * no notification). highlight is only ever true together with notify. */
typedef struct push_outcome {
    bool notify;
    bool highlight;
    const char *rule_id;
    bool out_of_steps; /* PUSH_MAX_STEPS ran out: the verdict may have missed a rule */
} push_outcome;

/*
 * Evaluate global ({"override": [...], "content": [...], "room": [...], "sender": [...],
 * "underride": [...]}) against event for the rule set's owner. Kinds are tried in that
 * order, rules in array order; the first enabled rule that matches decides through its
 * actions: "notify" notifies, {"set_tweak": "highlight"} without a value or with value
 * true highlights; everything else ("dont_notify", sounds, no actions) does neither.
 * The legacy mention rules (.m.rule.contains_display_name, .m.rule.contains_user_name,
 * .m.rule.roomnotif) are skipped for events whose content has m.mentions (v1.7).
 * A rule of an unknown shape, or with a condition of an unknown kind, does not match.
 * Never fails: odd JSON anywhere makes rules not match (and so does running out of
 * memory). Any thread; no allocation that outlives the call.
 */
push_outcome push_eval(const json_t *global, const json_t *event, const push_room *room);

/* The same rule set read once for many events (push_eval reads it at every call): /sync
 * judges up to SYNC_MAX_UNREAD_COUNT events a room with one user's rules. A program holds
 * a reference to global (the outcomes' rule_id point into it) and is never changed by a
 * run, so threads may share one. NULL on out of memory; a NULL program matches nothing. */
typedef struct push_program push_program;
push_program *push_program_new(const json_t *global);
push_outcome push_program_run(const push_program *p, const json_t *event, const push_room *room);
void push_program_free(push_program *p);

#endif
