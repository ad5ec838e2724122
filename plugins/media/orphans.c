/*
 * plugins/media/orphans.c - files in the media store that no row names: an original
 * whose upload was killed between naming its file and committing its row (kill -9), a
 * thumbnail folder whose media were deleted while a render ran, a ".tmp-" file left by a
 * crash in a process that shares the store. Nothing acknowledged is among them (a file
 * is named, then its row committed, then the upload answered: store.c), but they fill
 * the disk. The sweep finds them and removes them.
 *
 * Decisions owned here:
 *   - a file is an orphan only when no row names it AND its last change (mtime) is older
 *     than orphan_min_age_ms, the longest an upload can leave its file unchanged: while
 *     its body arrives it writes at least every server.http.body_idle_timeout_s (else
 *     the core cuts the client), and after its last byte the file is named and its row
 *     committed within server.http.handoff_deadline_ms (a commit not started by then is
 *     refused) plus its own bounded waits (s3_timeout_ms, the database wait). A running
 *     upload's file, in this process or another one sharing the store, is therefore
 *     always younger than that (plugins/media/README.md gives the figures). The age is
 *     looked at before the database and again just before the unlink;
 *   - remote copies: remote/<origin>/<a>/<b>/<file> whose name (under the store) no
 *     media_remote nor media_remote_thumbnails row holds (a copy whose removal another
 *     process announced while this one was away: store_gone.c);
 *   - originals: local/<a>/<b>/<media ID> with no media_local row of that ID, or only
 *     a reservation (POST /create) never uploaded whose expiry is older than the cutoff
 *     (a PUT killed after naming its file leaves that; a live reservation's file stays);
 *     thumbnails: thumbnails/<a>/<b>/<sha256>/ with no media_local nor media_remote row
 *     of that content hash, each file old enough removed, then the folder if empty;
 *     ".tmp-" files anywhere in the store, old enough;
 *   - the walk is bounded: names are checked against the database ORPHAN_BATCH at a
 *     time, one statement on a connection borrowed for that statement only (never held
 *     while the disk is walked), so memory does not grow with the store;
 *   - it runs once after start in every process (the age rule makes that safe anywhere),
 *     then every orphan_sweep_period_ms in the one process holding the lease
 *     "store.orphans" (every process when the host has no leases), on a pool of its own
 *     (one thread), never on the request or io pools; one sweep at a time. A long sweep
 *     may outlive the lease's belief (ttl / 2) and overlap the next holder's: harmless,
 *     since what may be removed is decided by the age rule and the rows, not the lease,
 *     which only spares the processes doing the same walk.
 * With storage: s3 the sweep also aborts multipart uploads under originals/ initiated
 * before the same cutoff (s3_multipart_sweep; a live one gives up at half that age) and
 * deletes the bucket's objects of the same age that no row names (orphans_s3.c).
 * Counted in atrium_media_orphans_removed_total{kind} (original, thumbnail, temp,
 * multipart, object, remote) and
 * atrium_media_orphan_sweeps_total (sweeps ended), and logged as one summary line per sweep that removed something (and after the first).
 *
 * What this file does not do: the start-up removal of every ".tmp-" file the media/1
 * contract asks for (store_sweep, store.c).
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "media.h"
#include "s3.h"

#define ORPHAN_LEASE "store.orphans"
#define ORPHAN_LEASE_TTL_MS 30000
#define ORPHAN_BATCH 256    /* names checked against the database in one statement */
#define ORPHAN_POOL_QUEUE 2 /* sweeps waiting: the start one and a periodic one */
#define ORPHAN_NAME_MAX MEDIA_ID_MAX_CHARS /* a media ID, or a SHA-256 in hex */
#define ORPHAN_MAX_DEPTH 8  /* remote/<origin>/<a>/<b>/ is the deepest the store goes */

enum orphan_kind { ORPHAN_ORIGINAL, ORPHAN_THUMBNAIL, ORPHAN_REMOTE };

/* One sweep: the names waiting for their database check, and what was removed. */
typedef struct sweep {
    media *m;
    int64_t cutoff_s; /* files last changed before this (wall clock, s) may go */
    enum orphan_kind kind;
    size_t n;
    char dir[ORPHAN_BATCH][MEDIA_PATH_MAX]; /* the folder holding each name */
    char name[ORPHAN_BATCH][ORPHAN_NAME_MAX + 1];
    long looked_at;
    long removed[ORPHAN_KINDS]; /* original, thumbnail, temp, multipart, object, remote */
    bool db_failed;
} sweep;

enum {
    REMOVED_ORIGINAL,
    REMOVED_THUMBNAIL,
    REMOVED_TEMP,
    REMOVED_MULTIPART,
    REMOVED_OBJECT,
    REMOVED_REMOTE
};

