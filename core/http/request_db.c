/*
 * core/http/request_db.c - a request's connection from the shared pool (see http.h).
 *
 * Every part of the core that answers clients borrowed its connection the same way: wait
 * the configured request wait (database.checkout_timeout_ms) and, when none comes, answer
 * 503 "busy; retry". That one rule lives here. What this file does not do: run statements
 * (core/store/db_exec.c) or decide what a failed statement answers.
 */
#include "core/http/http.h"

PGconn *http_db_checkout(atrium_req *r)
{
    PGconn *c = db_acquire(db_global(), DB_WAIT_CONFIGURED);
    if (!c) http_respond_error(r, 503, "M_UNKNOWN", "The database is busy; retry");
    return c;
}

void http_db_checkin(PGconn *c)
{
    db_release(db_global(), c);
}
