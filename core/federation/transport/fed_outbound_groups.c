/*
 * core/federation/transport/fed_outbound_groups.c - the federation sender spread over the
 * processes sharing one database (docs/adr/0026-federation-sender-groups.md).
 *
 * Destinations are hashed (FNV-1a of the server name, modulo federation.sender_groups)
 * into groups, and a group's destinations are sent to only by the process holding the
 * group's lease, core.federation.outbound.<g> (core/store/lease.h). So the rules of the
 * queue (fed_outbound.c: one transaction in flight per destination, its ID kept across
 * retries) hold per destination as they held for the one sender before: a lease is held
 * by one process at a time, and a process stops believing it holds one before its row
 * expires. The hash must never change between versions: two processes hashing one
 * destination differently would both send to it.
 *
 * Sharing out. Each process announces itself with a lease of its own,
 * core.federation.senders.<random> (renewed like any lease, so it ends with the process),
 * and every ttl / 4 counts the live announcements (lease_count_live): its share is
 * ceil(groups / senders). Under its share it wants every group it does not hold (the
 * lease thread takes those nobody holds: a dead process's once their rows expired); at or
 * over it it wants none more; over it, it leaves the extra groups: no new transaction to
 * their destinations, and once none of them has one in flight the lease is given up
 * (lease_want false: the belief ends at once, the row is deleted at once), and a process
 * under its share takes it at its next try. A new process is thus given groups within
 * about half a ttl, and a dead one's groups are taken within the ttl: its announcement
 * is renewed after its group leases in each round (created first, the lease thread runs
 * the newest first), so by the time the survivors count one sender fewer, the dead one's
 * group rows have expired and the survivors' immediate tries take them.
 *
 * Not here: the queue, the transactions and their answers (fed_outbound.c).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>

#include "core/federation/transport/fed_outbound_groups.h"

#define FED_GROUPS_LEASE_PREFIX "core.federation.outbound."
#define FED_GROUPS_SENDERS_PREFIX "core.federation.senders."
#define FED_GROUPS_SENDER_ID_BYTES 8 /* random bytes naming this process's announcement */
#define FED_GROUPS_BALANCE_DIVISOR 4 /* the groups are shared out again every ttl / 4 */
#define FED_GROUPS_FNV_OFFSET UINT32_C(2166136261)
#define FED_GROUPS_FNV_PRIME UINT32_C(16777619)

typedef struct fed_group {
    lease *lease; /* NULL without a lease service: always held */
    bool wanted;  /* what lease_want was last told */
    bool leaving; /* over this process's share: drained, then given up */
    bool busy;    /* a transaction in flight to one of its destinations (this pass) */
} fed_group;

struct fed_groups {
    int n;
    fed_group *groups;
    lease *announce; /* core.federation.senders.<random>, or NULL */
    int64_t period_ms, next_balance_ms;
    _Atomic bool announced; /* set on the lease thread: balance at once */
    _Atomic int held;
    void (*wake)(void *arg);
    void *wake_arg;
    rt_metric *m_held, *m_senders;
};

fed_groups *fed_groups_new(int n_groups, rt_metrics *metrics)
{
    if (n_groups < 1 || n_groups > FED_GROUPS_MAX) return NULL;
    fed_groups *g = calloc(1, sizeof(*g));
    if (!g || !(g->groups = calloc((size_t)n_groups, sizeof(*g->groups)))) {
        free(g);
        return NULL;
    }
    g->n = n_groups;
    atomic_init(&g->held, n_groups);
    g->m_held = rt_metric_gauge(metrics, "atrium_federation_outbound_groups_held", NULL,
                                "Destination groups this process's federation sender holds");
    g->m_senders = rt_metric_gauge(metrics, "atrium_federation_outbound_senders", NULL,
                                   "Processes sharing the destination groups, as last counted");
    rt_metric_set(g->m_held, n_groups);
    rt_metric_set(g->m_senders, 1);
    return g;
}

/* On the lease thread: a lease came to this process. */
static void group_gained(void *arg)
{
    fed_groups *g = arg;
    g->wake(g->wake_arg);
}

static void announced(void *arg)
{
    fed_groups *g = arg;
    atomic_store(&g->announced, true);
    g->wake(g->wake_arg);
}