static bool old_enough(const sweep *s, const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 && (int64_t)st.st_mtime < s->cutoff_s;
}

/* A remote copy's name (store_remote_name's) that fits a batch and needs no escaping. */
static bool remote_name_plain(const char *rel)
{
    size_t n = strlen(rel);
    if (n > ORPHAN_NAME_MAX || strncmp(rel, "remote/", 7) != 0 || strstr(rel, "..")) return false;
    return strspn(rel, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-/") == n;
}

static bool is_hex_sha256(const char *name)
{
    size_t n = strlen(name);
    if (n != SHA256_HEX_CHARS) return false;
    for (size_t i = 0; i < n; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return false;
    return true;
}

static void unlink_counted(sweep *s, const char *path, int slot)
{
    if (unlink(path) == 0) {
        s->removed[slot]++;
        s->m->h->metric_add(s->m->m_orphans_removed[slot], 1);
        fdcache_forget(s->m, path);
    } else if (errno != ENOENT) {
        s->m->h->log(s->m->self, ATRIUM_LOG_WARN, "cannot remove orphan %s: %s", path,
                     strerror(errno));
    }
}

/* A thumbnail folder no row wants: its files old enough go, then the folder if empty. */
static void remove_thumb_dir(sweep *s, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    char path[MEDIA_PATH_MAX];
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= sizeof(path))
            continue;
        if (old_enough(s, path)) unlink_counted(s, path, REMOVED_THUMBNAIL);
    }
    closedir(d);
    rmdir(dir); /* fails while a fresh file is still there: it stays */
}

/* The names of the batch that a row still wants, as a set of flags. */
static int rows_present(sweep *s, bool *present)
{
    const atrium_host *h = s->m->h;
    size_t cap = s->n * (ORPHAN_NAME_MAX + 3) + 3;
    char *arr = malloc(cap);
    if (!arr) return ATRIUM_E_NOMEM;
    size_t len = 0;
    arr[len++] = '{';
    /* Each element quoted, so an ID spelled NULL stays a string; the names are
     * [A-Za-z0-9_-] or hex (media_id_valid), or remote copies' names of [A-Za-z0-9_./-]
     * (remote_name_plain), so nothing inside needs escaping. */
    for (size_t i = 0; i < s->n; i++)
        len += (size_t)snprintf(arr + len, cap - len, "%s\"%s\"", i ? "," : "", s->name[i]);
    arr[len++] = '}';
    arr[len] = '\0';
    /* A reservation never uploaded and expired before the cutoff wants no file: no PUT
     * can complete into it any more (upload.c checks the expiry under the row's lock). */
    static const char *const SQL[] = {
        [ORPHAN_ORIGINAL] = "SELECT media_id FROM media_local WHERE media_id = ANY($1::text[])"
                            " AND NOT (uploaded_ts IS NULL AND expires_ts IS NOT NULL"
                            " AND expires_ts < $2::bigint)",
        [ORPHAN_THUMBNAIL] = "SELECT sha256 FROM media_local WHERE sha256 = ANY($1::text[])"
                             " UNION SELECT sha256 FROM media_remote WHERE sha256 = ANY($1::text[])",
        /* A remote copy (its name under store_path, which rows hold): either table. */
        [ORPHAN_REMOTE] = "SELECT file_name FROM media_remote WHERE file_name = ANY($1::text[])"
                          " UNION SELECT file_name FROM media_remote_thumbnails"
                          " WHERE file_name = ANY($1::text[])",
    };
    const char *sql = SQL[s->kind];
    char cutoff_ms[24];
    snprintf(cutoff_ms, sizeof(cutoff_ms), "%lld", (long long)s->cutoff_s * 1000);
    const char *p[] = {arr, cutoff_ms};
    int n_params = s->kind == ORPHAN_ORIGINAL ? 2 : 1;
    PGconn *c = h->db_acquire(MEDIA_DB_WAIT_MS);
    PGresult *res = c ? PQexecParams(c, sql, n_params, NULL, p, NULL, NULL, 0) : NULL;
    int rc = res && PQresultStatus(res) == PGRES_TUPLES_OK ? 0 : ATRIUM_E_DB;
    if (rc < 0 && c)
        h->log(s->m->self, ATRIUM_LOG_WARN, "orphan sweep: cannot read rows: %s",
               PQerrorMessage(c));
    for (int r = 0; rc == 0 && r < PQntuples(res); r++) {
        const char *v = PQgetvalue(res, r, 0);
        for (size_t i = 0; i < s->n; i++)
            if (strcmp(v, s->name[i]) == 0) present[i] = true;
    }
    PQclear(res);
    if (c) h->db_release(c);
    free(arr);
    return rc;
}

