/*
 * atrium/media.h - the contract "media/1": what a plugin must do to serve this server's
 * content repository in place of the stock media.so.
 *
 * A media plugin declares `.provides = ATRIUM_MEDIA_IFACE` in its descriptor. The core
 * then checks, after the plugin's init, that it registered every route this header marks
 * required (ATRIUM_MEDIA_ROUTES, class ATRIUM_MEDIA_REQUIRED) and refuses to start with
 * one line naming the first one missing. The stock plugin registers its routes with the
 * same path macros and uses the header values below, and the core reads the `store_path`
 * setting by the name given here (`atrium verify-media`), so the contract cannot drift
 * from what either of them does. tests/conformance/media/ checks the behaviour; a minimal
 * plugin built from this header alone is examples/media-disk/; docs/plugins.md explains
 * both.
 *
 * What media/1 is not: a table of functions. The core makes no call into a media plugin:
 * everything goes through the routes and the plugin's commands. In particular:
 *   - deactivation: the core tells the media plugin nothing; a deactivated user's
 *     uploads stay and are served as before (their tokens are gone, so they upload
 *     nothing more);
 *   - `atrium verify-media --config FILE [--json]` is the plugin command `atrium media
 *     verify` (atrium/plugin.h, "Plugin commands"): the program `atrium-media-verify`
 *     beside the atrium executable, given `--conninfo` and the settings on stdin
 *     (`--settings-stdin`; exit 0 all match, 1 mismatches, 2 could not run). Version 1
 *     adds `atrium media migrate --config FILE --to s3|local` (`atrium-media-migrate`):
 *     copies every original and thumbnail between store_path and the object store,
 *     resumable, each object's SHA-256 checked (exit 0 all copied, 1 problems listed, 2
 *     could not run). They are the stock plugin's programs, for the plugin configured as
 *     plugins.media; a replacement may ship its own under the same names;
 *   - quarantine and the other admin endpoints are the plugin's own routes (optional);
 *   - federation media: the plugin registers the federation routes below with
 *     ATRIUM_ROUTE_FEDERATION; the core verifies the calling server's X-Matrix signature
 *     before the handler runs (host->req_origin names it). Optional: without them other
 *     servers get 404 M_UNRECOGNIZED, and users there see no media of this server.
 *
 * Growth rule: routes, settings and values are only added (as optional, or in a new
 * major "media/2"); a required route is never dropped within media/1.
 */
#ifndef ATRIUM_MEDIA_H
#define ATRIUM_MEDIA_H

#include "atrium/abi.h"

#define ATRIUM_MEDIA_IFACE "media/1" /* the descriptor's `provides` */
#define ATRIUM_MEDIA_VERSION 1       /* minor version of media/1: 1 adds `atrium media migrate` */
#define ATRIUM_MEDIA_COMMAND_VERIFY "verify"   /* atrium media verify (verify-media) */
#define ATRIUM_MEDIA_COMMAND_MIGRATE "migrate" /* atrium media migrate --to s3|local */

/* ---- routes ------------------------------------------------------------------------- */

/* Route classes: a required route must be registered by a media/1 plugin (the core
 * checks); an optional one may be, and then must behave as the Matrix specification and
 * the notes below say. */
#define ATRIUM_MEDIA_REQUIRED 1
#define ATRIUM_MEDIA_OPTIONAL 0

/* The routes of media/1: ATRIUM_MEDIA_PATH_<name>, and the list
 * ATRIUM_MEDIA_ROUTES(X) calling X(name, method, path template, class) for each. A GET
 * route also answers HEAD (the core sends the headers without the body). Path
 * parameters: {serverName}, {mediaId}, {fileName}. Groups, in order:
 *   config        {"m.upload.size": max_upload_size}; authenticated (v1)
 *   upload        the body streamed to storage as it arrives, never buffered whole
 *                 (ATRIUM_ROUTE_STREAM_BODY); a request without a valid token is answered
 *                 401 before its body is sent (ATRIUM_ROUTE_HEADERS_FIRST); answers
 *                 {"content_uri": "mxc://<server name>/<id>"}
 *   create + PUT  the asynchronous pair: register both or neither
 *   download      authenticated content, with and without a file name
 *   thumbnail     authenticated; a plugin without thumbnails registers it and answers
 *                 404 M_NOT_FOUND (with no-store) for media it has: the conformance suite
 *                 is told which behaviour a plugin declares (--thumbnails yes|no)
 *   legacy        unauthenticated v3 download/thumbnail, for old clients (optional)
 *   federation    this server's media to other servers (multipart/mixed; optional)
 *   preview_url   URL previews (optional; the stock plugin's is off unless configured)
 *   admin         quarantine, deletion, listing (optional; the stock plugin's are in
 *                 plugins/media/README.md) */
