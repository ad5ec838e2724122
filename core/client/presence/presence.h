/*
 * core/client/presence/presence.h - presence (online, unavailable, offline) as /sync needs
 * it: the mark a sync leaves (set_presence). The endpoints and the sync section live in
 * presence.c. Internal prefix: presence_.
 */
#ifndef ATRIUM_CORE_PRESENCE_H
#define ATRIUM_CORE_PRESENCE_H

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

/* Is set_presence one of the values a sync may give ("online", "unavailable",
 * "offline")? */
bool presence_sync_value_ok(const char *set_presence);
/* [req] What a sync with set_presence (NULL = "online") says about user_id: "offline"
 * leaves the presence alone, "online" / "unavailable" mark the user so, active now. A
 * change of the state others see takes a stream position and wakes the user's contacts;
 * otherwise at most one write per PRESENCE_ACTIVE_REFRESH_MS. Nothing when presence is off.
 * c: a connection the caller holds. 0, or ATRIUM_E_DB (logged; the sync goes on). */
int presence_sync_mark(PGconn *c, const char *user_id, const char *set_presence);

/* The content of an m.presence event (and of GET /presence) for one row of the presence
 * table (status_msg may be NULL), as seen at now (milliseconds of the wall clock). A new
 * object; NULL on OOM. Shared with the application services' transactions (as_sender.c). */
json_t *presence_content(const char *state, const char *status_msg, int64_t last_active_ts,
                         int64_t now);

#endif
