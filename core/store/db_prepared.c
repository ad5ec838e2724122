/*
 * core/store/db_prepared.c - the core's statements, prepared once per connection
 * (docs/adr/0035-prepared-statements-per-connection.md).
 *
 * PostgreSQL plans a statement sent with PQexecParams every time it arrives, and for the
 * core's short, hot statements planning costs more than running (a token lookup: 0.1 ms to
 * run, 1-7 ms to plan). db_query sends each distinct SQL text once per connection as a
 * named prepared statement (PQprepare) and from then on only executes it
 * (PQexecPrepared), so PostgreSQL keeps the plan, and after five runs may keep a generic
 * one. What a caller sees does not change: the same PGresult, and when preparing fails (a
 * syntax error, an aborted transaction, a lost connection) the statement goes through
 * PQexecParams as before, so its error reads exactly as it always did.
 *
 * The cache of a connection hangs on the PGconn itself through libpq's event API
 * (PQregisterEventProc, PQinstanceData): it is created when the connection is attached (the
 * pool does it for each connection it opens; db_query does it for any other connection
 * the first time), emptied when libpq resets the connection (the server forgot every
 * statement) and freed with it. No global map keyed by pointers a new connection could
 * reuse, and no lock: a connection belongs to one thread at a time (db_acquire). Entries
 * are keyed by the SQL text (hash, then compare), since some SQL is built at run time. A
 * cache holds at most DB_PREPARED_MAX statements; a statement beyond it runs unprepared
 * (counted), since evicting would cost a DEALLOCATE round trip and the core's distinct
 * statements number a few hundred. Statements are session objects in PostgreSQL: a
 * transaction that rolls back after a statement was prepared in it leaves it prepared.
 */
#include <libpq-events.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/store/db.h"

/* Open addressing over twice the bound, so a full cache still probes short runs. */
#define DB_PREPARED_SLOTS (2 * DB_PREPARED_MAX)
#define DB_PREPARED_NAME_BYTES 24
/* SQLSTATE invalid_sql_statement_name: the server no longer has a statement we named (a
 * DISCARD ALL or DEALLOCATE ALL the core never sends, but a plugin on the connection may). */
#define DB_SQLSTATE_NO_STATEMENT "26000"

typedef struct {
    uint64_t hash;
    char *sql; /* NULL: free slot */
    char name[DB_PREPARED_NAME_BYTES];
} prep_entry;

/* Statements a pipeline sent unprepared (a statement cannot be prepared in one), prepared
 * when it ends: at most DB_PIPELINE_LATER (db.h). */
typedef struct {
    char *sql;
    int n;
} prep_later;

typedef struct {
    const db_prepared_stats *stats; /* the pool's metrics, or NULL */
    int count;
    unsigned next_id;
    prep_entry slots[DB_PREPARED_SLOTS];
    prep_later later[DB_PIPELINE_LATER];
    int n_later;
} prep_cache;

static void cache_forget_all(prep_cache *pc)
{
    for (int i = 0; i < DB_PREPARED_SLOTS; i++) {
        free(pc->slots[i].sql);
        pc->slots[i].sql = NULL;
    }
    if (pc->stats) rt_metric_add(pc->stats->statements, -pc->count);
    pc->count = 0;
}

static int event_proc(PGEventId id, void *info, void *pass_through)
{
    switch (id) {
    case PGEVT_REGISTER: {
        PGconn *c = ((PGEventRegister *)info)->conn;
        prep_cache *pc = calloc(1, sizeof(*pc));
        if (!pc) return 0; /* registration fails: db_query runs unprepared */
        pc->stats = pass_through;
        return PQsetInstanceData(c, event_proc, pc);
    }
    case PGEVT_CONNRESET: {
        prep_cache *pc = PQinstanceData(((PGEventConnReset *)info)->conn, event_proc);
        if (pc) cache_forget_all(pc);
        return 1;
    }
    case PGEVT_CONNDESTROY: {
        PGconn *c = ((PGEventConnDestroy *)info)->conn;
        prep_cache *pc = PQinstanceData(c, event_proc);
        if (pc) {
            cache_forget_all(pc);
            for (int i = 0; i < pc->n_later; i++) free(pc->later[i].sql);
            free(pc);
            PQsetInstanceData(c, event_proc, NULL);
        }
        return 1;
    }
    default:
        return 1;
    }
}

bool db_prepared_attach(PGconn *c, const db_prepared_stats *stats)
{
    if (!c) return false;
    if (PQinstanceData(c, event_proc)) return true;
    return PQregisterEventProc(c, event_proc, "atrium_prepared", (void *)stats) != 0;
}

int db_prepared_count(const PGconn *c)
{
    const prep_cache *pc = c ? PQinstanceData(c, event_proc) : NULL;
    return pc ? pc->count : 0;
}

/* The slot holding sql, or the free slot where it belongs. */
static prep_entry *cache_slot(prep_cache *pc, const char *sql, uint64_t h)
{
    size_t i = (size_t)(h % DB_PREPARED_SLOTS);
    for (;;) {
        prep_entry *e = &pc->slots[i];
        if (!e->sql || (e->hash == h && strcmp(e->sql, sql) == 0)) return e;
        i = (i + 1) % DB_PREPARED_SLOTS;
    }
}

