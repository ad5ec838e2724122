/*
 * plugins/media/migrate_cli.c - the atrium-media-migrate program: `atrium media migrate
 * --config FILE --to s3|local` (the plugin command, include/atrium/plugin.h) moves the
 * library between plugins.media.store_path and the object store its s3_* settings name,
 * whatever `storage` says, while the server runs (migrate.c). The procedure around it:
 * plugins/media/README.md, "Moving a library".
 *
 *   atrium-media-migrate --conninfo CONNINFO --settings-stdin --to s3|local
 *
 * Exit status: 0 everything is in the destination, checked; 1 some originals could not be
 * copied (listed on stdout); 2 the run stopped (stderr says why: run it again, it goes on).
 */
#include <stdio.h>
#include <string.h>

#include "cli_host.h"
#include "migrate.h"
#include "s3.h"

#define MIGRATE_ERR_LEN 512

static void usage(FILE *f)
{
    fprintf(f, "usage: atrium media migrate --config FILE --to s3|local\n"
               "Copies every original and thumbnail from the local folder to the bucket (s3)\n"
               "or back (local), checking each against its SHA-256; run it again after an\n"
               "interruption and it goes on. The server may run meanwhile.\n");
}

int main(int argc, char **argv)
{
    const char *conninfo = NULL, *to = NULL;
    bool settings = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--conninfo") == 0 && i + 1 < argc) {
            conninfo = argv[++i];
        } else if (strcmp(argv[i], "--settings-stdin") == 0) {
            settings = true;
        } else if (strcmp(argv[i], "--to") == 0 && i + 1 < argc) {
            to = argv[++i];
        } else if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!conninfo || !settings || !to || (strcmp(to, "s3") != 0 && strcmp(to, "local") != 0)) {
        usage(stderr);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* a line per copy, as it happens */
    media m;
    char err[MIGRATE_ERR_LEN] = "";
    if (cli_media_open(&m, stdin, err, sizeof(err)) < 0) {
        fprintf(stderr, "atrium-media-migrate: %s\n", err);
        cli_media_close(&m);
        return 2;
    }
    if (s3_client_init(&m) < 0) { /* logged: which s3_* setting is wrong */
        fprintf(stderr, "atrium-media-migrate: the s3_* settings of plugins.media must name "
                        "the bucket, whatever storage says\n");
        cli_media_close(&m);
        return 2;
    }
    PGconn *db = NULL;
    /* The same look at the bucket as the server's start: a wrong one stops here. */
    if (s3_start(&m) < 0 || cli_media_connect(conninfo, "atrium-media-migrate", &db) < 0) {
        cli_media_close(&m);
        return 2;
    }
    migrate_run r = {.m = &m, .db = db, .to_s3 = strcmp(to, "s3") == 0};
    int rc = migrate_library(&r, err, sizeof(err));
    PQfinish(db);
    cli_media_close(&m);
    printf("%s to %s: %lld originals (%lld copied, %lld already there), %lld thumbnails "
           "(%lld copied, %lld already there), %lld remote copies (%lld copied, %lld already "
           "there, %lld absent), %lld bytes copied, %lld problem(s)\n",
           rc < 0 ? "stopped" : "migrated", to, (long long)r.originals, (long long)r.copied,
           (long long)r.present, (long long)r.thumbs, (long long)r.thumbs_copied,
           (long long)r.thumbs_present, (long long)r.remote, (long long)r.remote_copied,
           (long long)r.remote_present, (long long)r.remote_absent, (long long)r.bytes,
           (long long)r.problems);
    if (rc < 0) {
        fprintf(stderr, "atrium-media-migrate: %s\n", err);
        return 2;
    }
    return r.problems ? 1 : 0;
}
