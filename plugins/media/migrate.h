/*
 * plugins/media/migrate.h - moving a library between the local folder and the object
 * store (migrate.c), for the program atrium-media-migrate (migrate_cli.c).
 */
#ifndef MEDIA_MIGRATE_H
#define MEDIA_MIGRATE_H

#include <stdbool.h>
#include <stdint.h>

#include "media.h"

/* One run: set m, db and to_s3, zero the rest; the counts are what the run did. */
typedef struct migrate_run {
    media *m;    /* a command's plugin object with its store client (s3_client_init) */
    PGconn *db;  /* the server's database (read only) */
    bool to_s3;  /* true: local folder -> bucket; false: bucket -> local folder */
    bool catching_up; /* walking again the rows uploaded during the run */
    char *buf;   /* MEDIA_HASH_READ_BYTES, for hashing files */
    int64_t originals, copied, present; /* rows walked, copied, found already there */
    int64_t thumbs, thumbs_copied, thumbs_present;
    int64_t bytes;    /* copied */
    int64_t problems; /* listed on stdout */
} migrate_run;

/* Copy every original and thumbnail to the destination, skipping what is already there,
 * each copy checked (migrate.c says how). Prints a line per copy and per problem on stdout.
 * 0 when the walk ended (problems may have been found: r->problems), or -1 with err set
 * when the store or the database failed (run again: it goes on). */
int migrate_library(migrate_run *r, char *err, size_t errlen);

#endif
