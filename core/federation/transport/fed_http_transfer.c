/*
 * core/federation/transport/fed_http_transfer.c - one outbound transfer (see fed_http_transfer.h):
 * the copy of a request, its libcurl options, and the callbacks that hold it to the
 * client's rules while curl runs it.
 *
 * Limits on what comes back: a declared Content-Length over max_body_bytes is refused in
 * the header callback, before any body byte; a body without one (chunked, or read to the
 * close) is counted as it arrives; the header block is capped as well. Each ends the
 * request with FED_HTTP_E_TOO_LARGE. Headers are collected per response and reset at each
 * new status line, so a 100 Continue's headers never mix with the final answer's.
 *
 * Where connections go. Curl never resolves a name: the caller's addresses go in through
 * CURLOPT_RESOLVE, an IP-literal URL needs none, and no proxy is used (CURLOPT_PROXY ""
 * overrides the http_proxy environment, which would otherwise let a proxy connect where
 * the address rule does not look). Every socket is opened by open_socket, which asks
 * rt_iprange_allowed about the address being connected to and refuses with
 * CURL_SOCKET_BAD; the refusal is remembered, so the request ends FED_HTTP_E_BLOCKED
 * with the address named rather than as a generic connect error. Redirects are never
 * followed.
 *
 * TLS: verification is on unless the request says otherwise; the client's CA blob, when
 * set, replaces the system store (CAINFO and CAPATH cleared). HTTP/2 is offered over TLS
 * (CURL_HTTP_VERSION_2TLS), and a TLS request waits for a connection being set up to the
 * same host rather than opening another (CURLOPT_PIPEWAIT), so streams share it.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "core/federation/transport/fed_http_transfer.h"
#include "atrium/parse.h"

#ifndef ATRIUM_VERSION
#define ATRIUM_VERSION "dev"
#endif

#define FED_HTTP_BODY_INITIAL_BYTES 4096
#define FED_HTTP_IP_BYTES 64 /* an IP literal's text, brackets included */
#define FED_HTTP_CONTENT_LENGTH_DIGITS_MAX 31
#define HTTP_STATUS_DIGITS 3

static const char HTTP_STATUS_PREFIX[] = "HTTP/";
static const char CONTENT_LENGTH[] = "content-length";

/* ---- the copy of a request -------------------------------------------------------------- */

static void headers_reset(fed_http_handle *h)
{
    for (size_t i = 0; i < h->n_hdrs; i++) {
        free(h->hdrs[i].name);
        free(h->hdrs[i].value);
    }
    h->n_hdrs = 0;
}

void fed_http_handle_free(fed_http_handle *h)
{
    if (!h) return;
    if (h->easy) curl_easy_cleanup(h->easy);
    curl_slist_free_all(h->header_list);
    curl_slist_free_all(h->resolve_list);
    headers_reset(h);
    free(h->hdrs);
    free(h->buf);
    if (h->headers)
        for (char **p = h->headers; *p; p++) free(*p);
    free(h->headers);
    free(h->method);
    free(h->url);
    free(h->host_key);
    free(h->body);
    free(h->content_type);
    free(h->host_header);
    free(h->resolve_line);
    free(h);
}

static bool has_crlf(const char *s)
{
    return s && strpbrk(s, "\r\n") != NULL;
}

/* An IP literal, IPv6 with or without brackets: its address text without brackets in
 * out (FED_HTTP_IP_BYTES), and whether it is IPv6. false when not an IP literal. */
static bool ip_literal(const char *s, char *out, bool *v6)
{
    size_t n = strlen(s);
    if (n >= FED_HTTP_IP_BYTES) return false;
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
        memcpy(out, s + 1, n - 2);
        out[n - 2] = '\0';
    } else {
        memcpy(out, s, n + 1);
    }
    unsigned char bin[16];
    if (inet_pton(AF_INET, out, bin) == 1 && s[0] != '[') {
        *v6 = false;
        return true;
    }
    if (inet_pton(AF_INET6, out, bin) == 1) {
        *v6 = true;
        return true;
    }
    return false;
}

/* Check the URL and build the CURLOPT_RESOLVE line. curl_url is a pure parser (no shared
 * state), so running it on the caller's thread keeps "everything curl on the I/O thread"
 * true where it matters: it is how curl itself will read the URL. */
