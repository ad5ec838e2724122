/*
 * core/http/gate.c - the front door of the client listener: every new connection waits
 * here, off the request pool, until its request headers are complete, and is checked
 * before libmicrohttpd sees it.
 *
 * Two things libmicrohttpd 0.9.75 cannot be told to do are done here. First, a deadline
 * for complete headers: its only timeout is for inactivity, so a client sending a header
 * byte every few seconds holds a connection (and its slot under the connection limit)
 * forever; here a connection that has not sent its complete headers within
 * server.http.header_timeout_ms gets 408 and is closed. Second, Matrix answers for
 * framing errors: libmicrohttpd answers a bad Content-Length, an unsupported HTTP version
 * or headers too large for its memory pool with HTML pages of its own (and hangs on some,
 * such as thousands of query parameters); here those requests get a JSON Matrix error
 * with the right status and never reach it.
 *
 * How: the gate owns the listening socket and one thread with an epoll set
 * (edge-triggered). A new connection's bytes are looked at with MSG_PEEK - nothing is
 * consumed - until the header block ends; http_gate_check_head judges it, and a good
 * connection is handed with MHD_add_connection to one of the request pool's daemons (one
 * thread each) - one whose thread is not inside a handler, with the fewest connections -
 * which reads the same bytes again. One whose headers are complete while every worker is
 * full waits in the gate ("ready") until a slot frees.
 *
 * Past the connection limit, connections wait in the kernel's accept queue, unaccepted
 * (docs/adr/0025-queue-past-the-connection-limit.md). A connection waiting there costs the
 * process no descriptor, and a client that is refused rather than kept waiting - an
 * image in Element, which does not retry one - is a broken picture; so the gate never
 * refuses a request for want of room:
 *   - served connections: the last server.cheap_reserve of them are for cheap requests
 *     only (pick_worker), so requests that wait (parked media, long-polls) never hold all;
 *     and a worker is handed one that may wait only while fewer than HTTP_WORKER_BACKLOG
 *     of its connections have not started their first request or woken requests their
 *     run (resume_line.c), so a cheap request handed to it waits behind a few, not behind
 *     a storm or a wake fan-out; the rest are held here, ready, counted
 *     as served and out of the gate's room (hold), so they never stop it accepting
 *     (docs/performance.md, "Parked long-polls");
 *   - the gate's own room (gate_max_pending) holds connections still sending headers and
 *     ready ones waiting for a slot; when it is full of slow senders, the slowest goes;
 *     when it is full otherwise, the gate stops accepting until a slot frees, and new
 *     connections wait in the accept queue (GATE_LISTEN_BACKLOG, capped by the kernel's
 *     net.core.somaxconn) in arrival order. Once accepted, one has the header deadline
 *     like any other. The queue adds no deadline of its own (the kernel does not say how
 *     long a connection waited): the longest wait is the queue's length over the rate
 *     connections free, and a client that tires of it closes its connection - its
 *     request may still be judged, and is dropped where the core notices the client
 *     gone (before a handoff runs, or at the first write);
 *   - a /health behind a queue of a thousand thumbnails waits for them: load balancers
 *     ask the operational listener (server.ops, server.c), whose connections are its own;
 *   - a spare descriptor is held from start-up, so even when the process runs out of
 *     descriptors (EMFILE: the connection limit leaves room for everything else, so
 *     something else overran its share) a connection is accepted on it and refused with
 *     503 instead of the listening socket staying readable forever.
 *
 * What it does not do: look at the second and later requests of a keep-alive connection
 * (those bytes go to libmicrohttpd directly), nor the federation listener (TLS: its bytes
 * cannot be peeked). Those are judged by the same rules (framing.c) once libmicrohttpd
 * parsed them (server.c, refuse_framing), and what libmicrohttpd refuses by itself is
 * answered with a Matrix error all the same (mhd_answers.c).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/http/http.h"

#define GATE_MAX_METHOD_BYTES 32
/* The accept queue's length asked of listen(); Linux caps it at net.core.somaxconn
 * (4096 by default since 5.4, Debian 12 included). Connections past the limit wait there. */