#define ATRIUM_MEDIA_PATH_CONFIG "/_matrix/client/v1/media/config"
#define ATRIUM_MEDIA_PATH_CONFIG_V3 "/_matrix/media/v3/config"
#define ATRIUM_MEDIA_PATH_UPLOAD "/_matrix/media/v3/upload"
#define ATRIUM_MEDIA_PATH_CREATE "/_matrix/media/v1/create"
#define ATRIUM_MEDIA_PATH_UPLOAD_PUT "/_matrix/media/v3/upload/{serverName}/{mediaId}"
#define ATRIUM_MEDIA_PATH_DOWNLOAD "/_matrix/client/v1/media/download/{serverName}/{mediaId}"
#define ATRIUM_MEDIA_PATH_DOWNLOAD_NAMED                                                     \
    "/_matrix/client/v1/media/download/{serverName}/{mediaId}/{fileName}"
#define ATRIUM_MEDIA_PATH_THUMBNAIL "/_matrix/client/v1/media/thumbnail/{serverName}/{mediaId}"
#define ATRIUM_MEDIA_PATH_LEGACY_DOWNLOAD "/_matrix/media/v3/download/{serverName}/{mediaId}"
#define ATRIUM_MEDIA_PATH_LEGACY_DOWNLOAD_NAMED                                              \
    "/_matrix/media/v3/download/{serverName}/{mediaId}/{fileName}"
#define ATRIUM_MEDIA_PATH_LEGACY_THUMBNAIL "/_matrix/media/v3/thumbnail/{serverName}/{mediaId}"
#define ATRIUM_MEDIA_PATH_FED_DOWNLOAD "/_matrix/federation/v1/media/download/{mediaId}"
#define ATRIUM_MEDIA_PATH_FED_THUMBNAIL "/_matrix/federation/v1/media/thumbnail/{mediaId}"
#define ATRIUM_MEDIA_PATH_PREVIEW_URL "/_matrix/client/v1/media/preview_url"

#define ATRIUM_MEDIA_ROUTES(X)                                                               \
    X(CONFIG, "GET", ATRIUM_MEDIA_PATH_CONFIG, ATRIUM_MEDIA_REQUIRED)                        \
    X(CONFIG_V3, "GET", ATRIUM_MEDIA_PATH_CONFIG_V3, ATRIUM_MEDIA_OPTIONAL)                  \
    X(UPLOAD, "POST", ATRIUM_MEDIA_PATH_UPLOAD, ATRIUM_MEDIA_REQUIRED)                       \
    X(CREATE, "POST", ATRIUM_MEDIA_PATH_CREATE, ATRIUM_MEDIA_OPTIONAL)                       \
    X(UPLOAD_PUT, "PUT", ATRIUM_MEDIA_PATH_UPLOAD_PUT, ATRIUM_MEDIA_OPTIONAL)                \
    X(DOWNLOAD, "GET", ATRIUM_MEDIA_PATH_DOWNLOAD, ATRIUM_MEDIA_REQUIRED)                    \
    X(DOWNLOAD_NAMED, "GET", ATRIUM_MEDIA_PATH_DOWNLOAD_NAMED, ATRIUM_MEDIA_REQUIRED)        \
    X(THUMBNAIL, "GET", ATRIUM_MEDIA_PATH_THUMBNAIL, ATRIUM_MEDIA_REQUIRED)                  \
    X(LEGACY_DOWNLOAD, "GET", ATRIUM_MEDIA_PATH_LEGACY_DOWNLOAD, ATRIUM_MEDIA_OPTIONAL)      \
    X(LEGACY_DOWNLOAD_NAMED, "GET", ATRIUM_MEDIA_PATH_LEGACY_DOWNLOAD_NAMED,                 \
      ATRIUM_MEDIA_OPTIONAL)                                                                 \
    X(LEGACY_THUMBNAIL, "GET", ATRIUM_MEDIA_PATH_LEGACY_THUMBNAIL, ATRIUM_MEDIA_OPTIONAL)    \
    X(FED_DOWNLOAD, "GET", ATRIUM_MEDIA_PATH_FED_DOWNLOAD, ATRIUM_MEDIA_OPTIONAL)            \
    X(FED_THUMBNAIL, "GET", ATRIUM_MEDIA_PATH_FED_THUMBNAIL, ATRIUM_MEDIA_OPTIONAL)          \
    X(PREVIEW_URL, "GET", ATRIUM_MEDIA_PATH_PREVIEW_URL, ATRIUM_MEDIA_OPTIONAL)