static int prepare_target(fed_http_handle *h, const fed_http_req *req)
{
    CURLU *u = curl_url();
    if (!u) return ATRIUM_E_NOMEM;
    char *scheme = NULL, *host = NULL, *port = NULL;
    int rc = ATRIUM_E_INVAL;
    if (curl_url_set(u, CURLUPART_URL, req->url, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK ||
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) != CURLUE_OK)
        goto out;
    if (strcmp(scheme, "https") != 0 && strcmp(scheme, "http") != 0) goto out;
    h->https = strcmp(scheme, "https") == 0;
    char lit[FED_HTTP_IP_BYTES];
    bool v6;
    bool literal = ip_literal(host, lit, &v6);
    h->host_key = strdup(req->host_key ? req->host_key : literal ? lit : host);
    if (!h->host_key) {
        rc = ATRIUM_E_NOMEM;
        goto out;
    }
    if (literal) { /* curl connects to the literal itself; connect_addrs do not apply */
        rc = 0;
        goto out;
    }
    size_t n = 0;
    while (req->connect_addrs && req->connect_addrs[n]) n++;
    if (n == 0 || n > FED_HTTP_MAX_CONNECT_ADDRS) goto out;
    size_t cap = strlen(host) + strlen(port) + 3 + n * (FED_HTTP_IP_BYTES + 3);
    char *line = malloc(cap);
    if (!line) {
        rc = ATRIUM_E_NOMEM;
        goto out;
    }
    size_t len = (size_t)snprintf(line, cap, "%s:%s:", host, port);
    for (size_t i = 0; i < n; i++) {
        if (!ip_literal(req->connect_addrs[i], lit, &v6)) {
            free(line);
            goto out;
        }
        len += (size_t)snprintf(line + len, cap - len, v6 ? "%s[%s]" : "%s%s", i ? "," : "", lit);
    }
    h->resolve_line = line;
    rc = 0;
out:
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
    curl_url_cleanup(u);
    return rc;
}

static char *dup_or_null(const char *s, bool *oom)
{
    if (!s) return NULL;
    char *d = strdup(s);
    if (!d) *oom = true;
    return d;
}

fed_http_handle *fed_http_handle_new(const fed_http_req *req, int *rc)
{
    *rc = ATRIUM_E_INVAL;
    if (!req || !req->url || !req->method || !req->on_done || req->deadline_ms <= 0 ||
        req->max_body_bytes < 0 || (!req->body && req->body_len) ||
        has_crlf(req->host_header) || has_crlf(req->content_type))
        return NULL;
    static const char *const methods[] = {"GET", "POST", "PUT", "DELETE"};
    bool known = false;
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        known = known || strcmp(req->method, methods[i]) == 0;
    if (!known) return NULL;
    size_t n_headers = 0;
    for (; req->headers && req->headers[n_headers]; n_headers++)
        if (has_crlf(req->headers[n_headers]) || !strchr(req->headers[n_headers], ':'))
            return NULL;

    *rc = ATRIUM_E_NOMEM;
    fed_http_handle *h = calloc(1, sizeof(*h));
    if (!h) return NULL;
    bool oom = false;
    h->method = dup_or_null(req->method, &oom);
    h->url = dup_or_null(req->url, &oom);
    h->content_type = dup_or_null(req->content_type, &oom);
    h->host_header = dup_or_null(req->host_header, &oom);
    h->headers = calloc(n_headers + 1, sizeof(char *));
    if (!h->headers) oom = true;
    for (size_t i = 0; !oom && i < n_headers; i++)
        h->headers[i] = dup_or_null(req->headers[i], &oom);
    if (req->body) {
        h->body = malloc(req->body_len + 1);
        if (h->body) {
            memcpy(h->body, req->body, req->body_len);
            h->body[req->body_len] = '\0';
        } else {
            oom = true;
        }
    }
    h->body_len = req->body_len;
    h->deadline_ms = req->deadline_ms;
    h->max_body_bytes = req->max_body_bytes;
    h->verify_tls = req->verify_tls;
    h->operator_destination = req->operator_destination;
    h->on_chunk = req->on_chunk;
    h->on_done = req->on_done;
    h->arg = req->arg;
    if (oom) {
        fed_http_handle_free(h);
        return NULL;
    }
    *rc = prepare_target(h, req);
    if (*rc < 0) {
        fed_http_handle_free(h);
        return NULL;
    }
    return h;
}

/* ---- callbacks (I/O thread) ------------------------------------------------------------- */