#define GATE_LISTEN_BACKLOG 4096
#define SOMAXCONN_PATH "/proc/sys/net/core/somaxconn"
#define GATE_EPOLL_BATCH 64
#define GATE_IDLE_WAIT_MS 1000 /* epoll wait when no deadline is near */
#define GATE_DRAIN_BYTES (64 * 1024) /* read before closing a refused one (FIN, not RST) */
#define GATE_FULL_RETRY_MS 20 /* at the connection limit: how often room is looked for */
#define GATE_EVICT_MIN_AGE_MS 1000 /* one that sent nothing yet is evicted from this age */

typedef struct gate_conn {
    int fd;
    int64_t deadline_ms;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    bool ready; /* headers complete and good; waiting for room under the limit */
    bool cheap; /* http_gate_cheap_request */
    bool dead;  /* dropped or handed over: freed after the current batch of events */
    bool partial; /* sent part of its headers (a whole head comes in one piece) */
    /* ready with room under the limit, waiting only for a worker's backlog to fall
     * (pick_worker): counted as a served connection, not in the gate's room */
    bool held;
    /* in the gate's list of those sending headers (arrival order, so deadline order), or
     * once ready in the list of ready ones (the order they became ready in) */
    struct gate_conn *prev, *next;
} gate_conn;

struct http_gate {
    http_server *srv;
    int listen_fd, epfd, wake_fd;
    int spare_fd; /* held so a connection can be accepted and refused at EMFILE */
    bool accepting; /* the listening socket is in the epoll set */
    int n_ready, n_ready_cheap;
    pthread_t thread;
    bool started;
    atomic_bool stop;
    gate_conn *head, *tail;   /* sending their headers */
    gate_conn *rhead, *rtail; /* ready, waiting for room or for a worker */
    gate_conn *graveyard; /* dead ones, still named by events of the current batch */
    int n_pending;
    int max_pending;
    int64_t header_timeout_ms;
    char peek[HTTP_MAX_HEAD_BYTES]; /* a head that does not fit is refused (431, 414) */
    rt_metric *m_pending, *m_timeouts, *m_refused, *m_full, *m_shed;
};

/* ---- judging a request head (pure) --------------------------------------------------- */

static bool is_tchar(unsigned char c)
{
    /* RFC 9110 token characters */
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

static int refuse(const char **errcode, char *msg, size_t msglen, int status, const char *code,
                  const char *text)
{
    *errcode = code;
    snprintf(msg, msglen, "%s", text);
    return status;
}

/* One line of buf [from, end): its length without CR LF, and where the next starts. */
static size_t line_at(const char *buf, size_t len, size_t from, size_t *next)
{
    const char *nl = memchr(buf + from, '\n', len - from);
    size_t end = nl ? (size_t)(nl - buf) : len;
    *next = nl ? end + 1 : len;
    if (end > from && buf[end - 1] == '\r') end--;
    return end - from;
}

size_t http_gate_head_end(const char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != '\n') continue;
        if (i + 1 < len && buf[i + 1] == '\n') return i + 2;
        if (i + 2 < len && buf[i + 1] == '\r' && buf[i + 2] == '\n') return i + 3;
    }
    return 0;
}

