/*
 * plugins/media/rowcache.c - the media row cache: what delivery needs of a local media
 * row (type, name, hash, size, image header, creation time), kept in memory so that a
 * download of cached media does not wait for a PostgreSQL round trip per request.
 *
 * Decisions owned here (docs/architecture.md, "More than one process", the table of media
 * caches):
 *   - bounded: ROWCACHE_ENTRIES slots allocated once, direct-mapped by a hash of the key
 *     (server name, media ID); a key that lands on a taken slot replaces its entry. No
 *     allocation per request, one mutex held for a copy;
 *   - only rows that are deliverable as they stand are kept: uploaded and not quarantined.
 *     A row waiting for its upload, or refused, is always read again, so an upload landing
 *     or a release from quarantine needs no invalidation;
 *   - kept true across processes by the notification channel MEDIA_CH_ROW ("row"): every
 *     commit that changes a media row's deliverability or its delivered fields (quarantine
 *     by ID or by hash, either way, and deletion) is followed by rowcache_changed or
 *     rowcache_changed_hash, which drops the entry here at once and then publishes the
 *     media ID (or "#" and the hash) for every process, this one included;
 *   - bypassed (neither read nor filled) while notify_live is not 1, since notifications
 *     may be missed then; a NULL payload (the listening connection came back) drops every
 *     entry;
 *   - a generation, bumped by every drop, is read before the database read that fills an
 *     entry: a fill whose read may predate a drop is not stored (the row read could be the
 *     one the drop was about);
 *   - each entry also lapses ROWCACHE_TTL_MS after it was filled, as a last line should a
 *     notification be lost anyway.
 * Remote media is not cached here (remote.c reads its own rows).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "media.h"

#define ROWCACHE_ENTRIES 2048  /* slots, each one row; about 1.7 KB each */
#define ROWCACHE_TTL_MS 5000   /* an entry lapses this long after its fill */
#define ROWCACHE_HASH_PREFIX '#' /* payload "#<sha256>": every entry of that content */

typedef struct row_entry {
    bool used;
    int64_t filled_ms; /* monotonic */
    char server[MEDIA_SERVER_NAME_MAX_CHARS + 1];
    char media_id[MEDIA_ID_MAX_CHARS + 1];
    char content_type[MEDIA_TYPE_MAX_BYTES + 1];
    char upload_name[MEDIA_NAME_MAX_BYTES + 1];
    char sha256[SHA256_HEX_CHARS + 1];
    int64_t created_ts, uploaded_ts, size_bytes;
    int width, height, frames;
} row_entry;

struct rowcache {
    pthread_mutex_t mu;
    uint64_t gen; /* bumped by every drop, under mu */
    row_entry slots[ROWCACHE_ENTRIES];
};

static size_t slot_of(const char *server, const char *media_id)
{
    uint64_t x = 1469598103934665603ull; /* FNV-1a over server, a NUL, media ID */
    for (const unsigned char *p = (const unsigned char *)server; *p; p++) {
        x ^= *p;
        x *= 1099511628211ull;
    }
    x *= 1099511628211ull;
    for (const unsigned char *p = (const unsigned char *)media_id; *p; p++) {
        x ^= *p;
        x *= 1099511628211ull;
    }
    return (size_t)(x % ROWCACHE_ENTRIES);
}

int rowcache_init(media *m)
{
    m->rows = calloc(1, sizeof(*m->rows));
    if (!m->rows) return ATRIUM_E_NOMEM;
    pthread_mutex_init(&m->rows->mu, NULL);
    return 0;
}

void rowcache_fini(media *m)
{
    if (!m->rows) return;
    pthread_mutex_destroy(&m->rows->mu);
    free(m->rows);
    m->rows = NULL;
}

