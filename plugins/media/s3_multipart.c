/*
 * plugins/media/s3_multipart.c - originals larger than s3_part_size_bytes go to the bucket
 * as a multipart upload, and multipart uploads left behind are aborted
 * (docs/adr/0011-media-on-an-object-store.md).
 *
 * Decisions owned here:
 *   - the parts are read from the upload's durable local file (s3_put_file's caller made
 *     it so), one after the other on the calling io worker, each its own request bounded
 *     by s3_timeout_ms: CreateMultipartUpload, UploadPart per part, then
 *     CompleteMultipartUpload with the ETags the parts answered. The object exists only
 *     once Complete succeeded, so a reader never sees a torn original;
 *   - any failure aborts the upload (AbortMultipartUpload) before the caller answers 503;
 *     an abort that fails, or a process killed mid-upload, leaves parts that the orphan
 *     sweep aborts (s3_multipart_sweep);
 *   - one upload takes at most orphan_min_age_ms / 2 from its Create (it gives up and
 *     aborts past that), so the sweep, which aborts uploads initiated longer than
 *     orphan_min_age_ms ago, never aborts a live one in any process;
 *   - S3 allows at most S3_PARTS_MAX parts: a file that would need more gets parts of
 *     size / S3_PARTS_MAX rounded up (the configured size is a floor, at least 5 MiB,
 *     media.c).
 *
 * What this file does not do: stream an upload to the store while its body arrives (the
 * local file is complete first), or upload parts in parallel.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "media.h"
#include "s3.h"
#include "s3_call.h"

#define S3_COMPLETE_BODY_MAX 4096 /* the answer to Complete */
#define SWEEP_BODY_MAX (256 * 1024) /* one page of ListMultipartUploads */
#define SWEEP_PAGE_UPLOADS 200      /* uploads asked for per page (~450 bytes each) */
#define SWEEP_PAGES_MAX 16          /* pages per sweep; the rest waits for the next */
#define S3_ORIGINALS_PREFIX "originals%%2F" /* a format string's part */

/* ---- writing --------------------------------------------------------------------------- */

void s3_mp_abort(media *m, const char *key, const char *upload_id_q)
{
    char query[S3_UPLOAD_ID_MAX * 3 + 16];
    snprintf(query, sizeof(query), "uploadId=%s", upload_id_q);
    s3_call call = {.kind = S3_KIND_ABORT, .key = key, .query = query, .out_fd = -1};
    int out = s3_perform(m, &call);
    if (out != S3_OUT_OK && out != S3_OUT_NOT_FOUND) {
        s3_log_failure(m, &call, "AbortMultipartUpload");
        m->h->log(m->self, ATRIUM_LOG_WARN,
                  "object store: the parts of %s stay until the orphan sweep aborts them", key);
    }
}

/* CreateMultipartUpload: its UploadId, escaped for a query, into id_q. */
int s3_mp_create(media *m, const char *key, char *id_q, size_t cap)
{
    char resp[S3_COMPLETE_BODY_MAX];
    s3_call call = {.kind = S3_KIND_CREATE, .key = key, .query = "uploads=", .out_fd = -1,
                    .resp = resp, .resp_cap = sizeof(resp)};
    char id[S3_UPLOAD_ID_MAX];
    if (s3_perform(m, &call) != S3_OUT_OK) {
        s3_log_failure(m, &call, "CreateMultipartUpload");
        return -1;
    }
    if (!s3_xml_text(resp, NULL, "UploadId", id, sizeof(id)) || !id[0] ||
        s3_query_escape(id, id_q, cap) < 0) {
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "object store: CreateMultipartUpload %s: no usable UploadId in the answer", key);
        return -1;
    }
    return 0;
}

int s3_mp_part(media *m, const char *key, const char *id_q, int part, int fd, int64_t offset,
               int64_t len, char *etag, size_t cap)
{
    char query[S3_UPLOAD_ID_MAX * 3 + 48];
    snprintf(query, sizeof(query), "partNumber=%d&uploadId=%s", part, id_q);
    s3_call call = {.kind = S3_KIND_PART, .key = key, .query = query, .upload_fd = fd,
                    .upload_offset = offset, .upload_size = len, .out_fd = -1};
    if (s3_perform(m, &call) != S3_OUT_OK) {
        s3_log_failure(m, &call, "UploadPart");
        return -1;
    }
    if (!call.etag[0] || strlen(call.etag) >= cap) {
        m->h->log(m->self, ATRIUM_LOG_ERROR,
                  "object store: UploadPart %d of %s answered without an ETag", part, key);
        return -1;
    }
    snprintf(etag, cap, "%s", call.etag);
    return 0;
}

int s3_mp_complete(media *m, const char *key, const char *id_q, const char *body, size_t len)
{
    char query[S3_UPLOAD_ID_MAX * 3 + 16];
    snprintf(query, sizeof(query), "uploadId=%s", id_q);
    char resp[S3_COMPLETE_BODY_MAX];
    s3_call call = {.kind = S3_KIND_COMPLETE, .key = key, .query = query, .post_body = body,
                    .post_len = len, .out_fd = -1, .resp = resp, .resp_cap = sizeof(resp)};
    int out = s3_perform(m, &call);
    /* S3 may answer 200 and then an <Error> body (the completion failed while it ran). */
    if (out != S3_OUT_OK || strstr(resp, "<Error>")) {
        if (out == S3_OUT_OK)
            snprintf(call.err_body, sizeof(call.err_body), "%.*s", (int)sizeof(call.err_body) - 1,
                     resp);
        s3_log_failure(m, &call, "CompleteMultipartUpload");
        return -1;
    }
    return 0;
}