int http_gate_check_head(const char *buf, size_t len, const char **errcode, char *msg,
                         size_t msglen)
{
    size_t next;
    size_t n = line_at(buf, len, 0, &next);
    const char *line = buf;
    /* request line: method SP target SP HTTP/x.y */
    const char *sp1 = memchr(line, ' ', n);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', n - (size_t)(sp1 + 1 - line)) : NULL;
    if (!sp1 || !sp2 || sp1 == line || sp2 == sp1 + 1)
        return refuse(errcode, msg, msglen, 400, "M_UNKNOWN", "Malformed request line");
    size_t method_len = (size_t)(sp1 - line);
    if (method_len > GATE_MAX_METHOD_BYTES)
        return refuse(errcode, msg, msglen, 400, "M_UNKNOWN", "Malformed request line");
    for (size_t i = 0; i < method_len; i++)
        if (!is_tchar((unsigned char)line[i]))
            return refuse(errcode, msg, msglen, 400, "M_UNKNOWN", "Malformed request line");
    const char *target = sp1 + 1;
    size_t target_len = (size_t)(sp2 - target);
    size_t args = 0;
    bool in_query = false;
    for (size_t i = 0; i < target_len; i++) {
        unsigned char c = (unsigned char)target[i];
        if (c <= 0x20 || c == 0x7f)
            return refuse(errcode, msg, msglen, 400, "M_UNKNOWN", "Malformed request target");
        if (c == '?' && !in_query) in_query = true, args = 1;
        else if (in_query && c == '&') args++;
    }
    const char *version = sp2 + 1;
    size_t version_len = n - (size_t)(version - line);
    if (version_len != 8 || strncmp(version, "HTTP/", 5) != 0 || version[6] != '.' ||
        version[5] < '0' || version[5] > '9' || version[7] < '0' || version[7] > '9')
        return refuse(errcode, msg, msglen, 400, "M_UNKNOWN", "Malformed request line");
    if (strncmp(version, "HTTP/1.1", 8) != 0 && strncmp(version, "HTTP/1.0", 8) != 0)
        return refuse(errcode, msg, msglen, 505, "M_UNRECOGNIZED",
                      "Only HTTP/1.0 and HTTP/1.1 are served here");

    /* header lines, up to the empty one */
    int headers = 0;
    http_framing framing = {0};
    const char *limit_code, *limit_msg;
    int over = http_head_limits(len, 0, args, &limit_code, &limit_msg);
    if (over) return refuse(errcode, msg, msglen, over, limit_code, limit_msg);
    for (size_t at = next; at < len;) {
        n = line_at(buf, len, at, &next);
        line = buf + at;
        at = next;
        if (n == 0) break; /* the end of the head */
        over = http_head_limits(len, (size_t)++headers, args, &limit_code, &limit_msg);
        if (over) return refuse(errcode, msg, msglen, over, limit_code, limit_msg);
        if (line[0] == ' ' || line[0] == '\t')
            return refuse(errcode, msg, msglen, 400, "M_UNKNOWN",
                          "Folded header lines are not accepted");
        const char *colon = memchr(line, ':', n);
        if (!colon || colon == line)
            return refuse(errcode, msg, msglen, 400, "M_UNKNOWN", "Malformed header line");
        for (const char *p = line; p < colon; p++)
            if (!is_tchar((unsigned char)*p))
                return refuse(errcode, msg, msglen, 400, "M_UNKNOWN", "Malformed header name");
        int status = http_framing_header(&framing, line, (size_t)(colon - line), colon + 1,
                                         (size_t)(line + n - (colon + 1)));
        if (status) return refuse(errcode, msg, msglen, status, framing.errcode, framing.msg);
    }
    int status = http_framing_end(&framing);
    if (status) return refuse(errcode, msg, msglen, status, framing.errcode, framing.msg);
    return 0;
}

/* ---- connections --------------------------------------------------------------------- */

static void list_remove(gate_conn **head, gate_conn **tail, gate_conn *c)
{
    if (c->prev) c->prev->next = c->next;
    else *head = c->next;
    if (c->next) c->next->prev = c->prev;
    else *tail = c->prev;
    c->prev = c->next = NULL;
}

static void list_append(gate_conn **head, gate_conn **tail, gate_conn *c)
{
    c->prev = *tail;
    c->next = NULL;
    if (*tail) (*tail)->next = c;
    else *head = c;
    *tail = c;
}

/* Leaves the gate's room (a held one left it when it was held). */
static void leave_room(http_gate *g, gate_conn *c)
{
    if (c->held) return;
    g->n_pending--;
    rt_metric_add(g->m_pending, -1);
}