bool rowcache_get(media *m, const char *server, const char *media_id, media_row *row)
{
    rowcache *rc = m->rows;
    if (!rc || !cluster_live(m)) return false;
    int64_t now = m->h->now_ms();
    row_entry *e = &rc->slots[slot_of(server, media_id)];
    pthread_mutex_lock(&rc->mu);
    bool hit = e->used && now - e->filled_ms < ROWCACHE_TTL_MS &&
               strcmp(e->media_id, media_id) == 0 && strcmp(e->server, server) == 0;
    if (hit) {
        memset(row, 0, sizeof(*row));
        memcpy(row->media_id, e->media_id, sizeof(e->media_id));
        memcpy(row->content_type, e->content_type, sizeof(e->content_type));
        memcpy(row->upload_name, e->upload_name, sizeof(e->upload_name));
        memcpy(row->sha256, e->sha256, sizeof(e->sha256));
        row->created_ts = e->created_ts;
        row->uploaded_ts = e->uploaded_ts;
        row->size_bytes = e->size_bytes;
        row->width = e->width;
        row->height = e->height;
        row->frames = e->frames;
        row->uploaded = true;
    }
    pthread_mutex_unlock(&rc->mu);
    m->h->metric_add(hit ? m->m_row_hits : m->m_row_misses, 1);
    return hit;
}

uint64_t rowcache_gen(media *m)
{
    rowcache *rc = m->rows;
    if (!rc) return 0;
    pthread_mutex_lock(&rc->mu);
    uint64_t gen = rc->gen;
    pthread_mutex_unlock(&rc->mu);
    return gen;
}

void rowcache_put(media *m, const char *server, const media_row *row, uint64_t gen)
{
    rowcache *rc = m->rows;
    if (!rc || !row->uploaded || row->quarantined || row->file_name[0] || !cluster_live(m))
        return;
    row_entry *e = &rc->slots[slot_of(server, row->media_id)];
    int64_t now = m->h->now_ms();
    pthread_mutex_lock(&rc->mu);
    if (rc->gen == gen) {
        e->used = true;
        e->filled_ms = now;
        snprintf(e->server, sizeof(e->server), "%s", server);
        memcpy(e->media_id, row->media_id, sizeof(e->media_id));
        memcpy(e->content_type, row->content_type, sizeof(e->content_type));
        memcpy(e->upload_name, row->upload_name, sizeof(e->upload_name));
        memcpy(e->sha256, row->sha256, sizeof(e->sha256));
        e->created_ts = row->created_ts;
        e->uploaded_ts = row->uploaded_ts;
        e->size_bytes = row->size_bytes;
        e->width = row->width;
        e->height = row->height;
        e->frames = row->frames;
    }
    pthread_mutex_unlock(&rc->mu);
}

/* Drop the entries a payload names (NULL: all of them) and bump the generation. */
static void drop(media *m, const char *payload)
{
    rowcache *rc = m->rows;
    if (!rc) return;
    pthread_mutex_lock(&rc->mu);
    rc->gen++;
    if (!payload) {
        for (size_t i = 0; i < ROWCACHE_ENTRIES; i++) rc->slots[i].used = false;
    } else if (payload[0] == ROWCACHE_HASH_PREFIX) {
        for (size_t i = 0; i < ROWCACHE_ENTRIES; i++)
            if (rc->slots[i].used && strcmp(rc->slots[i].sha256, payload + 1) == 0)
                rc->slots[i].used = false;
    } else {
        row_entry *e = &rc->slots[slot_of(m->server_name, payload)];
        if (e->used && strcmp(e->media_id, payload) == 0) e->used = false;
    }
    pthread_mutex_unlock(&rc->mu);
}

void rowcache_on_row(void *arg, const char *payload)
{
    drop(arg, payload);
}

void rowcache_changed(media *m, const char *media_id)
{
    drop(m, media_id);
    cluster_publish(m, MEDIA_CH_ROW, media_id);
}

void rowcache_changed_hash(media *m, const char *sha256)
{
    char payload[SHA256_HEX_CHARS + 2];
    snprintf(payload, sizeof(payload), "%c%s", ROWCACHE_HASH_PREFIX, sha256);
    drop(m, payload);
    cluster_publish(m, MEDIA_CH_ROW, payload);
}
