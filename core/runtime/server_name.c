/*
 * core/runtime/server_name.c - the server-name grammar (server_name.h): one reading of
 * the spec's "Server Name" appendix, strict about DNS labels, shared by every layer.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>

#include "core/runtime/server_name.h"

#define LABEL_MAX_CHARS 63 /* RFC 1035 */
#define PORT_MAX_DIGITS 5
#define PORT_MAX 65535L
#define IPV6_MAX_CHARS 45 /* the spec's 2*45IPv6char */

static bool is_alnum(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Labels of 1-63 [A-Za-z0-9-] joined by single dots (an IPv4 address is such a name too). */
static bool dns_name_valid(const char *s, size_t len)
{
    if (len == 0) return false;
    size_t label = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '.') {
            if (label == 0) return false;
            label = 0;
        } else if (is_alnum(s[i]) || s[i] == '-') {
            if (++label > LABEL_MAX_CHARS) return false;
        } else {
            return false;
        }
    }
    return label > 0;
}

/* The spec's characters, read as an address a socket can be opened to (inet_pton). */
static bool ipv6_valid(const char *s, size_t len)
{
    char text[IPV6_MAX_CHARS + 1];
    unsigned char bin[sizeof(struct in6_addr)];
    if (len == 0 || len > IPV6_MAX_CHARS) return false;
    memcpy(text, s, len);
    text[len] = '\0';
    return inet_pton(AF_INET6, text, bin) == 1;
}

static bool port_valid(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > PORT_MAX_DIGITS) return false;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    return v >= 1 && v <= PORT_MAX;
}

bool rt_server_name_valid(const char *s)
{
    if (!s) return false;
    size_t len = strnlen(s, RT_SERVER_NAME_MAX_CHARS + 1);
    if (len == 0 || len > RT_SERVER_NAME_MAX_CHARS) return false;
    const char *host_end;
    if (s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close || !ipv6_valid(s + 1, (size_t)(close - s - 1))) return false;
        host_end = close + 1;
    } else {
        const char *colon = memchr(s, ':', len);
        host_end = colon ? colon : s + len;
        if (!dns_name_valid(s, (size_t)(host_end - s))) return false;
    }
    if (*host_end == '\0') return true;
    return *host_end == ':' && port_valid(host_end + 1);
}

bool rt_server_name_of_id_valid(const char *id)
{
    if (!id || !id[0]) return false;
    const char *colon = strchr(id + 1, ':');
    return colon && colon > id + 1 && rt_server_name_valid(colon + 1);
}