static void unlink_conn(http_gate *g, gate_conn *c)
{
    if (c->ready) list_remove(&g->rhead, &g->rtail, c);
    else list_remove(&g->head, &g->tail, c);
    leave_room(g, c);
}

/* A connection leaves the gate: later events of the same epoll batch may still name it,
 * so it is freed only after the batch (free_dead). */
static void bury(http_gate *g, gate_conn *c)
{
    c->dead = true;
    c->fd = -1;
    c->next = g->graveyard;
    g->graveyard = c;
}

static void free_dead(http_gate *g)
{
    while (g->graveyard) {
        gate_conn *c = g->graveyard;
        g->graveyard = c->next;
        free(c);
    }
}

/* Answer a connection that never reached libmicrohttpd, and close it. What the client
 * already sent is read first (a little), so the close sends FIN rather than a reset that
 * could destroy the answer before the client reads it. */
static void answer_and_close(int fd, int status, const char *errcode, const char *msg)
{
    char wire[2048];
    size_t n = http_error_wire(NULL, status, errcode, msg, wire, sizeof(wire));
    if (n > 0 && send(fd, wire, n, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)n)
        shutdown(fd, SHUT_WR);
    char sink[4096];
    size_t drained = 0;
    while (drained < GATE_DRAIN_BYTES) {
        ssize_t r = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
        if (r <= 0) break;
        drained += (size_t)r;
    }
    close(fd);
}

/* n_ready, mirrored for the workers (http_gate_poke wakes the gate only while some wait). */
static void count_ready(http_gate *g, gate_conn *c, int d)
{
    g->n_ready += d;
    if (c->cheap) g->n_ready_cheap += d;
    atomic_fetch_add(&g->srv->gate_ready, d);
}

/* A held connection was counted as served on the client listener (hold): no more. */
static void unhold(http_gate *g, gate_conn *c)
{
    if (c->held) atomic_fetch_sub(&g->srv->listeners[HTTP_LISTENER_CLIENT].open_connections, 1);
}