int fed_groups_start(fed_groups *g, lease_service *s, int64_t ttl_ms, void (*wake)(void *arg),
                     void *arg)
{
    if (!s) return 0;
    g->wake = wake;
    g->wake_arg = arg;
    g->period_ms = ttl_ms / FED_GROUPS_BALANCE_DIVISOR;
    unsigned char raw[FED_GROUPS_SENDER_ID_BYTES];
    char hex[2 * FED_GROUPS_SENDER_ID_BYTES + 1], name[LEASE_NAME_MAX_BYTES];
    randombytes_buf(raw, sizeof(raw));
    sodium_bin2hex(hex, sizeof(hex), raw, sizeof(raw));
    /* First, so that each round renews it after the groups (see the top of the file). */
    snprintf(name, sizeof(name), "%s%s", FED_GROUPS_SENDERS_PREFIX, hex);
    g->announce = lease_create(s, name, ttl_ms, announced, g);
    for (int i = 0; g->announce && i < g->n; i++) {
        snprintf(name, sizeof(name), "%s%d", FED_GROUPS_LEASE_PREFIX, i);
        if (!(g->groups[i].lease = lease_create_idle(s, name, ttl_ms, group_gained, g))) break;
    }
    if (!g->announce || !g->groups[g->n - 1].lease) {
        rt_log(ATRIUM_LOG_ERROR, "federation", "cannot create the federation sender's leases");
        return ATRIUM_E_NOMEM;
    }
    atomic_store(&g->held, 0);
    rt_metric_set(g->m_held, 0);
    rt_log(ATRIUM_LOG_INFO, "federation", "federation sender %s shares %d destination groups",
           lease_name(g->announce), g->n);
    return 0;
}

int fed_groups_of(const fed_groups *g, const char *destination)
{
    uint32_t h = FED_GROUPS_FNV_OFFSET;
    for (const unsigned char *p = (const unsigned char *)destination; *p; p++)
        h = (h ^ *p) * FED_GROUPS_FNV_PRIME;
    return (int)(h % (uint32_t)g->n);
}

bool fed_groups_sendable(const fed_groups *g, int group)
{
    const fed_group *x = &g->groups[group];
    return !x->leaving && lease_held(x->lease);
}

lease *fed_groups_lease(const fed_groups *g, int group)
{
    return g->groups[group].lease;
}

int fed_groups_count_held(fed_groups *g)
{
    int held = 0;
    for (int i = 0; i < g->n; i++)
        if (lease_held(g->groups[i].lease)) held++;
    atomic_store(&g->held, held);
    rt_metric_set(g->m_held, held);
    return held;
}

bool fed_groups_all_held(const fed_groups *g)
{
    return atomic_load(&g->held) >= g->n;
}

/* Over the share: leave the extra groups, the highest first. */
static void leave_extra(fed_groups *g, int held, int share)
{
    for (int i = g->n - 1; i >= 0 && held > share; i--) {
        fed_group *x = &g->groups[i];
        if (x->leaving || !lease_held(x->lease)) continue;
        x->leaving = true;
        held--;
        rt_log(ATRIUM_LOG_INFO, "federation",
               "%s: over this process's share of %d, given up once drained", lease_name(x->lease),
               share);
    }
}

int64_t fed_groups_balance_in(const fed_groups *g)
{
    if (!g->announce) return -1;
    if (atomic_load(&g->announced)) return 0;
    if (!lease_held(g->announce)) return -1;
    int64_t left = g->next_balance_ms - rt_now_ms();
    return left > 0 ? left : 0;
}

void fed_groups_balance(fed_groups *g, PGconn *c)
{
    if (!g->announce) return;
    atomic_store(&g->announced, false);
    g->next_balance_ms = rt_now_ms() + g->period_ms;
    /* Not announced (not yet, or the database refuses the renewal): take nothing. */
    if (!lease_held(g->announce)) return;
    int senders = lease_count_live(c, FED_GROUPS_SENDERS_PREFIX);
    if (senders < 1) return; /* logged; the next round counts again */
    rt_metric_set(g->m_senders, senders);
    int share = (g->n + senders - 1) / senders;
    int held = 0;
    for (int i = 0; i < g->n; i++)
        if (!g->groups[i].leaving && lease_held(g->groups[i].lease)) held++;
    if (held > share) leave_extra(g, held, share);
    bool want = held < share;
    for (int i = 0; i < g->n; i++) {
        fed_group *x = &g->groups[i];
        if (x->leaving || lease_held(x->lease) || x->wanted == want) continue;
        lease_want(x->lease, want);
        x->wanted = want;
    }
}

void fed_groups_clear_busy(fed_groups *g)
{
    for (int i = 0; i < g->n; i++) g->groups[i].busy = false;
}

void fed_groups_note_busy(fed_groups *g, int group)
{
    g->groups[group].busy = true;
}

void fed_groups_release_drained(fed_groups *g)
{
    for (int i = 0; i < g->n; i++) {
        fed_group *x = &g->groups[i];
        if (!x->leaving || x->busy) continue;
        lease_want(x->lease, false); /* not held from here on; the row goes at once */
        x->wanted = x->leaving = false;
    }
}

void fed_groups_free(fed_groups *g)
{
    if (!g) return;
    free(g->groups); /* the leases belong to the lease service */
    free(g);
}
