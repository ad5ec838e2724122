/*
 * plugins/media/store.c - the media files on disk: where each one lives, how it is
 * written so that a crash never leaves a torn or half-named file, and the start-up sweep.
 *
 * Layout under plugins.media.store_path:
 *   local/<id[0:2]>/<id[2:4]>/<media ID>                          originals, by media ID
 *   thumbnails/<sha[0:2]>/<sha[2:4]>/<sha256>/<W>x<H>-<method>.webp thumbnails, by content
 *   remote/<origin>/<id[0:2]>/<id[2:4]>/<media ID>-<random>        remote copies
 * A remote copy's name carries a random suffix: a later copy of the same file gets a new
 * name, so it never replaces a file a reader has open (the row names the current one).
 * In <origin>, ':', '[' and ']' become '_' (which no server name contains).
 * Media IDs reach this file only after media_id_valid() ([A-Za-z0-9_-]), so a path can
 * never leave the store.
 *
 * Decision owned here (docs/architecture.md, "Media: the plugin's rules", Storage): a file
 * becomes visible under its final name
 * only once its bytes are durable. Bytes go to a temporary file in the final folder: an
 * unnamed one (O_TMPFILE) where the file system allows, which cannot outlive the process
 * that writes it, else a ".tmp-" name. Commit = fsync the file, give it its final name in
 * one step (linkat of the unnamed file, or rename), fsync the folder. New folders are
 * fsynced into their parents. The caller commits the database row only after this, and
 * answers only after the row. A crash leaves at most ".tmp-" files, which store_sweep()
 * removes before the server listens, and named files whose row was never committed,
 * which the orphan sweep removes once they are old enough (orphans.c).
 * A derived file (a thumbnail, store_tmp_open_derived) is committed the same way but
 * without any folder fsync: its name may be lost in a crash (it is rendered again on the
 * next request) but, the bytes being fsynced before the name exists, never names a torn
 * file (docs/performance.md, "A gallery of thumbnails").
 *
 * What this file does not do: decide names (upload.c, thumbnail.c), or touch the database.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "media.h"

#define STORE_TMP_PREFIX ATRIUM_MEDIA_TMP_PREFIX
#define STORE_DIR_MODE 0750
#define STORE_FILE_MODE 0640
#define STORE_SWEEP_MAX_DEPTH 8

/* A macro, not a function, so each call's format stays a literal the compiler checks. */
#define store_log(m, level, fmt, a, err) (m)->h->log((m)->self, (level), fmt, (a), strerror(err))

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

/* mkdir -p; when `durable`, fsyncing each parent whose entry list changed, so a new
 * folder survives a crash together with the file committed into it. */
static int mkdir_p(media *m, const char *path, bool durable)
{
    char buf[MEDIA_PATH_MAX];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof(buf)) return -ENAMETOOLONG;
    memcpy(buf, path, len + 1);
    for (size_t i = 1; i <= len; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, STORE_DIR_MODE) < 0) {
            if (errno != EEXIST) {
                int err = errno;
                store_log(m, ATRIUM_LOG_ERROR, "cannot create folder %s: %s", buf, err);
                return -err;
            }
        } else if (durable) {
            char *slash = strrchr(buf, '/');
            if (slash && slash != buf) {
                *slash = '\0';
                int rc = fsync_dir(buf);
                *slash = '/';
                if (rc < 0) return rc;
            }
        }
        buf[i] = saved;
    }
    return 0;
}

int store_init(media *m)
{
    char path[MEDIA_PATH_MAX];
    static const char *const SUBDIRS[] = {"local", "thumbnails", "remote", NULL};
    for (size_t i = 0; SUBDIRS[i]; i++) {
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", m->cfg.store_path, SUBDIRS[i]) >=
            sizeof(path))
            return ATRIUM_E_INVAL;
        if (mkdir_p(m, path, true) < 0) return ATRIUM_E_IO;
        if (access(path, W_OK | X_OK) < 0) {
            store_log(m, ATRIUM_LOG_ERROR,
                      "media store folder %s is not writable (%s): fix its permissions or "
                      "set plugins.media.store_path",
                      path, errno);
            return ATRIUM_E_IO;
        }
    }
    return 0;
}

