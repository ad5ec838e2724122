/*
 * core/runtime/iprange.h - lists of IP ranges (CIDR) and the one question asked of
 * them: may the server open a connection to this address?
 *
 * The outbound client asks it for every socket it opens (fed_http.h), so the answer is
 * about the address actually connected to. IPv4-mapped IPv6 addresses (::ffff:a.b.c.d)
 * are judged as the IPv4 address they map, so a mapping cannot smuggle a blacklisted
 * address past the list. Internal prefix: rt_iprange_. Any thread once built.
 */
#ifndef ATRIUM_CORE_RT_IPRANGE_H
#define ATRIUM_CORE_RT_IPRANGE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

typedef struct rt_iprange_list rt_iprange_list;

/* The default blacklist: loopback, RFC 1918, link-local, CGNAT (100.64/10), 0.0.0.0/8,
 * multicast, broadcast and the other IANA special-purpose ranges, IPv6 loopback,
 * unspecified, ULA (fc00::/7), link-local, multicast, and the ::ffff: mappings of the IPv4
 * ones (by the mapping rule above). NULL-terminated, static. */
extern const char *const RT_IPRANGE_DEFAULT_BLACKLIST[];

/* Parse "10.0.0.0/8", "::1/128", "192.0.2.1" (a single address), ... into a list. NULL with
 * err naming the first bad entry. */
rt_iprange_list *rt_iprange_parse(const char *const *cidrs, size_t n, char *err,
                                    size_t errlen);
void rt_iprange_free(rt_iprange_list *l);
/* Does any range of l contain the address? (NULL l contains nothing; nor does it contain
 * a non-IP address, or for _str a string that is not an IP literal.) An IPv4 address is
 * also matched against the IPv6 ranges in its ::ffff: form. */
bool rt_iprange_contains(const rt_iprange_list *l, const struct sockaddr *sa);
bool rt_iprange_contains_str(const rt_iprange_list *l, const char *ip);
/* The rule: allowed unless on the blacklist and not on the whitelist. A socket address
 * that is neither IPv4 nor IPv6 is never allowed. */
bool rt_iprange_allowed(const rt_iprange_list *black, const rt_iprange_list *white,
                         const struct sockaddr *sa);

#endif
