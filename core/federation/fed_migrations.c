/*
 * core/federation/fed_migrations.c - the federation's schema (see fed_migrations.h). A
 * shipped version never changes; a change is a new version appended here.
 */
#include "core/federation/fed_migrations.h"

const atrium_migration FED_MIGRATIONS[] = {
    /* Per-destination backoff (fed_backoff.h): a row exists only while the destination is
     * in backoff. Times are wall-clock milliseconds: failure_ts is the first failure of the
     * current run, retry_last_ts the latest, and the next attempt is allowed at
     * retry_last_ts + retry_interval_ms. */
    {1, "federation_destinations",
     "CREATE TABLE IF NOT EXISTS federation_destinations ("
     " destination text PRIMARY KEY,"
     " failure_ts bigint,"
     " retry_last_ts bigint NOT NULL DEFAULT 0,"
     " retry_interval_ms bigint NOT NULL DEFAULT 0)"},
};

const size_t FED_N_MIGRATIONS = sizeof(FED_MIGRATIONS) / sizeof(FED_MIGRATIONS[0]);