static int sweep_dir(media *m, const char *dir, int depth)
{
    if (depth > STORE_SWEEP_MAX_DEPTH) return 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno != ENOENT) store_log(m, ATRIUM_LOG_WARN, "cannot read %s: %s", dir, errno);
        return 0;
    }
    int removed = 0;
    struct dirent *e;
    char path[MEDIA_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) >= sizeof(path)) continue;
        struct stat st;
        if (lstat(path, &st) < 0) continue;
        if (S_ISDIR(st.st_mode)) {
            removed += sweep_dir(m, path, depth + 1);
        } else if (strncmp(e->d_name, STORE_TMP_PREFIX, strlen(STORE_TMP_PREFIX)) == 0) {
            if (unlink(path) == 0)
                removed++;
            else
                store_log(m, ATRIUM_LOG_WARN, "cannot remove temp leftover %s: %s", path, errno);
        }
    }
    closedir(d);
    return removed;
}

int store_sweep(media *m)
{
    return sweep_dir(m, m->cfg.store_path, 0);
}

/* Two levels of fan-out from the first four characters (padded for short IDs). */
static void fanout(const char *key, char a[3], char b[3])
{
    size_t n = strlen(key);
    a[0] = n > 0 ? key[0] : '_';
    a[1] = n > 1 ? key[1] : '_';
    b[0] = n > 2 ? key[2] : '_';
    b[1] = n > 3 ? key[3] : '_';
    a[2] = b[2] = '\0';
}

int store_original_path(const media *m, const char *media_id, char *out, size_t cap)
{
    char a[3], b[3];
    fanout(media_id, a, b);
    int n = snprintf(out, cap, "%s/local/%s/%s/%s", m->cfg.store_path, a, b, media_id);
    return n < 0 || (size_t)n >= cap ? ATRIUM_E_INVAL : 0;
}

int store_row_path(const media *m, const media_row *row, char *out, size_t cap)
{
    if (!row->file_name[0]) return store_original_path(m, row->media_id, out, cap);
    int n = snprintf(out, cap, "%s/%s", m->cfg.store_path, row->file_name);
    return n < 0 || (size_t)n >= cap ? ATRIUM_E_INVAL : 0;
}

int store_remote_name(const media *m, const char *origin, const char *media_id, char *rel,
                      size_t rel_cap, char *abs, size_t abs_cap)
{
    char o[MEDIA_SERVER_NAME_MAX_CHARS + 1], a[3], b[3];
    snprintf(o, sizeof(o), "%s", origin);
    for (char *p = o; *p; p++)
        if (*p == ':' || *p == '[' || *p == ']') *p = '_';
    unsigned char rnd[8];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) return ATRIUM_E_IO;
    fanout(media_id, a, b);
    int n = snprintf(rel, rel_cap, "remote/%s/%s/%s/%s-%02x%02x%02x%02x%02x%02x%02x%02x", o, a, b,
                     media_id, rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    if (n < 0 || (size_t)n >= rel_cap) return ATRIUM_E_INVAL;
    n = snprintf(abs, abs_cap, "%s/%s", m->cfg.store_path, rel);
    return n < 0 || (size_t)n >= abs_cap ? ATRIUM_E_INVAL : 0;
}

int store_thumb_dir(const media *m, const char *sha256, char *out, size_t cap)
{
    char a[3], b[3];
    fanout(sha256, a, b);
    int n = snprintf(out, cap, "%s/thumbnails/%s/%s/%s", m->cfg.store_path, a, b, sha256);
    return n < 0 || (size_t)n >= cap ? ATRIUM_E_INVAL : 0;
}

int store_thumb_path(const media *m, const char *sha256, const media_size *s, char *out, size_t cap)
{
    char dir[MEDIA_PATH_MAX];
    if (store_thumb_dir(m, sha256, dir, sizeof(dir)) < 0) return ATRIUM_E_INVAL;
    int n = snprintf(out, cap, "%s/%dx%d-%s%s.webp", dir, s->width, s->height,
                     s->crop ? "crop" : "scale", s->animated ? "-anim" : "");
    return n < 0 || (size_t)n >= cap ? ATRIUM_E_INVAL : 0;
}

static void dir_of(const char *path, char *out, size_t cap)
{
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash && slash != out) *slash = '\0';
}

/* A ".tmp-<random>" name in dir. */
static int tmp_name(const char *dir, char *out, size_t cap)
{
    static const char ALPHABET[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char rnd[12];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd)) return -EIO;
    char suffix[sizeof(rnd) + 1];
    for (size_t i = 0; i < sizeof(rnd); i++) suffix[i] = ALPHABET[rnd[i] % 36];
    suffix[sizeof(rnd)] = '\0';
    int n = snprintf(out, cap, "%s/" STORE_TMP_PREFIX "%s", dir, suffix);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