/* declared: the Content-Length said so; else the body read so far passed the cap. */
static void refuse_too_large(fed_http_handle *h, bool declared, long long n)
{
    h->too_large = true;
    snprintf(h->why, sizeof(h->why), "the response %s %lld bytes (the cap is %lld)",
             declared ? "declares" : "body passed", n, (long long)h->max_body_bytes);
}

static bool header_add(fed_http_handle *h, const char *name, size_t nlen, const char *value,
                       size_t vlen)
{
    if (h->n_hdrs == h->cap_hdrs) {
        size_t cap = h->cap_hdrs ? h->cap_hdrs * 2 : 16;
        fed_http_hdr *nh = realloc(h->hdrs, cap * sizeof(*nh));
        if (!nh) return false;
        h->hdrs = nh;
        h->cap_hdrs = cap;
    }
    char *n = strndup(name, nlen), *v = strndup(value, vlen);
    if (!n || !v) {
        free(n);
        free(v);
        return false;
    }
    h->hdrs[h->n_hdrs].name = n;
    h->hdrs[h->n_hdrs].value = v;
    h->n_hdrs++;
    return true;
}

/* Does this status carry a body whose Content-Length means what it says? */
static bool status_has_body(int status)
{
    return status >= 200 && status != 204 && status != 304;
}

static size_t on_header(char *data, size_t size, size_t nitems, void *ud)
{
    fed_http_handle *h = ud;
    size_t total = size * nitems, len = total;
    while (len && (data[len - 1] == '\n' || data[len - 1] == '\r')) len--;

    size_t prefix = strlen(HTTP_STATUS_PREFIX);
    bool status_line = len >= prefix && memcmp(data, HTTP_STATUS_PREFIX, prefix) == 0;
    if (status_line) { /* a new response starts */
        headers_reset(h);
        h->header_bytes = 0;
        const char *p = memchr(data, ' ', len);
        h->status = 0;
        int digits = 0;
        if (p)
            for (p++; p < data + len && digits < HTTP_STATUS_DIGITS && *p >= '0' && *p <= '9';
                 p++, digits++)
                h->status = h->status * 10 + (*p - '0');
    }
    h->header_bytes += total;
    if (h->header_bytes > FED_HTTP_MAX_HEADER_BYTES) {
        h->too_large = true;
        snprintf(h->why, sizeof(h->why), "the response headers are over %d bytes",
                 FED_HTTP_MAX_HEADER_BYTES);
        return 0;
    }
    if (len == 0 || status_line) return total;

    if ((data[0] == ' ' || data[0] == '\t') && h->n_hdrs) { /* an obsolete folded line */
        fed_http_hdr *last = &h->hdrs[h->n_hdrs - 1];
        size_t old = strlen(last->value);
        char *nv = realloc(last->value, old + len + 1);
        if (!nv) goto oom;
        memcpy(nv + old, data, len);
        nv[old + len] = '\0';
        last->value = nv;
        return total;
    }
    const char *colon = memchr(data, ':', len);
    if (!colon) return total; /* not a header; curl decides whether that is fatal */
    const char *v = colon + 1, *end = data + len;
    while (v < end && (*v == ' ' || *v == '\t')) v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t')) end--;
    if (!header_add(h, data, (size_t)(colon - data), v, (size_t)(end - v))) goto oom;

    size_t cl_len = strlen(CONTENT_LENGTH);
    if (status_has_body(h->status) && (size_t)(colon - data) == cl_len &&
        strncasecmp(data, CONTENT_LENGTH, cl_len) == 0) {
        char num[FED_HTTP_CONTENT_LENGTH_DIGITS_MAX + 1];
        size_t vl = (size_t)(end - v);
        if (vl < sizeof(num)) {
            memcpy(num, v, vl);
            num[vl] = '\0';
            int64_t declared;
            int rc = atrium_parse_int64(num, 0, INT64_MAX, &declared);
            if (num[0] != '-' && rc != ATRIUM_E_INVAL && declared > h->max_body_bytes) {
                refuse_too_large(h, true,
                                 declared);
                return 0;
            }
        }
    }
    return total;
oom:
    h->out_of_memory = true;
    return 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    fed_http_handle *h = ud;
    size_t len = size * nmemb;
    if (len == 0) return 0;
    if ((int64_t)len > h->max_body_bytes - h->received) {
        refuse_too_large(h, false,
                         (long long)h->received + (long long)len);
        return 0;
    }
    h->received += (int64_t)len;
    if (h->on_chunk) {
        if (h->on_chunk(h->arg, h, data, len) != 0) {
            h->chunk_refused = true;
            return 0;
        }
        return len;
    }
    if (h->len + len + 1 > h->cap) {
        size_t cap = h->cap ? h->cap : FED_HTTP_BODY_INITIAL_BYTES;
        while (cap < h->len + len + 1) cap *= 2;
        char *nb = realloc(h->buf, cap);
        if (!nb) {
            h->out_of_memory = true;
            return 0;
        }
        h->buf = nb;
        h->cap = cap;
    }
    memcpy(h->buf + h->len, data, len);
    h->len += len;
    h->buf[h->len] = '\0';
    return len;
}

