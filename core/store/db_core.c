/*
 * core/store/db_core.c - the core's own schema, migration owner "core": the server's
 * key/value facts (core_server_info) and the stream positions every per-user stream takes
 * (stream_seq with stream_next() and stream_upto(); see core/client/sync/notifier.h and
 * docs/adr/0003-stream-positions-from-one-sequence.md). Applied at start-up before any
 * client module's or plugin's migrations, which may use them. The tables of the client
 * modules live with their modules (core/rooms/rooms.c, core/client/accounts/accounts.c,
 * core/client/e2ee/e2ee.c).
 */
#include "core/store/db.h"

static const atrium_migration CORE_MIGRATIONS[] = {
    {1, "core_server_info",
     "CREATE TABLE IF NOT EXISTS core_server_info ("
     " key text PRIMARY KEY, value text NOT NULL)"},
    /* One position for every per-user stream: see core/client/sync/notifier.h and
     * docs/adr/0003-stream-positions-from-one-sequence.md. Writers take
     * positions with stream_next(), which holds a shared advisory lock until their
     * transaction ends; stream_upto() takes that lock exclusively for an instant, so the
     * position it returns never passes a row that is not yet committed. */
    {2, "stream_seq",
     "CREATE SEQUENCE stream_seq;"
     "CREATE FUNCTION stream_next() RETURNS bigint LANGUAGE plpgsql AS $f$"
     " BEGIN PERFORM pg_advisory_xact_lock_shared(" DB_LOCK_STREAM ");"
     " RETURN nextval('stream_seq'); END $f$;"
     "CREATE FUNCTION stream_upto() RETURNS bigint LANGUAGE plpgsql AS $f$"
     " DECLARE v bigint; called boolean;"
     " BEGIN PERFORM pg_advisory_xact_lock(" DB_LOCK_STREAM ");"
     " SELECT last_value, is_called INTO v, called FROM stream_seq;"
     " IF called THEN RETURN v; END IF; RETURN 0; END $f$;"},
};

int db_core_migrate(db_pool *p)
{
    return db_migrate(p, "core", CORE_MIGRATIONS,
                      sizeof(CORE_MIGRATIONS) / sizeof(CORE_MIGRATIONS[0]));
}