static void drop(http_gate *g, gate_conn *c, int status, const char *errcode, const char *msg)
{
    if (c->ready) count_ready(g, c, -1);
    else epoll_ctl(g->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    unlink_conn(g, c);
    unhold(g, c);
    if (status) {
        answer_and_close(c->fd, status, errcode, msg);
        http_count_status(g->srv, status);
    } else {
        close(c->fd);
    }
    bury(g, c);
}

/* Requests that are answered at once, without waiting for anything: the operational
 * endpoints and the client's first calls. They may use the reserved connections. */
static const char *const CHEAP_PATHS[] = {
    "/health", "/metrics", "/_matrix/client/versions", "/.well-known/matrix/client",
    "/.well-known/matrix/server", "/.well-known/matrix/support",
    "/_matrix/client/v3/account/whoami",
    "/_matrix/client/r0/account/whoami",
};

bool http_gate_cheap_request(const char *head, size_t len)
{
    const char *sp = memchr(head, ' ', len);
    if (!sp) return false;
    size_t mlen = (size_t)(sp - head);
    if (!((mlen == 3 && memcmp(head, "GET", 3) == 0) || (mlen == 4 && memcmp(head, "HEAD", 4) == 0) ||
          (mlen == 7 && memcmp(head, "OPTIONS", 7) == 0)))
        return false;
    const char *path = sp + 1, *end = head + len;
    size_t plen = 0; /* the head is not NUL-terminated: a bounded scan */
    while (path + plen < end && !strchr(" ?\r\n", path[plen])) plen++;
    for (size_t i = 0; i < sizeof(CHEAP_PATHS) / sizeof(CHEAP_PATHS[0]); i++)
        if (strlen(CHEAP_PATHS[i]) == plen && memcmp(CHEAP_PATHS[i], path, plen) == 0) return true;
    return false;
}

/* The worker a new connection goes to: among those with room, the one with the fewest
 * connections not started yet (its thread's backlog), then one whose thread is not in a
 * handler, then the fewest connections. NULL when none has room. The last cheap_reserve
 * connections are for cheap requests only: requests that wait (a gallery of thumbnails in
 * the media line, long-polling syncs) can fill the rest, never these, so /health and
 * /versions are answered throughout a storm. And a request that may wait is handed only
 * to a worker with fewer than HTTP_WORKER_BACKLOG unstarted: a storm of long-polls stays
 * ready here (costing a descriptor, no thread) and is handed over as the workers take it,
 * so a cheap request handed over meanwhile is behind a few requests, not thousands. */
static http_listener *pick_worker(http_gate *g, bool cheap, bool held)
{
    http_server *s = g->srv;
    int total = atomic_load(&s->listeners[HTTP_LISTENER_CLIENT].open_connections) - held;
    if (total >= s->max_connections - (cheap ? 0 : s->cheap_reserve)) return NULL;
    http_listener *best = NULL;
    int best_backlog = 0, best_busy = 0, best_open = 0;
    for (int i = 0; i < s->n_workers; i++) {
        http_listener *w = &s->workers[i];
        int open = atomic_load(&w->open_connections), busy = atomic_load(&w->busy) > 0;
        /* what a request handed to it waits behind: new connections and woken runs */
        int backlog = atomic_load(&w->unstarted) + atomic_load(&w->resumed);
        /* per-worker shares are soft (the total above is the limit), up to twice */
        if (open >= w->max_connections * (cheap ? 2 : 1)) continue;
        if (!cheap && backlog >= HTTP_WORKER_BACKLOG) continue;
        if (!best || backlog < best_backlog || (backlog == best_backlog && busy < best_busy) ||
            (backlog == best_backlog && busy == best_busy && open < best_open)) {
            best = w;
            best_backlog = backlog;
            best_busy = busy;
            best_open = open;
        }
    }
    return best;
}

/* Under the limit (ignoring workers' backlogs)? A ready connection that is waits for a
 * worker only, and is held: counted as served, out of the gate's room, so a storm of
 * long-polls waiting for the workers does not fill the room and stop the gate accepting
 * (a cheap request would then wait behind them in the accept queue). */
static void hold(http_gate *g, gate_conn *c)
{
    http_server *s = g->srv;
    atomic_int *total = &s->listeners[HTTP_LISTENER_CLIENT].open_connections;
    if (c->held || atomic_load(total) >= s->max_connections - (c->cheap ? 0 : s->cheap_reserve))
        return;
    atomic_fetch_add(total, 1);
    leave_room(g, c);
    c->held = true;
}

/* Hand a connection with a good head to a worker (which owns the fd from then on, also
 * when it fails: libmicrohttpd closes it), or keep it ready until one has room. */
static void admit(http_gate *g, gate_conn *c)
{
    http_listener *w = pick_worker(g, c->cheap, c->held);
    if (!w) {
        if (!c->ready) {
            epoll_ctl(g->epfd, EPOLL_CTL_DEL, c->fd, NULL);
            list_remove(&g->head, &g->tail, c);
            c->ready = true;
            list_append(&g->rhead, &g->rtail, c);
            count_ready(g, c, 1);
        }
        hold(g, c);
        return;
    }
    if (c->ready) count_ready(g, c, -1);
    else epoll_ctl(g->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    unlink_conn(g, c);
    c->ready = false;
    if (c->held) atomic_fetch_add(&w->open_connections, 1); /* its parent counted it already */
    else http_listener_count(w, 1); /* counted now: the worker starts it a little later */
    atomic_fetch_add(&w->unstarted, 1); /* until its first request (server.c) */
    if (MHD_add_connection(w->daemon, c->fd, (const struct sockaddr *)&c->addr, c->addrlen) !=
        MHD_YES) {
        http_listener_count(w, -1);
        atomic_fetch_sub(&w->unstarted, 1);
        rt_log(ATRIUM_LOG_DEBUG, "http", "a connection could not be added (%s)", strerror(errno));
    }
    bury(g, c);
}

/* Stop or resume accepting: at the connection limit new connections stay in the accept
 * queue. */
static void set_accepting(http_gate *g, bool on)
{
    if (on == g->accepting) return;
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = g};
    if (epoll_ctl(g->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, g->listen_fd, &lev) == 0)
        g->accepting = on;
}

/* Ready connections get the room that freed, oldest first (a cheap one may pass others:
 * it has room the others have not). */
static void admit_ready(http_gate *g)
{
    bool waiters_blocked = false; /* one that may wait found no worker: nor will the rest */
    for (gate_conn *c = g->rhead, *next; c; c = next) {
        next = c->next;
        if (waiters_blocked && g->n_ready_cheap == 0) break;
        if (waiters_blocked && !c->cheap) continue;
        admit(g, c);
        if (!c->dead && !c->cheap) waiters_blocked = true;
    }
}

/* Look at what the connection sent so far (without consuming it). */
static void inspect(http_gate *g, gate_conn *c, uint32_t events)
{
    if (c->dead) return;
    if (c->ready) return; /* out of the epoll set, named by an event of this batch */
    ssize_t n = recv(c->fd, g->peek, sizeof(g->peek), MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        drop(g, c, 0, NULL, NULL); /* the client left */
        return;
    }
    if (n < 0) return;
    size_t end = http_gate_head_end(g->peek, (size_t)n);
    if (end == 0) {
        c->partial = n > 0;
        if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) { /* gone before its headers ended */
            drop(g, c, 0, NULL, NULL);
            return;
        }
        if ((size_t)n >= sizeof(g->peek)) {
            rt_metric_add(g->m_refused, 1);
            if (memchr(g->peek, '\n', (size_t)n))
                drop(g, c, 431, "M_UNKNOWN", "The request headers are too large");
            else
                drop(g, c, 414, "M_UNKNOWN", "The request line is too long");
        }
        return; /* more to come */
    }
    const char *errcode = NULL;
    char msg[128];
    int status = http_gate_check_head(g->peek, end, &errcode, msg, sizeof(msg));
    c->cheap = http_gate_cheap_request(g->peek, end);
    if (status) {
        rt_metric_add(g->m_refused, 1);
        drop(g, c, status, errcode, msg);
        return;
    }
    admit(g, c);
}

