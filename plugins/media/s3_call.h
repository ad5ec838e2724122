/*
 * plugins/media/s3_call.h - one signed request to the object store, for the files that
 * speak S3 (s3.c, which owns the request, its slot and its metrics; s3_multipart.c). Not
 * for the rest of the plugin, which calls the operations in s3.h.
 *
 * A request is described by an s3_call (kind, key, query, body) and run by s3_perform on
 * the calling thread, which must be one of the plugin's pools (s3.h): it waits at most
 * s3_timeout_ms for a request slot and s3_timeout_ms for the answer.
 */
#ifndef MEDIA_S3_CALL_H
#define MEDIA_S3_CALL_H

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct media media;

/* What a request is, as counted in atrium_media_store_requests_total{kind}. */
enum s3_kind {
    S3_KIND_HEAD = 0,
    S3_KIND_PUT,
    S3_KIND_GET,
    S3_KIND_DELETE,
    S3_KIND_LIST,     /* GET of the bucket with a query (objects, multipart uploads) */
    S3_KIND_CREATE,   /* POST ?uploads=: CreateMultipartUpload */
    S3_KIND_PART,     /* PUT ?partNumber=&uploadId=: UploadPart */
    S3_KIND_COMPLETE, /* POST ?uploadId=: CompleteMultipartUpload */
    S3_KIND_ABORT,    /* DELETE ?uploadId=: AbortMultipartUpload */
    S3_KIND_RANGE,    /* GET with a Range (s3_stream.c: a Range asked on a miss) */
    S3_N_KINDS
};

/* How it ended, as counted in atrium_media_store_requests_total{outcome}. */
enum s3_outcome { S3_OUT_OK = 0, S3_OUT_NOT_FOUND, S3_OUT_REFUSED, S3_OUT_FAILED, S3_N_OUTCOMES };

#define S3_ERROR_BODY_MAX 512
#define S3_ETAG_MAX 80

/* One request and what came back. Zero it, then set what applies. */
typedef struct s3_call {
    int kind;          /* enum s3_kind: also says the method */
    const char *key;   /* NULL: the bucket itself */
    const char *query; /* NULL, or "a=1&b=2": names sorted, values escaped (s3_query_escape) */
    int upload_fd;     /* PUT, PART: the body is upload_size bytes of this file ... */
    int64_t upload_offset; /* ... from this offset (read with pread; the fd is not moved) */
    int64_t upload_size;
    int64_t bytes_sent; /* of the upload, so far */
    const char *post_body; /* COMPLETE: the request body */
    size_t post_len;
    int out_fd;       /* GET: a 200's body goes here (-1: none) */
    struct sha256_ctx *body_hash; /* GET: if set, a 200's body is hashed as it arrives */
    const char *range; /* RANGE: "first-last", sent as Range (its 206 is the body) */
    /* GET, RANGE: if set, called after each piece of the body was written (and hashed),
     * with the body's bytes so far; false stops the transfer (write_failed) */
    bool (*on_bytes)(void *arg, int64_t bytes);
    void *on_bytes_arg;
    char *resp;       /* if set: the answer's body (any status) is kept here, NUL-ended */
    size_t resp_cap;  /* bytes resp holds, with its NUL */
    size_t resp_len;
    bool resp_truncated; /* the body was longer than resp_cap - 1 */
    bool write_failed;
    CURL *easy;
    curl_socket_t sock; /* the connection easy sends on (CURL_SOCKET_BAD: none yet) */
    long status;
    CURLcode cc;
    int64_t bytes;  /* body bytes received into out_fd */
    int64_t length; /* HEAD: the object's Content-Length (-1 unknown) */
    char etag[S3_ETAG_MAX]; /* the answer's ETag header, quotes kept ("" none) */
    char curl_err[CURL_ERROR_SIZE];
    char err_body[S3_ERROR_BODY_MAX];
    size_t err_len;
} s3_call;

/* [pool] Run call: wait for a request slot, sign and send it, read the answer. Counted in
 * the store metrics under call->kind. Returns its enum s3_outcome (2xx is S3_OUT_OK). Set
 * call->out_fd to -1 unless a GET's body is wanted in a file. */
int s3_perform(media *m, s3_call *call);
/* One log line for a request that did not succeed: what, the key, and the store's answer
 * (status and the <Code> of its error body) or why there was none. */
void s3_log_failure(media *m, const s3_call *call, const char *what);
/* Percent-encode s for a query value (all but A-Za-z0-9-_.~). 0, or ATRIUM_E_INVAL when
 * out is too small. */
int s3_query_escape(const char *s, char *out, size_t cap);
/* The text of the first <tag>...</tag> at or after from, before end (NULL: the end of the
 * string), into out. true when found and it fit. */
bool s3_xml_text(const char *from, const char *end, const char *tag, char *out, size_t cap);

/* ---- s3_multipart.c: the steps of a multipart upload (s3_upstream.c sends one too) ---- */

#define S3_PARTS_MAX 10000
#define S3_UPLOAD_ID_MAX 256
#define S3_PART_XML_MAX (64 + S3_ETAG_MAX) /* one <Part> of the Complete body */

/* [pool] CreateMultipartUpload of key: 0 with its UploadId, escaped for a query, in id_q;
 * -1 (logged). */
int s3_mp_create(media *m, const char *key, char *id_q, size_t cap);
/* [pool] UploadPart number part: len bytes of fd from offset; 0 with its ETag, or -1. */
int s3_mp_part(media *m, const char *key, const char *id_q, int part, int fd, int64_t offset,
               int64_t len, char *etag, size_t cap);
/* [pool] CompleteMultipartUpload with body (<CompleteMultipartUpload> of the parts): 0, -1. */
int s3_mp_complete(media *m, const char *key, const char *id_q, const char *body, size_t len);
/* [pool] AbortMultipartUpload (a failure is logged: the orphan sweep aborts it later). */
void s3_mp_abort(media *m, const char *key, const char *upload_id_q);

#endif