int s3_multipart_put(media *m, const char *key, int fd, int64_t size)
{
    int64_t part_size = m->cfg.s3_part_size_bytes;
    if ((size + part_size - 1) / part_size > S3_PARTS_MAX)
        part_size = (size + S3_PARTS_MAX - 1) / S3_PARTS_MAX;
    int parts = (int)((size + part_size - 1) / part_size);
    int64_t give_up_at = m->h->now_ms() + m->cfg.orphan_min_age_ms / 2;
    char id_q[S3_UPLOAD_ID_MAX * 3];
    if (s3_mp_create(m, key, id_q, sizeof(id_q)) < 0) return -1;

    size_t cap = 64 + (size_t)parts * S3_PART_XML_MAX;
    char *xml = malloc(cap);
    size_t len = 0;
    int rc = xml ? 0 : -1;
    if (xml) len = (size_t)snprintf(xml, cap, "<CompleteMultipartUpload>");
    for (int i = 0; rc == 0 && i < parts; i++) {
        if (m->h->now_ms() > give_up_at) {
            m->h->log(m->self, ATRIUM_LOG_ERROR,
                      "object store: multipart upload of %s gave up after part %d of %d: "
                      "longer than orphan_min_age_ms / 2",
                      key, i, parts);
            rc = -1;
            break;
        }
        int64_t offset = (int64_t)i * part_size;
        int64_t n = size - offset < part_size ? size - offset : part_size;
        char etag[S3_ETAG_MAX];
        rc = s3_mp_part(m, key, id_q, i + 1, fd, offset, n, etag, sizeof(etag));
        if (rc == 0)
            len += (size_t)snprintf(xml + len, cap - len,
                                    "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>",
                                    i + 1, etag);
    }
    if (rc == 0) {
        len += (size_t)snprintf(xml + len, cap - len, "</CompleteMultipartUpload>");
        rc = s3_mp_complete(m, key, id_q, xml, len);
    }
    free(xml);
    if (rc < 0) s3_mp_abort(m, key, id_q);
    return rc;
}

/* ---- leftovers ------------------------------------------------------------------------- */

/* "2026-12-06T08:30:55.346Z" as ms since the epoch, or -1. */
static int64_t iso8601_ms(const char *s)
{
    struct tm tm = {0};
    int ms = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
               &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &ms) < 6)
        return -1;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    time_t t = timegm(&tm);
    return t == (time_t)-1 ? -1 : (int64_t)t * 1000 + ms;
}

/* The uploads of one page initiated before cutoff_ms, aborted; returns how many. */
static long abort_page(media *m, const char *body, int64_t cutoff_ms)
{
    long aborted = 0;
    const char *p = body;
    while ((p = strstr(p, "<Upload>")) != NULL) {
        const char *end = strstr(p, "</Upload>");
        if (!end) break;
        char key[320], id[S3_UPLOAD_ID_MAX], when[40], id_q[S3_UPLOAD_ID_MAX * 3];
        if (s3_xml_text(p, end, "Key", key, sizeof(key)) &&
            s3_xml_text(p, end, "UploadId", id, sizeof(id)) &&
            s3_xml_text(p, end, "Initiated", when, sizeof(when)) && !strchr(key, '&') &&
            s3_query_escape(id, id_q, sizeof(id_q)) == 0) {
            int64_t at = iso8601_ms(when);
            if (at >= 0 && at < cutoff_ms) {
                s3_mp_abort(m, key, id_q);
                aborted++;
            }
        }
        p = end;
    }
    return aborted;
}

long s3_multipart_sweep(media *m, int64_t cutoff_ms)
{
    if (!s3_enabled(m)) return 0;
    char *body = malloc(SWEEP_BODY_MAX);
    if (!body) return -1;
    char key_marker[320 * 3] = "", id_marker[S3_UPLOAD_ID_MAX * 3] = "";
    long aborted = 0;
    for (int page = 0; page < SWEEP_PAGES_MAX; page++) {
        /* Query names in byte order, as the signature's canonical form wants them. */
        char query[sizeof(key_marker) + sizeof(id_marker) + 128];
        if (key_marker[0])
            snprintf(query, sizeof(query),
                     "key-marker=%s&max-uploads=%d&prefix=" S3_ORIGINALS_PREFIX
                     "&upload-id-marker=%s&uploads=",
                     key_marker, SWEEP_PAGE_UPLOADS, id_marker);
        else
            snprintf(query, sizeof(query),
                     "max-uploads=%d&prefix=" S3_ORIGINALS_PREFIX "&uploads=",
                     SWEEP_PAGE_UPLOADS);
        s3_call call = {.kind = S3_KIND_LIST, .query = query, .out_fd = -1, .resp = body,
                        .resp_cap = SWEEP_BODY_MAX};
        if (s3_perform(m, &call) != S3_OUT_OK || call.resp_truncated) {
            s3_log_failure(m, &call, "ListMultipartUploads");
            free(body);
            return aborted > 0 ? aborted : -1;
        }
        aborted += abort_page(m, body, cutoff_ms);
        char truncated[8], next_key[320], next_id[S3_UPLOAD_ID_MAX];
        if (!s3_xml_text(body, NULL, "IsTruncated", truncated, sizeof(truncated)) ||
            strcmp(truncated, "true") != 0 ||
            !s3_xml_text(body, NULL, "NextKeyMarker", next_key, sizeof(next_key)) ||
            !s3_xml_text(body, NULL, "NextUploadIdMarker", next_id, sizeof(next_id)) ||
            s3_query_escape(next_key, key_marker, sizeof(key_marker)) < 0 ||
            s3_query_escape(next_id, id_marker, sizeof(id_marker)) < 0)
            break;
    }
    free(body);
    return aborted;
}