/* Out of descriptors: the spare one is given up to accept the next connection and refuse
 * it with 503, then taken again, so the accept queue keeps moving (and the listening socket,
 * which stays readable, does not spin the loop). Without a spare (it could not be taken
 * back), accepting pauses until a connection of the gate's closes. */
static void refuse_on_spare(http_gate *g, int err)
{
    rt_log(ATRIUM_LOG_ERROR, "http",
           "out of file descriptors (%s): refusing new connections with 503; raise the "
           "descriptor limit or server.http.fd_reserve",
           strerror(err));
    if (g->spare_fd < 0) {
        set_accepting(g, false);
        return;
    }
    close(g->spare_fd);
    int fd = accept4(g->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
        rt_metric_add(g->m_shed, 1);
        answer_and_close(fd, 503, "M_UNKNOWN", "The server is busy; retry shortly");
        http_count_status(g->srv, 503);
    }
    g->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || g->spare_fd < 0) set_accepting(g, false);
}

static void accept_all(http_gate *g)
{
    for (;;) {
        if (g->n_pending >= g->max_pending) {
            /* Full of connections still sending headers: the oldest of those goes. A real
             * client sends its headers within a round trip and is hardly ever the oldest;
             * a slow sender is, so slow senders cannot lock newcomers out. When none is
             * slow (all ready and waiting for room, or just arrived), new connections wait
             * in the accept queue instead. */
            /* Slow: sent part of its headers (a real client's head comes in one piece), or
             * nothing for a while. One that connected a moment ago and sent nothing yet is
             * not slow, only not there yet (a burst of new clients). */
            int64_t young = rt_now_ms() - GATE_EVICT_MIN_AGE_MS + g->header_timeout_ms;
            gate_conn *slow = g->head;
            while (slow && !slow->partial && slow->deadline_ms > young)
                slow = slow->next;
            if (slow) {
                rt_metric_add(g->m_timeouts, 1);
                drop(g, slow, 408, "M_UNKNOWN", "The request headers did not arrive in time");
            } else {
                rt_metric_add(g->m_full, 1);
                set_accepting(g, false); /* newcomers wait in the accept queue */
                return;
            }
        }
        gate_conn *c = calloc(1, sizeof(*c));
        if (!c) return;
        c->addrlen = sizeof(c->addr);
        c->fd = accept4(g->listen_fd, (struct sockaddr *)&c->addr, &c->addrlen,
                        SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c->fd < 0) {
            int e = errno;
            free(c);
            if (e == EMFILE || e == ENFILE) {
                refuse_on_spare(g, e);
                if (!g->accepting) return;
                continue;
            }
            return; /* EAGAIN: all taken; other errors: try at the next event */
        }
        c->deadline_ms = rt_now_ms() + g->header_timeout_ms;
        list_append(&g->head, &g->tail, c);
        g->n_pending++;
        rt_metric_add(g->m_pending, 1);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = c};
        if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, c->fd, &ev) < 0) {
            drop(g, c, 503, "M_UNKNOWN", "The server cannot take this connection now");
            continue;
        }
        inspect(g, c, 0); /* the headers may be there already */
    }
}

