/*
 * plugins/media/verify_cli.c - the atrium-media-verify command: checks every original of
 * a media store against the SHA-256 and size recorded in PostgreSQL, and reports
 * mismatches. The same check as POST /_atrium/admin/v1/media/verify (verify.c), for
 * operators who want it without a running server or from cron.
 *
 *   atrium-media-verify --conninfo CONNINFO --store PATH [--json]
 *
 * Exit status: 0 every original matches, 1 some do not (listed on stdout), 2 the check
 * could not run (stderr says why).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "media.h"

const atrium_host *media_host; /* unused here; store.c and verify.c need no host */

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
    fprintf(f, "usage: atrium-media-verify --conninfo CONNINFO --store PATH [--json]\n"
               "Checks every uploaded original against its recorded SHA-256 and size.\n"
               "PATH is plugins.media.store_path of the server's configuration.\n");
}

int main(int argc, char **argv)
{
    const char *conninfo = NULL, *store = NULL;
    bool as_json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--conninfo") == 0 && i + 1 < argc) {
            conninfo = argv[++i];
        } else if (strcmp(argv[i], "--store") == 0 && i + 1 < argc) {
            store = argv[++i];
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
    if (!conninfo || !store) {
        usage(stderr);
        return 2;
    }
    PGconn *c = PQconnectdb(conninfo);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "atrium-media-verify: cannot connect to PostgreSQL: %s", PQerrorMessage(c));
        PQfinish(c);
        return 2;
    }
    media m;
    memset(&m, 0, sizeof(m));
    m.cfg.store_path = store;
    verify_report rep;
    char err[256];
    int rc = media_verify(&m, cli_acquire, cli_release, c, &rep, err, sizeof(err));
    PQfinish(c);
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
        printf("checked %lld originals: %lld problem(s)\n", (long long)rep.checked,
               (long long)rep.problems);
    }
    json_decref(rep.details);
    return rep.problems ? 1 : 0;
}
