/*
 * core/store/db_exec.c - one statement, and the three statements of a transaction, on a
 * borrowed connection (see db.h for the contract).
 *
 * Every part of the core ran its statements through a copy of the same few lines (execute,
 * accept a command or rows, log PostgreSQL's message, clear), and every transaction ended
 * in a hand-written ROLLBACK. They live here once, so a failed statement is always logged
 * the same way and a rollback always has the same (quiet) shape. What this file does not
 * do: read rows (each module's query helper returns the PGresult), or retry.
 */
#include <stdio.h>
#include <stdlib.h>

#include "core/store/db.h"

/* How much of a failed statement's text its log line shows, so the operator sees which
 * statement failed without a page of SQL. */
#define DB_EXEC_LOG_SQL_CHARS 60

/* Run sql; true when PostgreSQL accepted it. On failure its message goes to err when err is
 * not NULL, and is logged otherwise. */
static bool exec_statement(PGconn *c, const char *sql, int nparams, const char *const *params,
                           int64_t *affected, char *err, size_t err_len)
{
    PGresult *res = db_query(c, sql, nparams, params);
    ExecStatusType st = PQresultStatus(res);
    bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (ok && affected) {
        *affected = atoll(PQcmdTuples(res));
    } else if (!ok && err) {
        snprintf(err, err_len, "%s", PQresultErrorMessage(res));
    } else if (!ok) {
        rt_log(ATRIUM_LOG_ERROR, "core", "database statement failed (%.*s...): %s",
               DB_EXEC_LOG_SQL_CHARS, sql, PQresultErrorMessage(res));
    }
    PQclear(res);
    return ok;
}

bool db_exec(PGconn *c, const char *sql, int nparams, const char *const *params)
{
    return exec_statement(c, sql, nparams, params, NULL, NULL, 0);
}

bool db_exec_rows(PGconn *c, const char *sql, int nparams, const char *const *params,
                  int64_t *affected)
{
    return exec_statement(c, sql, nparams, params, affected, NULL, 0);
}

bool db_exec_quiet(PGconn *c, const char *sql, int nparams, const char *const *params,
                   char *err, size_t err_len)
{
    return exec_statement(c, sql, nparams, params, NULL, err, err_len);
}

bool db_begin(PGconn *c)
{
    return db_exec(c, "BEGIN", 0, NULL);
}

bool db_commit(PGconn *c)
{
    return db_exec(c, "COMMIT", 0, NULL);
}

void db_rollback(PGconn *c)
{
    /* Quiet: the failure that led here was logged where it happened, and a ROLLBACK fails
     * only on a lost connection, which db_release hands to the monitor. */
    PQclear(PQexec(c, "ROLLBACK"));
}
