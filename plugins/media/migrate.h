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
    int64_t remote, remote_copied, remote_present, remote_absent; /* cached remote copies */
    int64_t bytes;    /* copied */
    int64_t problems; /* listed on stdout */
} migrate_run;

/* Copy every original and thumbnail to the destination, skipping what is already there,
 * each copy checked (migrate.c says how). Prints a line per copy and per problem on stdout.
 * 0 when the walk ended (problems may have been found: r->problems), or -1 with err set
 * when the store or the database failed (run again: it goes on). */
int migrate_library(migrate_run *r, char *err, size_t errlen);

/* A problem with one object (counted, a line on stdout); the run goes on. */
void migrate_problem(migrate_run *r, const char *kind, const char *name, const char *detail);
/* One object copied and checked (counted, a line on stdout): kind "original", "thumbnail"
 * or "remote". */
void migrate_copied(migrate_run *r, const char *kind, const char *name, int64_t size);
/* The object at key was just sent: read it back whole and compare with want_hex and
 * want_size (a mismatch is a problem and the object is deleted). 0, or -1 when the store
 * failed (the run stops). */
int migrate_check_copy(migrate_run *r, const char *kind, const char *name, const char *key,
                       const char *want_hex, int64_t want_size);
/* migrate_remote.c: every cached remote copy (media_remote, media_remote_thumbnails) the
 * rows name, to the destination, each checked against its row's SHA-256. 0, or -1 with err
 * set when the store or the database failed. */
int migrate_remote_copies(migrate_run *r, char *err, size_t errlen);

#endif
