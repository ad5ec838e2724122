/*
 * plugins/media/verify_cli.c - the atrium-media-verify command (`atrium verify-media`, the
 * plugin command `atrium media verify`): checks every original of a media store, the local
 * folder or the bucket, against the SHA-256 and size recorded in PostgreSQL, and reports
 * mismatches. The same check as POST /_atrium/admin/v1/media/verify (verify.c), for
 * operators who want it without a running server or from cron.
 *
 *   atrium-media-verify --conninfo CONNINFO (--store PATH | --settings-stdin) [--json]
 *
 * Exit status: 0 every original matches, 1 some do not (listed on stdout), 2 the check
 * could not run (stderr says why).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_host.h"
#include "s3.h"

#define VERIFY_ERR_LEN 512

static PGconn *cli_acquire(void *ctx)
{
    return ctx;
}

static void cli_release(void *ctx, PGconn *c)
{
    (void)ctx;
    (void)c;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: atrium-media-verify --conninfo CONNINFO (--store PATH | --settings-stdin)"
               " [--json]\n"
               "Checks every uploaded original against its recorded SHA-256 and size: the\n"
               "files under PATH (plugins.media.store_path), or with --settings-stdin the\n"
               "store plugins.media's settings name (the bucket with storage: s3).\n"
               "Run it as `atrium verify-media --config FILE`, which hands the settings over.\n");
}

int main(int argc, char **argv)
{
    const char *conninfo = NULL, *store = NULL;
    bool as_json = false, settings = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--conninfo") == 0 && i + 1 < argc) {
            conninfo = argv[++i];
        } else if (strcmp(argv[i], "--store") == 0 && i + 1 < argc) {
            store = argv[++i];
        } else if (strcmp(argv[i], "--settings-stdin") == 0) {
            settings = true;
        } else if (strcmp(argv[i], "--json") == 0) {
            as_json = true;
        } else if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!conninfo || (!store && !settings)) {
        usage(stderr);
        return 2;
    }
    media m;
    char err[VERIFY_ERR_LEN];
    if (cli_media_open(&m, settings ? stdin : NULL, err, sizeof(err)) < 0) {
        fprintf(stderr, "atrium-media-verify: %s\n", err);
        cli_media_close(&m);
        return 2;
    }
    if (store) m.cfg.store_path = store;
    PGconn *c = NULL;
    if ((strcmp(m.cfg.storage, "s3") == 0 && s3_client_init(&m) < 0) || /* logged */
        cli_media_connect(conninfo, "atrium-media-verify", &c) < 0) {
        cli_media_close(&m);
        return 2;
    }
    verify_report rep;
    int rc = media_verify(&m, cli_acquire, cli_release, c, &rep, err, sizeof(err));
    PQfinish(c);
    const char *where = s3_enabled(&m) ? " in the bucket" : "";
    cli_media_close(&m);
    if (rc < 0) {
        fprintf(stderr, "atrium-media-verify: %s\n", err);
        return 2;
    }
    if (as_json) {
        json_t *out = json_pack("{s:I, s:I, s:O}", "checked", (json_int_t)rep.checked, "problems",
                                (json_int_t)rep.problems, "details", rep.details);
        char *text = out ? json_dumps(out, JSON_INDENT(2)) : NULL;
        if (text) puts(text);
        free(text);
        json_decref(out);
    } else {
        size_t i;
        json_t *d;
        json_array_foreach(rep.details, i, d)
        {
            const char *detail = json_string_value(json_object_get(d, "detail"));
            printf("%s: %s%s%s\n", json_string_value(json_object_get(d, "media_id")),
                   json_string_value(json_object_get(d, "problem")), detail ? " - " : "",
                   detail ? detail : "");
        }
        printf("checked %lld originals%s: %lld problem(s)\n", (long long)rep.checked,
               where, (long long)rep.problems);
    }
    json_decref(rep.details);
    return rep.problems ? 1 : 0;
}