/* Check the batch against the database, then remove what no row wants. */
static void flush(sweep *s)
{
    if (s->n == 0) return;
    bool present[ORPHAN_BATCH] = {false};
    if (!s->db_failed && rows_present(s, present) < 0) s->db_failed = true;
    char path[MEDIA_PATH_MAX];
    for (size_t i = 0; i < s->n && !s->db_failed; i++) {
        if (present[i]) continue;
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", s->dir[i], s->name[i]) >= sizeof(path))
            continue;
        if (s->kind == ORPHAN_THUMBNAIL) {
            remove_thumb_dir(s, path);
        } else if (old_enough(s, path)) { /* still old: nothing wrote it meanwhile */
            unlink_counted(s, path, s->kind == ORPHAN_REMOTE ? REMOVED_REMOTE : REMOVED_ORIGINAL);
        }
    }
    s->n = 0;
}

static void add(sweep *s, const char *dir, const char *name)
{
    if (s->db_failed) return;
    snprintf(s->dir[s->n], sizeof(s->dir[s->n]), "%s", dir);
    snprintf(s->name[s->n], sizeof(s->name[s->n]), "%s", name);
    if (++s->n == ORPHAN_BATCH) flush(s);
}

/* Walk dir (depth 0: the entries of a top folder, local/, thumbnails/ or remote/). At the
 * leaf depth of local/ (2: files) and thumbnails/ (2: hash folders) candidates join the
 * batch; ".tmp-" files anywhere are judged by age alone. */
static void walk(sweep *s, const char *dir, int depth, int leaf_depth)
{
    if (depth > ORPHAN_MAX_DEPTH) return;
    DIR *d = opendir(dir);
    if (!d) return;
    char path[MEDIA_PATH_MAX];
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        if (nm[0] == '.' && (!nm[1] || (nm[1] == '.' && !nm[2]))) continue;
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, nm) >= sizeof(path)) continue;
        struct stat st;
        if (lstat(path, &st) < 0) continue;
        s->looked_at++;
        bool is_dir = S_ISDIR(st.st_mode), old = (int64_t)st.st_mtime < s->cutoff_s;
        if (!is_dir && strncmp(nm, ATRIUM_MEDIA_TMP_PREFIX, strlen(ATRIUM_MEDIA_TMP_PREFIX)) == 0) {
            if (old) unlink_counted(s, path, REMOVED_TEMP);
        } else if (depth == leaf_depth && s->kind == ORPHAN_ORIGINAL) {
            if (S_ISREG(st.st_mode) && old && media_id_valid(nm)) add(s, dir, nm);
        } else if (depth == leaf_depth && s->kind == ORPHAN_REMOTE) {
            /* Its name as rows hold it: under store_path ("remote/..."). */
            const char *rel = path + strlen(s->m->cfg.store_path) + 1;
            if (S_ISREG(st.st_mode) && old && remote_name_plain(rel))
                add(s, s->m->cfg.store_path, rel);
        } else if (depth == leaf_depth && s->kind == ORPHAN_THUMBNAIL) {
            if (!is_dir) continue;
            walk(s, path, depth + 1, leaf_depth); /* its ".tmp-" files */
            if (old && is_hex_sha256(nm)) add(s, dir, nm);
        } else if (is_dir) {
            walk(s, path, depth + 1, leaf_depth);
        }
    }
    closedir(d);
}

