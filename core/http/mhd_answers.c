/*
 * core/http/mhd_answers.c - every answer libmicrohttpd makes up on its own goes out as a
 * Matrix error.
 *
 * libmicrohttpd 0.9.75 answers some requests without calling the access handler: framing
 * it cannot parse (a Content-Length that is no number, a malformed chunk, a chunk line
 * longer than the connection's buffer), a head too large for its memory, a version it
 * does not speak. The gate (gate.c) judges the first request of a
 * client connection before libmicrohttpd sees it, but not later requests on a kept-alive
 * connection, not request bodies, and not the federation listener (no gate; with TLS
 * there is nothing to peek at). libmicrohttpd's answers are HTML pages, and it has no
 * option to replace them.
 *
 * It builds each of them with its own exported MHD_queue_response, called through the
 * dynamic linker, where a definition in the program comes first. So this file defines
 * MHD_queue_response. Atrium's own responses go through http_mhd_queue_response, straight
 * to libmicrohttpd's function (looked up once, dlsym(RTLD_NEXT)); a call that reaches the
 * interposed name is therefore libmicrohttpd answering by itself. Its page is not sent:
 * the Matrix error for that status (own_answer), with the CORS headers every response
 * carries, is written on the connection at once instead (through its TLS session on the
 * federation listener), and the connection is closed, as libmicrohttpd would have.
 *
 * The one status mapped to another: 500. libmicrohttpd makes one up only when its read
 * buffer is full while a body arrives and the application consumed everything it was
 * given (on_access always does): that is a chunk line - size and extensions - longer
 * than the buffer, the client's doing, so 400.
 *
 * What it relies on: libmicrohttpd calling its exported function through its PLT, as
 * Debian's build does. A build linked with -Bsymbolic would send its HTML again;
 * test_bad_input.py's later-request, chunk and federation cases and test_cors.py would
 * fail and say so.
 */
#include <dlfcn.h>
#include <gnutls/gnutls.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "core/http/http.h"

#define ANSWER_WIRE_MAX_BYTES 2048 /* one Matrix error as a whole HTTP message */

typedef enum MHD_Result (*queue_fn)(struct MHD_Connection *, unsigned int, struct MHD_Response *);

static pthread_once_t real_once = PTHREAD_ONCE_INIT;
static queue_fn real_queue; /* libmicrohttpd's MHD_queue_response, set once */

static void find_real(void)
{
    real_queue = (queue_fn)dlsym(RTLD_NEXT, "MHD_queue_response");
    if (!real_queue) { /* the program is linked against libmicrohttpd: cannot happen */
        rt_log(ATRIUM_LOG_ERROR, "http", "libmicrohttpd's MHD_queue_response not found: %s",
               dlerror());
        abort();
    }
}

enum MHD_Result http_mhd_queue_response(struct MHD_Connection *c, unsigned int status,
                                        struct MHD_Response *resp)
{
    pthread_once(&real_once, find_real);
    return real_queue(c, status, resp);
}

/* The Matrix error for a status libmicrohttpd chose: the status to send, errcode, text. */
static unsigned own_answer(unsigned status, const char **errcode, const char **msg)
{
    *errcode = "M_UNKNOWN";
    switch (status) {
    case 400: *msg = "The request is malformed"; return 400;
    case 413: *errcode = "M_TOO_LARGE"; *msg = "The request body is too large"; return 413;
    case 414: *msg = "The request line is too long"; return 414;
    case 431: *msg = "The request headers are too large"; return 431;
    case 500: *msg = "A chunk line of the request body is too long"; return 400;
    case 505:
        *errcode = "M_UNRECOGNIZED";
        *msg = "Only HTTP/1.0 and HTTP/1.1 are served here";
        return 505;
    default: *msg = http_reason_phrase((int)status); return status;
    }
}

#define ANSWER_DRAIN_BYTES (64 * 1024) /* read before the close, so it sends FIN, not RST */

bool http_answer_now(struct MHD_Connection *c, const char *wire, size_t len)
{
    const union MHD_ConnectionInfo *fdi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *tls = MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
    if (!fdi) return false;
    int fd = fdi->connect_fd;
    bool sent;
    if (tls && tls->tls_session) {
        /* One record on the session libmicrohttpd set up; nothing of a response is in
         * flight (it answers a request only after the previous one was sent). */
        ssize_t w = gnutls_record_send((gnutls_session_t)tls->tls_session, wire, len);
        sent = w == (ssize_t)len;
    } else {
        sent = send(fd, wire, len, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)len;
    }
    if (!sent) return false;
    shutdown(fd, SHUT_WR); /* the client sees the end of the answer */
    char sink[4096];
    size_t drained = 0;
    while (drained < ANSWER_DRAIN_BYTES) {
        ssize_t r = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (r <= 0) break;
        drained += (size_t)r;
    }
    /* Nothing more is read or written: whatever libmicrohttpd does next on this
     * connection fails at once, and it closes it. */
    shutdown(fd, SHUT_RD);
    return true;
}

/* Has libmicrohttpd read the whole head of the request it refuses? It knows the head's
 * size from then until the request ends (0 before). */
static bool head_complete(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *hs =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_REQUEST_HEADER_SIZE);
    return hs && hs->header_size > 0;
}

/* Reached only by libmicrohttpd itself (see the top of the file). The Matrix error is
 * written at once (http_answer_now), which leaves the connection shut both ways. Queueing
 * it in place of libmicrohttpd's page would not do: after a bad Content-Length it builds
 * the header block of whatever is queued twice, and after the
 * query parameters filled its memory it goes on reading the head and never sends it.
 * Then, once the head is complete, MHD_NO makes libmicrohttpd close the connection (its
 * callers there expect that); while it is still being read, its state machine carries on
 * whatever this returns, so a response is queued to keep it consistent - the JSON one,
 * sent only if the direct write failed - and its sending fails on the shut socket. */
enum MHD_Result MHD_queue_response(struct MHD_Connection *c, unsigned int status,
                                   struct MHD_Response *resp)
{
    if (status < 400) return http_mhd_queue_response(c, status, resp); /* never seen */
    const char *errcode, *msg;
    unsigned mine = own_answer(status, &errcode, &msg);
    char wire[ANSWER_WIRE_MAX_BYTES];
    size_t n = http_error_wire(NULL, (int)mine, errcode, msg, wire, sizeof(wire));
    bool sent = n > 0 && http_answer_now(c, wire, n);
    rt_log(ATRIUM_LOG_DEBUG, "http", "libmicrohttpd refused a request with %u; %s %u %s",
           status, sent ? "answered" : "queueing", mine, errcode);
    if (head_complete(c)) return MHD_NO;
    struct MHD_Response *json = http_error_response((int)mine, errcode, msg, 0);
    if (!json) return http_mhd_queue_response(c, status, resp);
    http_add_cors(json);
    enum MHD_Result rc = http_mhd_queue_response(c, mine, json);
    MHD_destroy_response(json);
    return rc;
}