static void sockaddr_text(const struct sockaddr *sa, char *out, size_t n)
{
    const char *raw = (const char *)sa;
    sa_family_t family;
    memcpy(&family, raw + offsetof(struct sockaddr, sa_family), sizeof(family));
    unsigned char addr[16];
    if (family == AF_INET) memcpy(addr, raw + offsetof(struct sockaddr_in, sin_addr), 4);
    else if (family == AF_INET6) memcpy(addr, raw + offsetof(struct sockaddr_in6, sin6_addr), 16);
    if ((family != AF_INET && family != AF_INET6) || !inet_ntop(family, addr, out, (socklen_t)n))
        snprintf(out, n, "(address family %d)", (int)family);
}

/* The address rule, on the address actually being connected to. */
static curl_socket_t open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *a)
{
    fed_http_handle *h = ud;
    (void)purpose;
    if (!h->operator_destination &&
        !rt_iprange_allowed(h->rules->blacklist, h->rules->whitelist, &a->addr)) {
        char ip[FED_HTTP_IP_BYTES];
        sockaddr_text(&a->addr, ip, sizeof(ip));
        h->blocked = true;
        snprintf(h->why, sizeof(h->why),
                 "connecting to %s was refused: the address is in federation.ip_range_blacklist "
                 "and not in federation.ip_range_whitelist",
                 ip);
        return CURL_SOCKET_BAD;
    }
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

/* ---- the easy handle (I/O thread) -------------------------------------------------------- */

static struct curl_slist *slist_add(struct curl_slist *l, const char *line, bool *ok)
{
    if (!*ok) return l;
    struct curl_slist *n = curl_slist_append(l, line);
    if (!n) {
        *ok = false;
        return l;
    }
    return n;
}

bool fed_http_transfer_setup(fed_http_handle *h, const fed_http_rules *rules)
{
    h->rules = rules;
    CURL *e = h->easy = curl_easy_init();
    if (!e) return false;
    bool ok = true;
    struct curl_slist *hl = NULL;
    char line[FED_HTTP_ERROR_BYTES];
    /* Expect: 100-continue would stall every larger body for a second. */
    hl = slist_add(hl, "Expect:", &ok);
    if (h->content_type) {
        snprintf(line, sizeof(line), "Content-Type: %s", h->content_type);
        hl = slist_add(hl, line, &ok);
    } else {
        hl = slist_add(hl, "Content-Type:", &ok); /* no form-encoded default for a body */
    }
    if (h->host_header) {
        size_t n = strlen(h->host_header) + 7;
        char *hh = malloc(n);
        if (hh) {
            snprintf(hh, n, "Host: %s", h->host_header);
            hl = slist_add(hl, hh, &ok);
            free(hh);
        } else {
            ok = false;
        }
    }
    for (char **p = h->headers; *p; p++) hl = slist_add(hl, *p, &ok);
    h->header_list = hl;
    if (h->resolve_line) h->resolve_list = slist_add(NULL, h->resolve_line, &ok);
    if (!ok) return false;

    int64_t left = h->deadline_ms - rt_now_ms();
    CURLcode r = CURLE_OK;
#define SET(opt, val)                                                                      \
    do {                                                                                   \
        if (r == CURLE_OK) r = curl_easy_setopt(e, opt, val);                              \
    } while (0)
    SET(CURLOPT_URL, h->url);
    SET(CURLOPT_PRIVATE, h);
    SET(CURLOPT_ERRORBUFFER, h->errbuf);
    SET(CURLOPT_NOSIGNAL, 1L);
    SET(CURLOPT_PROTOCOLS_STR, "https,http");
    SET(CURLOPT_FOLLOWLOCATION, 0L);
    SET(CURLOPT_PROXY, "");
    SET(CURLOPT_NOPROXY, "*");
    SET(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    SET(CURLOPT_PIPEWAIT, h->https ? 1L : 0L);
    SET(CURLOPT_TCP_KEEPALIVE, 1L);
    SET(CURLOPT_USERAGENT, "Atrium/" ATRIUM_VERSION);
    SET(CURLOPT_TIMEOUT_MS, (long)(left > 1 ? left : 1));
    SET(CURLOPT_HTTPHEADER, h->header_list);
    if (h->resolve_list) SET(CURLOPT_RESOLVE, h->resolve_list);
    SET(CURLOPT_OPENSOCKETFUNCTION, open_socket);
    SET(CURLOPT_OPENSOCKETDATA, h);
    SET(CURLOPT_HEADERFUNCTION, on_header);
    SET(CURLOPT_HEADERDATA, h);
    SET(CURLOPT_WRITEFUNCTION, on_body);
    SET(CURLOPT_WRITEDATA, h);
    SET(CURLOPT_SSL_VERIFYPEER, h->verify_tls ? 1L : 0L);
    SET(CURLOPT_SSL_VERIFYHOST, h->verify_tls ? 2L : 0L);
    if (rules->ca_blob) {
        SET(CURLOPT_CAINFO, (char *)NULL);
        SET(CURLOPT_CAPATH, (char *)NULL);
        SET(CURLOPT_CAINFO_BLOB, rules->ca_blob);
    }
    if (strcmp(h->method, "GET") == 0) {
        SET(CURLOPT_HTTPGET, 1L);
    } else {
        if (strcmp(h->method, "POST") != 0) SET(CURLOPT_CUSTOMREQUEST, h->method);
        if (h->body || strcmp(h->method, "DELETE") != 0) {
            SET(CURLOPT_POSTFIELDS, h->body ? h->body : "");
            SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)h->body_len);
        }
    }
#undef SET
    return r == CURLE_OK;
}

