/*
 * core/client/reports/reports.h - reporting content: users' reports of events, rooms and
 * users (reports.c), kept in PostgreSQL for the server's admins, who read the event
 * reports through Synapse's admin API (reports_admin.c).
 *
 * The reports module (REPORTS_MODULE, owner "reports") owns one table, `reports`
 * (migration 1): one row per report, its kind ('event', 'room', 'user'), when it was
 * received, the reporter, what was reported (room and event, room, or user), the reason
 * and, for an event, the optional score. Rows are only ever added: this server neither
 * notifies anyone of a report nor deletes one yet. Internal prefix: reports_.
 */
#ifndef ATRIUM_CORE_CLIENT_REPORTS_H
#define ATRIUM_CORE_CLIENT_REPORTS_H

#include "core/client/client.h"

#define REPORTS_MAX_BODY_BYTES (16 * 1024)
/* A reason longer than this (in characters, Unicode code points) is refused with 400
 * M_INVALID_PARAM, never cut: the reporter learns their words were not all kept. */
#define REPORTS_MAX_REASON_CHARS 1000
#define REPORTS_SCORE_MIN (-100) /* the event report's score: -100 (most offensive) .. 0 */
#define REPORTS_SCORE_MAX 0

/* Route registration (reports_admin.c): GET /_synapse/admin/v1/event_reports and
 * /event_reports/{reportId}. 0 or -1 (logged). */
int reports_admin_routes(http_server *s);

#endif