static void expire(http_gate *g, int64_t now)
{
    for (gate_conn *c = g->head, *next; c && c->deadline_ms <= now; c = next) {
        next = c->next;
        rt_metric_add(g->m_timeouts, 1);
        drop(g, c, 408, "M_UNKNOWN", "The request headers did not arrive in time");
    }
}

/* A worker's backlog fell (http_gate_poke): admit_ready runs after this batch. */
static void take_pokes(http_gate *g)
{
    uint64_t n;
    if (read(g->srv->gate_poke_fd, &n, sizeof(n)) < 0) { /* EAGAIN: taken already */
    }
}

void http_gate_poke(http_server *s)
{
    uint64_t one = 1;
    if (atomic_load(&s->gate_ready) > 0 && s->gate_poke_fd >= 0 &&
        write(s->gate_poke_fd, &one, sizeof(one)) < 0) { /* full: a wake is pending anyway */
    }
}

static void *gate_main(void *arg)
{
    http_gate *g = arg;
    struct epoll_event evs[GATE_EPOLL_BATCH];
    while (!atomic_load(&g->stop)) {
        int64_t now = rt_now_ms();
        int wait = g->accepting && g->n_ready == 0 ? GATE_IDLE_WAIT_MS : GATE_FULL_RETRY_MS;
        gate_conn *first = g->head;
        if (first) {
            int64_t left = first->deadline_ms - now;
            wait = left < 0 ? 0 : left < wait ? (int)left : wait;
        }
        int n = epoll_wait(g->epfd, evs, GATE_EPOLL_BATCH, wait);
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == g) accept_all(g);
            else if (evs[i].data.ptr == &g->srv->gate_poke_fd) take_pokes(g);
            else if (evs[i].data.ptr) inspect(g, evs[i].data.ptr, evs[i].events);
        }
        admit_ready(g);
        if (!g->accepting && g->n_pending < g->max_pending) {
            if (g->spare_fd < 0) g->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
            set_accepting(g, true);
            accept_all(g);
        }
        expire(g, rt_now_ms());
        free_dead(g);
    }
    while (g->head) drop(g, g->head, 0, NULL, NULL);
    while (g->rhead) drop(g, g->rhead, 0, NULL, NULL);
    free_dead(g);
    return NULL;
}

/* The accept queue connections past the limit wait in: GATE_LISTEN_BACKLOG, or less when
 * the kernel caps it (net.core.somaxconn). Past it the kernel drops new connections' SYNs
 * and their clients send them again a second later, then later still: a short queue turns
 * a burst into slow connects, so the operator is told. */
