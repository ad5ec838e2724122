/*
 * core/runtime/arena.c - bump allocation for memory that lives as long as a request.
 *
 * Owns the nginx rule: request memory comes from the request's arena and is
 * never freed piecemeal, so a handler cannot leak it on an early return and cannot free it
 * twice. Memory is taken from chunks of chunk_bytes; an allocation larger than a chunk gets a
 * chunk of its own so a big body never wastes the rest of a normal chunk. Every pointer is
 * RT_ARENA_ALIGN_BYTES aligned and zeroed: each allocation is cleared as it is handed out,
 * not the whole chunk up front (a request's arena is created for every request and most
 * of its chunk is never used). Not thread-safe by design (one owner at a time);
 * no realloc, no per-allocation free: resources that need releasing are holds, not arena
 * memory.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/runtime/runtime.h"

#define RT_ARENA_ALIGN_BYTES 16
#define RT_ARENA_DEFAULT_CHUNK_BYTES 4096
#define RT_ARENA_MIN_CHUNK_BYTES 256

typedef struct rt_chunk {
    struct rt_chunk *next;
    size_t size; /* usable bytes in data */
    size_t used;
    _Alignas(RT_ARENA_ALIGN_BYTES) unsigned char data[];
} rt_chunk;

struct rt_arena {
    rt_chunk *head; /* the chunk being filled; older and oversize chunks follow */
    size_t chunk_bytes;
    size_t used; /* bytes handed out, counted after rounding to the alignment */
};

static size_t round_up(size_t n)
{
    return (n + RT_ARENA_ALIGN_BYTES - 1) & ~(size_t)(RT_ARENA_ALIGN_BYTES - 1);
}

static rt_chunk *chunk_new(size_t size)
{
    if (size > SIZE_MAX - sizeof(rt_chunk))
        return NULL;
    /* Not zeroed here: rt_arena_alloc clears what it hands out. */
    rt_chunk *c = malloc(sizeof(rt_chunk) + size);
    if (c == NULL)
        return NULL;
    c->next = NULL;
    c->size = size;
    c->used = 0;
    return c;
}

rt_arena *rt_arena_new(size_t chunk_bytes)
{
    if (chunk_bytes == 0)
        chunk_bytes = RT_ARENA_DEFAULT_CHUNK_BYTES;
    if (chunk_bytes < RT_ARENA_MIN_CHUNK_BYTES)
        chunk_bytes = RT_ARENA_MIN_CHUNK_BYTES;
    rt_arena *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return NULL;
    a->chunk_bytes = round_up(chunk_bytes);
    a->head = chunk_new(a->chunk_bytes);
    if (a->head == NULL) {
        free(a);
        return NULL;
    }
    return a;
}

void *rt_arena_alloc(rt_arena *a, size_t size)
{
    RT_ASSERT(a != NULL, "rt_arena_alloc on a NULL arena");
    if (size == 0)
        size = 1; /* every allocation is a distinct pointer */
    if (size > SIZE_MAX - RT_ARENA_ALIGN_BYTES)
        return NULL;
    size_t need = round_up(size);
    rt_chunk *c = a->head;
    if (c->size - c->used < need) {
        if (need > a->chunk_bytes / 2) {
            /* Oversize: its own chunk, linked behind the head so the head keeps filling. */
            rt_chunk *big = chunk_new(need);
            if (big == NULL)
                return NULL;
            big->used = need;
            big->next = c->next;
            c->next = big;
            a->used += need;
            memset(big->data, 0, need);
            return big->data;
        }
        c = chunk_new(a->chunk_bytes);
        if (c == NULL)
            return NULL;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += need;
    a->used += need;
    memset(p, 0, need);
    RT_ASSERT(((uintptr_t)p & (RT_ARENA_ALIGN_BYTES - 1)) == 0, "arena pointer %p misaligned",
              p);
    return p;
}

char *rt_arena_strndup(rt_arena *a, const char *s, size_t n)
{
    RT_ASSERT(s != NULL, "rt_arena_strndup of NULL");
    size_t len = strnlen(s, n);
    char *d = rt_arena_alloc(a, len + 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, len); /* the terminator is already there: arena memory is zeroed */
    return d;
}

char *rt_arena_strdup(rt_arena *a, const char *s)
{
    RT_ASSERT(s != NULL, "rt_arena_strdup of NULL");
    return rt_arena_strndup(a, s, strlen(s));
}

char *rt_arena_printf(rt_arena *a, const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *d = NULL;
    if (n >= 0) {
        d = rt_arena_alloc(a, (size_t)n + 1);
        if (d != NULL)
            vsnprintf(d, (size_t)n + 1, fmt, ap2);
    }
    va_end(ap2);
    return d;
}

size_t rt_arena_used(const rt_arena *a)
{
    return a->used;
}

void rt_arena_reset(rt_arena *a)
{
    rt_chunk *keep = NULL, *c = a->head;
    while (c != NULL) {
        rt_chunk *next = c->next;
        if (keep == NULL && c->size == a->chunk_bytes) keep = c;
        else free(c);
        c = next;
    }
    if (keep == NULL)
        keep = chunk_new(a->chunk_bytes);
    if (keep != NULL) {
        keep->next = NULL;
        keep->used = 0;
    }
    a->head = keep;
    a->used = 0;
}

bool rt_arena_usable(const rt_arena *a)
{
    return a->head != NULL;
}

void rt_arena_free(rt_arena *a)
{
    if (a == NULL)
        return;
    rt_chunk *c = a->head;
    while (c != NULL) {
        rt_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(a);
}