/* ATRIUM_MEDIA_ROUTE_<name>: each route's index in ATRIUM_MEDIA_ROUTES. */
enum atrium_media_route_id {
#define ATRIUM_MEDIA_ID_(name, method, path, cls) ATRIUM_MEDIA_ROUTE_##name,
    ATRIUM_MEDIA_ROUTES(ATRIUM_MEDIA_ID_) ATRIUM_MEDIA_ROUTE__COUNT
#undef ATRIUM_MEDIA_ID_
};

/* ---- settings ----------------------------------------------------------------------- */

/* Keys of plugins.<name> every media/1 plugin declares in its settings table (numbers
 * as ATRIUM_SETTING_INT or _INT64), so an operator (and the conformance suite)
 * configures any of them the same way. */
#define ATRIUM_MEDIA_SETTING_STORE_PATH "store_path"      /* STRING: the folder of files */
#define ATRIUM_MEDIA_SETTING_MAX_UPLOAD "max_upload_size" /* bytes: larger uploads get 413 */
#define ATRIUM_MEDIA_SETTING_SLOTS "delivery_slots"       /* content responses in flight */
#define ATRIUM_MEDIA_SETTING_QUEUE "delivery_queue"       /* requests waiting, parked */
#define ATRIUM_MEDIA_SETTING_QUEUE_PER_CLIENT "delivery_queue_per_client" /* 0 = no cap */
#define ATRIUM_MEDIA_SETTING_WAIT_MS "delivery_wait_ms"   /* longest wait for a slot, ms */

/* ---- storage ------------------------------------------------------------------------ */

/* A file being written lives under store_path either unnamed (O_TMPFILE) or with a name
 * starting with this prefix; the plugin removes such leftovers in start(), and after a
 * 413, a 401 or a client that went away none of its own remain. Files without the prefix
 * are complete: a file is fsynced and named before the upload is acknowledged. */
#define ATRIUM_MEDIA_TMP_PREFIX ".tmp-"
/* A plugin that shares one file between media IDs (content addressed) keeps "a failed
 * upload leaves nothing" for the upload, not for the file: when the row of a new ID fails,
 * the ID is never answered (503), and the file is removed only if this upload created it
 * and no row names it, decided in the same transaction as the insert; when unsure it stays
 * (an orphan for a sweeper, never a named file gone). docs/plugins.md, section 8. */

/* ---- delivery ----------------------------------------------------------------------- */

/* The delivery rule (docs/adr/0002-delivery-held-to-the-last-byte.md). Every GET/HEAD of
 * content (download, thumbnail, legacy, federation) first enters the plugin's admission
 * line named ATRIUM_MEDIA_DELIVERY_LINE (host->line_create; its metrics are
 * atrium_line_*{line="<plugin>.delivery"}), before anything else, even before the token
 * is checked: admission before authorization, so a flood of requests with bad tokens
 * waits its turn like any other and never reaches PostgreSQL ahead of it. The slot is a
 * hold, released by the core after the response's last byte or when the client goes
 * away (never earlier: a slow reader keeps its slot). Past the line: 429 M_LIMIT_EXCEEDED
 * with retry_after_ms and Retry-After (host->respond_limited); a parked waiter at shutdown
 * gets 503. JSON endpoints (config, upload, create) never enter the line. */
