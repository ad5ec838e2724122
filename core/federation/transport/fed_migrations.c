/*
 * core/federation/transport/fed_migrations.c - the federation's schema (see fed_migrations.h). A
 * shipped version never changes; a change is a new version appended here.
 */
#include "core/federation/transport/fed_migrations.h"

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
    /* Other servers' keys (fed_keyring.h): one row per key, with the effective validity
     * (valid_until_ts capped as the spec says) and the whole signed document, served again
     * when this server answers as a notary. */
    {2, "federation_server_keys",
     "CREATE TABLE federation_server_keys ("
     " server_name text NOT NULL,"
     " key_id text NOT NULL,"
     " public_key text NOT NULL,"       /* unpadded base64 */
     " valid_until_ts bigint NOT NULL," /* ms since the epoch */
     " fetched_ts bigint NOT NULL,"
     " key_json text NOT NULL,"
     " PRIMARY KEY (server_name, key_id))"},
    /* The outbound queue (fed_outbound.c): one row per PDU or EDU per destination, written
     * in the transaction that stored what it carries. txn_id is set when the row is first
     * put in a transaction and kept until that transaction is answered 200, so a retry
     * (after a failure or a restart) resends the same rows under the same ID. kind 0 is a
     * PDU (room_id, event_id: the event is read from events when sent), 1 an EDU (edu_type,
     * content as JSON text). A PDU is queued once per destination. */
    {3, "federation_outbound",
     "CREATE TABLE federation_outbound ("
     " id bigserial PRIMARY KEY,"
     " destination text NOT NULL,"
     " kind smallint NOT NULL,"
     " room_id text,"
     " event_id text,"
     " edu_type text,"
     " content text,"
     " txn_id text,"
     " queued_ts bigint NOT NULL);"
     "CREATE INDEX federation_outbound_dest ON federation_outbound (destination, id);"
     "CREATE UNIQUE INDEX federation_outbound_pdu ON federation_outbound (destination, event_id)"
     " WHERE kind = 0;"},
    /* Inbound transactions answered (fed_inbound.c): a replay of (origin, txn_id) gets the
     * stored answer without being processed again. Rows older than a day are pruned. */
    {4, "federation_inbound_txns",
     "CREATE TABLE federation_inbound_txns ("
     " origin text NOT NULL,"
     " txn_id text NOT NULL,"
     " response text NOT NULL,"
     " received_ts bigint NOT NULL,"
     " PRIMARY KEY (origin, txn_id));"
     "CREATE INDEX federation_inbound_txns_ts ON federation_inbound_txns (received_ts);"},
};

const size_t FED_N_MIGRATIONS = sizeof(FED_MIGRATIONS) / sizeof(FED_MIGRATIONS[0]);