static void run_sweep(media *m)
{
    sweep *s = calloc(1, sizeof(*s));
    if (!s) return;
    s->m = m;
    int64_t started = m->h->now_ms();
    s->cutoff_s = (int64_t)time(NULL) - m->cfg.orphan_min_age_ms / 1000;
    static const struct {
        const char *top;
        enum orphan_kind kind;
        int leaf;
    } TOPS[] = {{"local", ORPHAN_ORIGINAL, 2},
                {"thumbnails", ORPHAN_THUMBNAIL, 2},
                {"remote", ORPHAN_REMOTE, 3}}; /* remote/<origin>/<a>/<b>/<file> */
    char top[MEDIA_PATH_MAX];
    for (size_t i = 0; i < sizeof(TOPS) / sizeof(TOPS[0]); i++) {
        snprintf(top, sizeof(top), "%s/%s", m->cfg.store_path, TOPS[i].top);
        s->kind = TOPS[i].kind;
        walk(s, top, 0, TOPS[i].leaf);
        flush(s);
    }
    /* storage: s3 - multipart uploads of the same age: a crash or a failed abort left them
     * (s3_multipart.c: a live one never runs that long). */
    long aborted = s3_multipart_sweep(m, s->cutoff_s * 1000);
    if (aborted > 0) {
        s->removed[REMOVED_MULTIPART] = aborted;
        m->h->metric_add(m->m_orphans_removed[REMOVED_MULTIPART], aborted);
    }
    /* ... and objects no row names, of the same age (orphans_s3.c). */
    long objects = orphans_s3_sweep(m, s->cutoff_s * 1000);
    if (objects > 0) {
        s->removed[REMOVED_OBJECT] = objects;
        m->h->metric_add(m->m_orphans_removed[REMOVED_OBJECT], objects);
    }
    m->h->metric_add(m->m_orphan_sweeps, 1);
    long total = 0;
    for (int k = 0; k < ORPHAN_KINDS; k++) total += s->removed[k];
    bool first = !atomic_exchange(&m->orphans_swept_once, true);
    if (total > 0 || first || s->db_failed)
        m->h->log(m->self, s->db_failed ? ATRIUM_LOG_WARN : ATRIUM_LOG_INFO,
                  "orphan sweep: %ld original(s), %ld thumbnail file(s), %ld temp file(s) "
                  "and %ld remote cop(ies) removed of %ld entries looked at, %ld multipart "
                  "upload(s) aborted, %ld object(s) deleted, in %lld ms (older than %lld s, "
                  "no row)%s",
                  s->removed[REMOVED_ORIGINAL], s->removed[REMOVED_THUMBNAIL],
                  s->removed[REMOVED_TEMP], s->removed[REMOVED_REMOTE], s->looked_at,
                  s->removed[REMOVED_MULTIPART], s->removed[REMOVED_OBJECT],
                  (long long)(m->h->now_ms() - started),
                  (long long)(m->cfg.orphan_min_age_ms / 1000),
                  s->db_failed ? "; the database could not be read, the rest waits for the "
                                 "next sweep"
                               : "");
    free(s);
}

static void sweep_task(void *arg, bool cancelled)
{
    media *m = arg;
    if (!cancelled) run_sweep(m);
    atomic_store(&m->orphans_sweeping, false);
}

static void submit(media *m)
{
    if (atomic_exchange(&m->orphans_sweeping, true)) return; /* one sweep at a time */
    if (m->h->pool_submit(m->orphan_pool, sweep_task, m) < 0)
        atomic_store(&m->orphans_sweeping, false);
}

/* The timer's entry: quick (a submit), then the next one. At stop the timer calls it at
 * once: the pool is stopped then, the submit fails, and the next entry is refused. */
static void tick(void *arg)
{
    media *m = arg;
    if (!m->orphan_lease || m->h->lease_held(m->orphan_lease) == 1) submit(m);
    media_timer_add(m->timer, m->h->now_ms() + m->cfg.orphan_sweep_period_ms, tick, m);
}

int orphans_init(media *m)
{
    const atrium_host *h = m->h;
    m->orphan_pool = h->pool_create(m->self, "orphans", 1, ORPHAN_POOL_QUEUE);
    static const char *const KINDS[ORPHAN_KINDS] = {"kind=\"original\"", "kind=\"thumbnail\"",
                                                    "kind=\"temp\"", "kind=\"multipart\"",
                                                    "kind=\"object\"", "kind=\"remote\""};
    for (size_t i = 0; i < ORPHAN_KINDS; i++) {
        m->m_orphans_removed[i] =
            h->metric_counter(m->self, "atrium_media_orphans_removed_total", KINDS[i],
                              "Files no row names, older than orphan_min_age_ms, removed");
        if (!m->m_orphans_removed[i]) return ATRIUM_E_INVAL;
    }
    m->m_orphan_sweeps = h->metric_counter(m->self, "atrium_media_orphan_sweeps_total", NULL,
                                           "Sweeps of the store for files no row names");
    if (!m->m_orphan_sweeps) return ATRIUM_E_INVAL;
    if (!m->orphan_pool) return ATRIUM_E_NOMEM;
    if (ATRIUM_HOST_HAS(h, lease_create) && ATRIUM_HOST_HAS(h, lease_held)) {
        m->orphan_lease = h->lease_create(m->self, ORPHAN_LEASE, ORPHAN_LEASE_TTL_MS);
        if (!m->orphan_lease) {
            h->log(m->self, ATRIUM_LOG_ERROR, "cannot create the lease %s", ORPHAN_LEASE);
            return ATRIUM_E_STATE;
        }
    }
    return 0;
}

int orphans_start(media *m)
{
    submit(m); /* at start, in every process: the age rule protects running uploads */
    return media_timer_add(m->timer, m->h->now_ms() + m->cfg.orphan_sweep_period_ms, tick, m);
}
