/*
 * core/http/tls.c - the federation listener's certificate: loaded from PEM files, handed
 * to GnuTLS per handshake through libmicrohttpd's certificate callback, and swapped on
 * SIGHUP so a renewed certificate needs no restart.
 *
 * Why a callback and not MHD_OPTION_HTTPS_MEM_CERT: libmicrohttpd reads a memory
 * certificate once, when the daemon starts. With the callback every new handshake asks for
 * the current certificate, so a reload is one pointer swap. GnuTLS neither frees nor copies
 * what the callback returns and may use it for the life of the session, so a replaced
 * certificate is kept (not freed) until the server stops: reloads are rare and each costs a
 * few kilobytes. A reload that fails keeps the certificate in use and says why.
 */
#include <errno.h>
#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/http/http.h"

#define TLS_MAX_CHAIN 16                       /* certificates in one chain file */
#define TLS_MAX_FILE_BYTES (1024 * 1024)       /* a PEM file larger than this is refused */

typedef struct tls_generation {
    gnutls_pcert_st chain[TLS_MAX_CHAIN];
    unsigned n_chain;
    gnutls_privkey_t key;
    struct tls_generation *older;
} tls_generation;

static pthread_mutex_t tls_mu = PTHREAD_MUTEX_INITIALIZER;
static tls_generation *tls_current; /* newest first; older ones kept for live sessions */

static int read_file(const char *path, gnutls_datum_t *out, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    unsigned char *buf = malloc(TLS_MAX_FILE_BYTES + 1);
    size_t n = buf ? fread(buf, 1, TLS_MAX_FILE_BYTES + 1, f) : 0;
    int failed = ferror(f);
    fclose(f);
    if (!buf || failed || n == 0 || n > TLS_MAX_FILE_BYTES) {
        snprintf(err, errlen, "cannot read %s (empty, unreadable or over %d bytes)", path,
                 TLS_MAX_FILE_BYTES);
        free(buf);
        return -1;
    }
    out->data = buf;
    out->size = (unsigned)n;
    return 0;
}

static void generation_free(tls_generation *g)
{
    for (unsigned i = 0; i < g->n_chain; i++) gnutls_pcert_deinit(&g->chain[i]);
    if (g->key) gnutls_privkey_deinit(g->key);
    free(g);
}

int http_tls_load(const char *cert_path, const char *key_path, char *err, size_t errlen)
{
    gnutls_datum_t cert = {0}, key = {0};
    tls_generation *g = calloc(1, sizeof(*g));
    if (!g) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    int rc = -1;
    if (read_file(cert_path, &cert, err, errlen) < 0 || read_file(key_path, &key, err, errlen) < 0)
        goto out;
    g->n_chain = TLS_MAX_CHAIN;
    int grc = gnutls_pcert_list_import_x509_raw(g->chain, &g->n_chain, &cert, GNUTLS_X509_FMT_PEM,
                                                0);
    if (grc < 0 || g->n_chain == 0) {
        snprintf(err, errlen, "%s holds no usable PEM certificate: %s", cert_path,
                 gnutls_strerror(grc));
        g->n_chain = 0;
        goto out;
    }
    if ((grc = gnutls_privkey_init(&g->key)) < 0 ||
        (grc = gnutls_privkey_import_x509_raw(g->key, &key, GNUTLS_X509_FMT_PEM, NULL, 0)) < 0) {
        snprintf(err, errlen, "%s holds no usable PEM private key: %s", key_path,
                 gnutls_strerror(grc));
        goto out;
    }
    pthread_mutex_lock(&tls_mu);
    g->older = tls_current;
    tls_current = g;
    pthread_mutex_unlock(&tls_mu);
    g = NULL;
    rc = 0;
out:
    if (g) generation_free(g);
    free(cert.data);
    if (key.data) {
        memset(key.data, 0, key.size);
        free(key.data);
    }
    return rc;
}

void http_tls_free_all(void)
{
    pthread_mutex_lock(&tls_mu);
    tls_generation *g = tls_current;
    tls_current = NULL;
    pthread_mutex_unlock(&tls_mu);
    while (g) {
        tls_generation *older = g->older;
        generation_free(g);
        g = older;
    }
}

/* GnuTLS asks for the certificate of each handshake (libmicrohttpd passes this through). */
static int retrieve_cert(gnutls_session_t session, const gnutls_datum_t *req_ca_dn, int nreqs,
                         const gnutls_pk_algorithm_t *pk_algos, int pk_algos_length,
                         gnutls_pcert_st **pcert, unsigned int *pcert_length,
                         gnutls_privkey_t *pkey)
{
    (void)session;
    (void)req_ca_dn;
    (void)nreqs;
    (void)pk_algos;
    (void)pk_algos_length;
    pthread_mutex_lock(&tls_mu);
    tls_generation *g = tls_current;
    pthread_mutex_unlock(&tls_mu);
    if (!g) return -1;
    *pcert = g->chain;
    *pcert_length = g->n_chain;
    *pkey = g->key;
    return 0;
}

void *http_tls_cert_callback(void)
{
    return (void *)&retrieve_cert;
}
