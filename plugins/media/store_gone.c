/*
 * plugins/media/store_gone.c - files every process removes from its own local folder when
 * media goes: with storage: s3 each process (each machine) keeps a local folder of its own
 * as a cache of the bucket, so a delete, a purge or an eviction made through one process
 * must reach the copies the others hold (docs/adr/0032-remote-media-in-the-bucket.md).
 *
 * Decisions owned here:
 *   - serving stops through the rows, not through this: a deleted row is gone for every
 *     process at its commit, a local media row cached by a process is dropped by the row
 *     notification (rowcache.c), and remote rows are read for every request. What this
 *     adds is the disk: after the commit, the process that removed the rows publishes
 *     what went on "store.gone" (one notification per original, thumbnail folder or
 *     remote copy: "o <media ID>", "t <sha256>", "r <file name>"), and every process,
 *     this one too, unlinks its local copy and closes the descriptors its open-file cache
 *     holds of it (a reader already sending the file reads it to its end);
 *   - the unlinks run on the io pool, never on the notification thread; a queue that is
 *     full, a notification missed (the listening connection down) or a process that was
 *     not running leaves the file to the orphan sweep (orphans.c), which removes what no
 *     row names once older than orphan_min_age_ms.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

typedef struct gone_task {
    media *m;
    char payload[ATRIUM_NOTIFY_MAX_PAYLOAD + 1];
} gone_task;

void store_gone_publish(media *m, char kind, const char *name)
{
    if (!s3_enabled(m)) return; /* one local folder for all: the remover unlinked it */
    char payload[ATRIUM_NOTIFY_MAX_PAYLOAD + 1];
    int n = snprintf(payload, sizeof(payload), "%c %s", kind, name);
    if (n < 0 || n > ATRIUM_NOTIFY_MAX_PAYLOAD || !name[0]) return;
    cluster_publish(m, MEDIA_CH_GONE, payload);
}

/* A remote copy's name as rows hold it: under remote/, no way out of the folder. */
static bool remote_name_ok(const char *name)
{
    return strncmp(name, "remote/", 7) == 0 && !strstr(name, "..") && !strchr(name, '\\');
}

static void gone_run(void *arg, bool cancelled)
{
    gone_task *t = arg;
    media *m = t->m;
    const char *name = t->payload + 2;
    char path[MEDIA_PATH_MAX];
    if (cancelled) {
        free(t);
        return;
    }
    switch (t->payload[0]) {
    case 'o':
        if (media_id_valid(name) && store_original_path(m, name, path, sizeof(path)) == 0) {
            store_remove_original(m, name);
            fdcache_forget(m, path);
        }
        break;
    case 't':
        if (strlen(name) == SHA256_HEX_CHARS && store_thumb_dir(m, name, path, sizeof(path)) == 0) {
            store_remove_thumbs(m, name);
            fdcache_forget_under(m, path);
        }
        break;
    case 'r':
        if (remote_name_ok(name) &&
            snprintf(path, sizeof(path), "%s/%s", m->cfg.store_path, name) < (int)sizeof(path)) {
            unlink(path); /* a reader's open descriptor stays valid */
            fdcache_forget(m, path);
        }
        break;
    default:
        break;
    }
    free(t);
}

void store_gone_on(void *arg, const char *payload)
{
    media *m = arg;
    if (!payload || strlen(payload) < 3 || payload[1] != ' ') return;
    gone_task *t = calloc(1, sizeof(*t));
    if (!t) return;
    t->m = m;
    snprintf(t->payload, sizeof(t->payload), "%s", payload);
    if (m->h->pool_submit(m->io_pool, gone_run, t) < 0) free(t); /* the sweep takes it */
}