#define ATRIUM_MEDIA_DELIVERY_LINE "delivery"

/* Counters every media/1 plugin exports (host->metric_counter), named
 * "atrium_<plugin name>" + suffix: uploads stored, and content responses served. */
#define ATRIUM_MEDIA_METRIC_UPLOADS "_uploads_total"
#define ATRIUM_MEDIA_METRIC_DOWNLOADS "_downloads_total"

/* ---- responses ---------------------------------------------------------------------- */

/* Headers of every successful content response (download, thumbnail): the body is never
 * run as a page of this origin, may be embedded by clients of other origins, and is
 * never sniffed into another type. Plus Content-Type (the upload's, else
 * application/octet-stream), Content-Disposition (`inline` only for the media types of
 * ATRIUM_MEDIA_INLINE_TYPES, else `attachment`; a file name quoted, or as RFC 8187
 * filename*), an ETag (for If-None-Match -> 304) and Accept-Ranges: bytes (a single
 * Range -> 206, a range past the end -> 416). */
#define ATRIUM_MEDIA_CSP                                                                    \
    "sandbox; default-src 'none'; script-src 'none'; plugin-types application/pdf; "        \
    "style-src 'unsafe-inline'; object-src 'self';"
/* The media types served `inline` (the Matrix specification's "Serving inline content"
 * list, as the stock plugin uses it): compared with the Content-Type's type/subtype,
 * lower-cased, without parameters ("Text/Plain; charset=utf-8" is text/plain). Every
 * other type is an `attachment`. A list of string literals for an initializer:
 *     static const char *const INLINE[] = {ATRIUM_MEDIA_INLINE_TYPES, NULL}; */
#define ATRIUM_MEDIA_INLINE_TYPES                                                           \
    "text/css", "text/plain", "text/csv", "application/json", "application/ld+json",        \
        "image/jpeg", "image/gif", "image/png", "image/apng", "image/webp", "image/avif",   \
        "video/mp4", "video/webm", "video/ogg", "video/quicktime", "audio/mp4",             \
        "audio/webm", "audio/aac", "audio/mpeg", "audio/ogg", "audio/wave", "audio/wav",    \
        "audio/x-wav", "audio/x-pn-wav", "audio/flac", "audio/x-flac"
#define ATRIUM_MEDIA_CORP "cross-origin"           /* Cross-Origin-Resource-Policy */
#define ATRIUM_MEDIA_NOSNIFF "nosniff"             /* X-Content-Type-Options */
#define ATRIUM_MEDIA_CACHE_OK "private, max-age=86400" /* Cache-Control of a success */
/* Every failure carries Cache-Control: no-store (host->respond_error adds it), so a
 * 404 for media that appears later is never cached. */

/* Error codes, by case (status, errcode):
 *   no access token                         401 M_MISSING_TOKEN   (host->req_authenticate)
 *   unknown or revoked token                401 M_UNKNOWN_TOKEN   (host->req_authenticate)
 *   unknown media, another server's name when it is not fetched, quarantined media
 *                                           404 M_NOT_FOUND       (all alike: no oracle)
 *   a media ID outside [A-Za-z0-9_-], or a malformed server name (never reaching a file)
 *                                           404 M_NOT_FOUND, or 400 M_INVALID_PARAM
 *   an upload larger than max_upload_size   413 M_TOO_LARGE       (nothing stored)
 *   the delivery line is full / waited out  429 M_LIMIT_EXCEEDED  (+ retry_after_ms)
 *   created media not uploaded in time      504 M_NOT_YET_UPLOADED
 *   storage or database unavailable         503 M_UNKNOWN (or 507 for a full disk)
 *   the server is stopping                  503 M_UNKNOWN */

#endif
