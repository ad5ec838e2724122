/*
 * plugins/media/s3_list.c - listing the bucket by prefix (ListObjectsV2, page after page),
 * for the migration and the deletes of a hash's thumbnails; one request at a time through
 * s3_perform (s3.c), so each is bounded and counted as any other (kind "list").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "media.h"
#include "s3.h"
#include "s3_call.h"

#define S3_DELETE_PREFIX_MAX 1000 /* objects under one prefix deleted at once (a hash's thumbnails) */
#define S3_LIST_BODY_MAX (512 * 1024) /* the answer to one ListObjectsV2 */

int s3_list(media *m, const char *prefix, s3_list_fn fn, void *arg)
{
    char esc[S3_KEY_MAX * 3], token[S3_KEY_MAX * 2] = "", token_esc[S3_KEY_MAX * 6];
    char query[S3_KEY_MAX * 10], key[S3_KEY_MAX], size_text[32], truncated[8];
    if (s3_query_escape(prefix, esc, sizeof(esc)) < 0) return -1;
    char *body = malloc(S3_LIST_BODY_MAX);
    if (!body) return -1;
    int rc = 0;
    do {
        /* Names in byte order: the signature's canonical query (s3_call.h). */
        if (token[0] && s3_query_escape(token, token_esc, sizeof(token_esc)) < 0) {
            rc = -1;
            break;
        }
        if (token[0])
            snprintf(query, sizeof(query), "continuation-token=%s&list-type=2&prefix=%s",
                     token_esc, esc);
        else
            snprintf(query, sizeof(query), "list-type=2&prefix=%s", esc);
        s3_call call = {.kind = S3_KIND_LIST, .query = query, .out_fd = -1, .resp = body,
                        .resp_cap = S3_LIST_BODY_MAX};
        if (s3_perform(m, &call) != S3_OUT_OK || call.resp_truncated) {
            s3_log_failure(m, &call, "ListObjectsV2");
            rc = -1;
            break;
        }
        for (const char *p = body; rc == 0 && (p = strstr(p, "<Contents>")) != NULL; p += 10) {
            const char *end = strstr(p, "</Contents>");
            if (!s3_xml_text(p, end, "Key", key, sizeof(key)) ||
                !s3_xml_text(p, end, "Size", size_text, sizeof(size_text)))
                continue;
            rc = fn(arg, key, strtoll(size_text, NULL, 10));
        }
        token[0] = '\0';
        if (rc == 0 && s3_xml_text(body, NULL, "IsTruncated", truncated, sizeof(truncated)) &&
            strcmp(truncated, "true") == 0 &&
            !s3_xml_text(body, NULL, "NextContinuationToken", token, sizeof(token)))
            rc = -1; /* a truncated answer without its token: cannot go on */
    } while (rc == 0 && token[0]);
    free(body);
    return rc;
}

long s3_delete_prefix(media *m, const char *prefix)
{
    char esc[S3_KEY_MAX * 3], query[S3_KEY_MAX * 3 + 64];
    if (s3_query_escape(prefix, esc, sizeof(esc)) < 0) return -1;
    snprintf(query, sizeof(query), "list-type=2&max-keys=%d&prefix=%s", S3_DELETE_PREFIX_MAX,
             esc);
    char *body = malloc(S3_LIST_BODY_MAX);
    if (!body) return -1;
    s3_call call = {.kind = S3_KIND_LIST, .query = query, .out_fd = -1, .resp = body,
                    .resp_cap = S3_LIST_BODY_MAX};
    if (s3_perform(m, &call) != S3_OUT_OK) {
        s3_log_failure(m, &call, "ListObjectsV2");
        free(body);
        return -1;
    }
    long deleted = 0;
    char key[S3_KEY_MAX];
    for (const char *p = body; (p = strstr(p, "<Contents>")) != NULL; p += 10) {
        const char *end = strstr(p, "</Contents>");
        if (!s3_xml_text(p, end, "Key", key, sizeof(key)) ||
            strncmp(key, prefix, strlen(prefix)) != 0)
            continue;
        if (s3_delete_object(m, key) < 0) {
            deleted = -1;
            break;
        }
        deleted++;
    }
    free(body);
    return deleted;
}
