/*
 * core/client/push/push_rules.h - push rules (push_rules.c): each user's composed rule set
 * (server defaults plus the user's own rules and changes) and the /pushrules endpoints.
 * Evaluating rules against events is push_eval.h; pushers are pushers.h. The routes are
 * registered by the accounts module (core/client/accounts/accounts.c), whose migrations
 * hold the tables. Internal prefix: push_rules_.
 */
#ifndef ATRIUM_CORE_PUSH_RULES_H
#define ATRIUM_CORE_PUSH_RULES_H

#include <jansson.h>
#include <stdbool.h>

#include "core/client/client.h"

/* [req] r->user's composed global rule set ({override, content, room, sender, underride}:
 * the user's rules and changes over the server defaults), read with c (held by the
 * caller). When the stored part cannot be read, *db_ok is false, the failure is logged and
 * the defaults come back. A new reference; NULL only on out of memory. */
json_t *push_rules_for(atrium_req *r, PGconn *c, bool *db_ok);
/* push_rules_for in two halves, for a caller running the statement beside its own work
 * (db_query_send, core/store/db.h): send it on c (false: nothing sent); then give its
 * result to push_rules_take (tuples, or NULL when it failed, logged by the caller;
 * consumed). */
bool push_rules_send(PGconn *c, const char *user) RT_MUST_CHECK;
json_t *push_rules_take(atrium_req *r, PGresult *res, bool *db_ok);

/* The stored rules and changes of many users read in two statements, not two per user:
 * the push sender's members of a room (push_send.c). Users in column 0 of who. NULL when
 * the database could not be read or out of memory. Any thread. */
typedef struct push_rules_batch push_rules_batch;
push_rules_batch *push_rules_batch_read(PGconn *c, PGresult *who);
/* user's composed global rule set from b, as push_rules_for_user's (a user of who; one with
 * nothing stored gets the defaults). A new reference; NULL only on out of memory. */
json_t *push_rules_batch_for(push_rules_batch *b, const char *user);
void push_rules_batch_free(push_rules_batch *b);

/* Register GET/PUT/DELETE /pushrules/... 0 or -1 (logged). */
int push_rules_routes(http_server *s);

#endif