static int tmp_open(media *m, const char *final_path, store_tmp *t, bool derived)
{
    t->fd = -1;
    t->named[0] = '\0';
    t->derived = derived;
    dir_of(final_path, t->dir, sizeof(t->dir));
    int rc = mkdir_p(m, t->dir, !derived);
    if (rc < 0) return rc;
    t->fd = open(t->dir, O_TMPFILE | O_RDWR | O_CLOEXEC, STORE_FILE_MODE);
    if (t->fd >= 0) return 0;
    if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
        int err = errno;
        store_log(m, ATRIUM_LOG_ERROR, "cannot create a file in %s: %s", t->dir, err);
        return -err;
    }
    /* No unnamed files here: a named temp file, swept at start if we crash. */
    for (int attempt = 0; attempt < 3; attempt++) {
        rc = tmp_name(t->dir, t->named, sizeof(t->named));
        if (rc < 0) return rc;
        t->fd = open(t->named, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, STORE_FILE_MODE);
        if (t->fd >= 0) return 0;
        if (errno != EEXIST) break;
    }
    int err = errno;
    store_log(m, ATRIUM_LOG_ERROR, "cannot create a temp file in %s: %s", t->dir, err);
    t->named[0] = '\0';
    return -err;
}

int store_tmp_open(media *m, const char *final_path, store_tmp *t)
{
    return tmp_open(m, final_path, t, false);
}

int store_tmp_open_derived(media *m, const char *final_path, store_tmp *t)
{
    return tmp_open(m, final_path, t, true);
}

/* Give the written file a name in its folder: the final one, or a temp one to rename. */
static int name_unnamed(store_tmp *t, const char *name)
{
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", t->fd);
    return linkat(AT_FDCWD, proc, AT_FDCWD, name, AT_SYMLINK_FOLLOW) < 0 ? -errno : 0;
}

int store_tmp_commit(media *m, store_tmp *t, const char *final_path, bool replace)
{
    int rc = 0;
    if (fsync(t->fd) < 0) {
        rc = -errno;
        store_log(m, ATRIUM_LOG_ERROR, "fsync of a new file in %s failed: %s", t->dir, -rc);
        store_tmp_discard(t);
        return rc;
    }
    if (!t->named[0] && replace) {
        /* An unnamed file cannot replace atomically: name it, then rename. */
        rc = tmp_name(t->dir, t->named, sizeof(t->named));
        if (rc == 0) rc = name_unnamed(t, t->named);
        if (rc < 0) t->named[0] = '\0';
    }
    if (rc == 0 && !t->named[0]) {
        rc = name_unnamed(t, final_path);
    } else if (rc == 0 && replace) {
        rc = rename(t->named, final_path) < 0 ? -errno : 0;
        if (rc == 0) t->named[0] = '\0';
    } else if (rc == 0) {
        rc = link(t->named, final_path) < 0 ? -errno : 0;
    }
    if (rc < 0 && rc != -EEXIST)
        store_log(m, ATRIUM_LOG_ERROR, "cannot name the new file %s: %s", final_path, -rc);
    if (rc == 0 && !t->derived) {
        rc = fsync_dir(t->dir);
        if (rc < 0) store_log(m, ATRIUM_LOG_ERROR, "fsync of folder %s failed: %s", t->dir, -rc);
    }
    store_tmp_discard(t);
    return rc;
}

void store_tmp_discard(store_tmp *t)
{
    if (t->fd >= 0) close(t->fd);
    t->fd = -1;
    if (t->named[0]) unlink(t->named);
    t->named[0] = '\0';
}

int store_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int store_remove_original(media *m, const char *media_id)
{
    char path[MEDIA_PATH_MAX];
    if (store_original_path(m, media_id, path, sizeof(path)) < 0) return ATRIUM_E_INVAL;
    if (unlink(path) < 0 && errno != ENOENT) {
        store_log(m, ATRIUM_LOG_ERROR, "cannot remove %s: %s", path, errno);
        return ATRIUM_E_IO;
    }
    return 0;
}

void store_remove_thumbs(media *m, const char *sha256)
{
    char dir[MEDIA_PATH_MAX], path[MEDIA_PATH_MAX];
    if (!sha256[0] || store_thumb_dir(m, sha256, dir, sizeof(dir)) < 0) return;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, e->d_name) < sizeof(path))
            unlink(path);
    }
    closedir(d);
    if (rmdir(dir) < 0 && errno != ENOENT)
        store_log(m, ATRIUM_LOG_WARN, "cannot remove thumbnail folder %s: %s", dir, errno);
}