static void check_accept_queue(void)
{
    FILE *f = fopen(SOMAXCONN_PATH, "r");
    int cap = GATE_LISTEN_BACKLOG;
    if (f) {
        if (fscanf(f, "%d", &cap) != 1) cap = GATE_LISTEN_BACKLOG;
        fclose(f);
    }
    if (cap < GATE_LISTEN_BACKLOG)
        rt_log(ATRIUM_LOG_WARN, "http",
               "the accept queue holds %d connections (net.core.somaxconn), not %d: past the "
               "connection limit a burst larger than that connects slowly; raise "
               "net.core.somaxconn (sysctl)",
               cap, GATE_LISTEN_BACKLOG);
}

http_gate *http_gate_start(http_server *s, const struct sockaddr *addr, socklen_t addrlen,
                           int *port_out)
{
    http_gate *g = calloc(1, sizeof(*g));
    if (!g) return NULL;
    g->srv = s;
    g->header_timeout_ms = s->cfg->http.header_timeout_ms;
    g->max_pending = s->gate_max_pending;
    g->listen_fd = g->epfd = g->wake_fd = g->spare_fd = -1;
    g->m_pending = rt_metric_gauge(s->metrics, "atrium_http_connections_awaiting_headers", NULL,
                                   "New client connections whose headers are not complete yet");
    g->m_timeouts = rt_metric_counter(s->metrics, "atrium_http_header_timeouts_total", NULL,
                                      "Connections closed with 408: headers too slow");
    g->m_refused = rt_metric_counter(s->metrics, "atrium_http_bad_framing_total", NULL,
                                     "Requests refused for their framing before routing");
    g->m_full = rt_metric_counter(s->metrics, "atrium_http_gate_full_total", NULL,
                                  "Times the gate stopped accepting: every slot waiting for room");
    g->m_shed = rt_metric_counter(s->metrics, "atrium_http_gate_shed_total", NULL,
                                  "Connections refused with 503 because the process ran out "
                                  "of file descriptors");
    g->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (g->spare_fd < 0) goto fail;
    int one = 1;
    g->listen_fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (g->listen_fd < 0 ||
        setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(g->listen_fd, addr, addrlen) < 0 || listen(g->listen_fd, GATE_LISTEN_BACKLOG) < 0)
        goto fail;
    check_accept_queue();
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    if (port_out && getsockname(g->listen_fd, (struct sockaddr *)&bound, &blen) == 0)
        *port_out = ntohs(bound.ss_family == AF_INET6
                              ? ((struct sockaddr_in6 *)&bound)->sin6_port
                              : ((struct sockaddr_in *)&bound)->sin_port);
    g->epfd = epoll_create1(EPOLL_CLOEXEC);
    g->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (g->epfd < 0 || g->wake_fd < 0) goto fail;
    struct epoll_event wev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, g->wake_fd, &wev) < 0) goto fail;
    struct epoll_event pev = {.events = EPOLLIN, .data.ptr = &s->gate_poke_fd};
    if (epoll_ctl(g->epfd, EPOLL_CTL_ADD, s->gate_poke_fd, &pev) < 0) goto fail;
    set_accepting(g, true);
    if (!g->accepting) goto fail;
    if (pthread_create(&g->thread, NULL, gate_main, g) != 0) goto fail;
    g->started = true;
    return g;
fail:;
    int e = errno;
    http_gate_stop(g);
    errno = e;
    return NULL;
}

void http_gate_stop(http_gate *g)
{
    if (!g) return;
    if (g->started) {
        atomic_store(&g->stop, true);
        uint64_t one = 1;
        if (write(g->wake_fd, &one, sizeof(one)) < 0) { /* epoll_wait ends within 1 s anyway */
        }
        pthread_join(g->thread, NULL);
    }
    if (g->listen_fd >= 0) close(g->listen_fd);
    if (g->epfd >= 0) close(g->epfd);
    if (g->wake_fd >= 0) close(g->wake_fd);
    if (g->spare_fd >= 0) close(g->spare_fd);
    free(g);
}