int fed_http_transfer_outcome(fed_http_handle *h, CURLcode rc, char *msg, size_t n)
{
    if (rc == CURLE_OK) {
        snprintf(msg, n, "%s", "");
        return FED_HTTP_OK;
    }
    /* What a callback refused says more than the CURLE_WRITE_ERROR it caused. */
    if (h->too_large) {
        snprintf(msg, n, "%s", h->why);
        return FED_HTTP_E_TOO_LARGE;
    }
    if (h->chunk_refused) {
        snprintf(msg, n, "the body callback refused the rest of the body");
        return FED_HTTP_E_CANCELLED;
    }
    if (h->out_of_memory) {
        snprintf(msg, n, "out of memory while reading the response");
        return FED_HTTP_E_INTERNAL;
    }
    snprintf(msg, n, "%s%s%s", curl_easy_strerror(rc), h->errbuf[0] ? ": " : "", h->errbuf);
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        return FED_HTTP_E_TIMEOUT;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        if (!h->blocked) return FED_HTTP_E_CONNECT;
        snprintf(msg, n, "%s", h->why);
        return FED_HTTP_E_BLOCKED;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_ENGINE_NOTFOUND:
    case CURLE_SSL_ENGINE_SETFAILED:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ENGINE_INITFAILED:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_SHUTDOWN_FAILED:
    case CURLE_SSL_CRL_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CLIENTCERT:
    case CURLE_USE_SSL_FAILED:
        return FED_HTTP_E_TLS;
    case CURLE_FILESIZE_EXCEEDED:
        return FED_HTTP_E_TOO_LARGE;
    case CURLE_OUT_OF_MEMORY:
    case CURLE_FAILED_INIT:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
    case CURLE_UNKNOWN_OPTION:
    case CURLE_UNSUPPORTED_PROTOCOL:
        return FED_HTTP_E_INTERNAL;
    default: /* GOT_NOTHING, RECV_ERROR, SEND_ERROR, PARTIAL_FILE, WEIRD_SERVER_REPLY, HTTP2 */
        return FED_HTTP_E_PROTOCOL;
    }
}

/* ---- inside callbacks ------------------------------------------------------------------ */

int fed_http_handle_status(fed_http_handle *h)
{
    return h ? h->status : 0;
}

const char *fed_http_handle_header(fed_http_handle *h, const char *name)
{
    if (!h || !name) return NULL;
    for (size_t i = h->n_hdrs; i-- > 0;)
        if (strcasecmp(h->hdrs[i].name, name) == 0) return h->hdrs[i].value;
    return NULL;
}
