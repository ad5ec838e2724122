/*
 * core/federation/transport/fed_migrations.h - the federation's tables, applied with db_migrate
 * under the owner FED_MIGRATIONS_OWNER before any federation module starts.
 *
 * One list for everything federation keeps in PostgreSQL (destination backoff, other
 * servers' keys; more join it as later versions), so the versions of one owner ascend in one place.
 * Internal prefix: fed_.
 */
#ifndef ATRIUM_CORE_FED_MIGRATIONS_H
#define ATRIUM_CORE_FED_MIGRATIONS_H

#include <stddef.h>

#include "atrium/host.h"

#define FED_MIGRATIONS_OWNER "federation"

extern const atrium_migration FED_MIGRATIONS[];
extern const size_t FED_N_MIGRATIONS;

#endif