/* Prepare sql under a new name into e (a free slot); false when the server refused it (the
 * caller then runs it unprepared, for its error to read as before) or memory ran out. */
static bool cache_prepare(PGconn *c, prep_cache *pc, prep_entry *e, const char *sql,
                          uint64_t h, int n)
{
    char name[DB_PREPARED_NAME_BYTES];
    snprintf(name, sizeof(name), "atrium_%u", pc->next_id);
    char *copy = strdup(sql);
    if (!copy) return false;
    /* paramTypes NULL: the server infers each parameter's type from the statement, exactly
     * as it does for PQexecParams with NULL types. */
    PGresult *res = PQprepare(c, name, sql, n, NULL);
    bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
    PQclear(res);
    if (!ok) {
        free(copy);
        return false;
    }
    pc->next_id++;
    e->hash = h;
    e->sql = copy;
    memcpy(e->name, name, sizeof(name));
    pc->count++;
    if (pc->stats) rt_metric_add(pc->stats->statements, 1);
    return true;
}

/* The prepared statement of sql on c (prepared now if it is not yet), or NULL when sql
 * runs unprepared (no cache, cache off or full, or the server refused to prepare it). */
static const prep_entry *prepared(PGconn *c, const char *sql, int n)
{
    prep_cache *pc = NULL;
    if (db_prepared_attach(c, NULL)) pc = PQinstanceData(c, event_proc);
    if (!pc || (pc->stats && pc->stats->off)) return NULL;
    uint64_t h = rt_text_hash(sql);
    prep_entry *e = cache_slot(pc, sql, h);
    if (e->sql) return e;
    if (pc->count >= DB_PREPARED_MAX) {
        if (pc->stats) rt_metric_add(pc->stats->unprepared, 1);
        return NULL;
    }
    if (PQpipelineStatus(c) != PQ_PIPELINE_OFF) { /* prepared when the pipeline ends */
        char *copy = pc->n_later < DB_PIPELINE_LATER ? strdup(sql) : NULL;
        if (copy) pc->later[pc->n_later++] = (prep_later){copy, n};
        return NULL;
    }
    return cache_prepare(c, pc, e, sql, h, n) ? e : NULL;
}

/* After a result of a prepared statement: a server that no longer knows c's statements
 * makes c's cache forget them all. */
static void check_forgotten(PGconn *c, const PGresult *res)
{
    const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
    prep_cache *pc = PQinstanceData(c, event_proc);
    if (pc && state && strcmp(state, DB_SQLSTATE_NO_STATEMENT) == 0) cache_forget_all(pc);
}

PGresult *db_query(PGconn *c, const char *sql, int n, const char *const *params)
{
    const prep_entry *e = prepared(c, sql, n);
    if (!e) return PQexecParams(c, sql, n, NULL, params, NULL, NULL, 0);
    PGresult *res = PQexecPrepared(c, e->name, n, params, NULL, NULL, 0);
    check_forgotten(c, res);
    return res;
}

bool db_query_send(PGconn *c, const char *sql, int n, const char *const *params)
{
    const prep_entry *e = prepared(c, sql, n);
    return e ? PQsendQueryPrepared(c, e->name, n, params, NULL, NULL, 0) == 1
             : PQsendQueryParams(c, sql, n, NULL, params, NULL, NULL, 0) == 1;
}

PGresult *db_query_result(PGconn *c)
{
    PGresult *last = NULL, *res;
    while ((res = PQgetResult(c))) { /* one statement: its result, then NULL */
        PQclear(last);
        last = res;
    }
    if (last) check_forgotten(c, last);
    return last;
}

bool db_pipeline_begin(PGconn *c)
{
    return PQenterPipelineMode(c) == 1;
}

bool db_pipeline_sync(PGconn *c)
{
    return PQpipelineSync(c) == 1;
}

void db_pipeline_end(PGconn *c)
{
    /* What was not taken yet, up to the sync point (each statement's results end with a
     * NULL; two in a row: nothing more will come, the connection broke). */
    for (int nulls = 0; nulls < 2;) {
        PGresult *res = PQgetResult(c);
        if (!res) {
            nulls++;
            continue;
        }
        nulls = 0;
        bool sync = PQresultStatus(res) == PGRES_PIPELINE_SYNC;
        PQclear(res);
        if (sync) break;
    }
    if (PQexitPipelineMode(c) != 1) {
        /* Left in pipeline mode, the connection would fail every later caller: make it
         * broken instead, for the pool's monitor to replace (db.h). */
        shutdown(PQsocket(c), SHUT_RDWR);
        PQconsumeInput(c);
    }
    prep_cache *pc = PQinstanceData(c, event_proc);
    for (int i = 0; pc && i < pc->n_later; i++) {
        uint64_t h = rt_text_hash(pc->later[i].sql);
        prep_entry *e = cache_slot(pc, pc->later[i].sql, h);
        if (!e->sql && pc->count < DB_PREPARED_MAX && PQpipelineStatus(c) == PQ_PIPELINE_OFF &&
            PQstatus(c) == CONNECTION_OK)
            (void)cache_prepare(c, pc, e, pc->later[i].sql, h, pc->later[i].n);
        free(pc->later[i].sql);
    }
    if (pc) pc->n_later = 0;
}
