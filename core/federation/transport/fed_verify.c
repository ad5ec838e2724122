/*
 * core/federation/transport/fed_verify.c - "is this JSON object signed by that server?", with the
 * server's key taken from the key ring (fed_keyring.h), fetched when it is not cached.
 * What plugins reach through the host table's fed_verify_json, and what checks a signed
 * object from another server anywhere in the core.
 *
 * The object is copied, so the caller may free its own at once; the answer comes through a
 * callback, at once when the key is in memory, else when the fetch ends (on the ring's or
 * the outbound client's thread). The first ed25519 signature of the server is the one
 * checked: a server signs with one current key, and an object signed with several keys is
 * valid when that one is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/federation/transport/fed_internal.h"

typedef struct verify_job {
    json_t *obj;
    char server[FED_SERVER_NAME_MAX_BYTES];
    char key_id[FED_KEY_ID_MAX_BYTES];
    fed_verify_cb done;
    void *arg;
} verify_job;

static void finish(verify_job *j, const fed_key_result *res)
{
    char why[FED_KEYRING_ERROR_MAX_BYTES + 64];
    int rc;
    if (res->status != FED_KEY_FOUND) {
        rc = res->status;
        snprintf(why, sizeof(why), "%s", res->error);
    } else {
        why[0] = '\0';
        rc = fed_verify_json(j->obj, j->server, j->key_id, res->key.public_key, why,
                             sizeof(why));
    }
    j->done(j->arg, rc, rc == 0 ? "" : why);
    json_decref(j->obj);
    free(j);
}

static void looked_up(void *arg, const fed_key_result *res)
{
    finish(arg, res);
}

int fed_verify_signed(const json_t *obj, const char *server_name, int64_t valid_at_ms,
                      fed_verify_cb done, void *arg)
{
    fed_module *m = fed_state();
    if (!json_is_object(obj) || !server_name || !done) return ATRIUM_E_INVAL;
    const json_t *sigs = json_object_get(json_object_get(obj, "signatures"), server_name);
    const char *key_id = NULL;
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)sigs, k, v) {
        if (strncmp(k, "ed25519:", 8) == 0 && json_is_string(v)) {
            key_id = k;
            break;
        }
    }
    if (!key_id) {
        done(arg, FED_SIG_E_UNSIGNED, "no ed25519 signature of that server");
        return 0;
    }
    if (!m) {
        done(arg, ATRIUM_E_STOPPED, "federation is not running");
        return 0;
    }
    if (strcmp(server_name, m->server_name) == 0) { /* our own key: no look-up */
        char why[160] = "";
        int rc = strcmp(key_id, m->key.key_id) == 0
                     ? fed_verify_json(obj, server_name, key_id, m->key.public_key, why,
                                       sizeof(why))
                     : FED_SIG_E_UNSIGNED;
        done(arg, rc, rc == 0 ? "" : (why[0] ? why : "not signed with this server's key"));
        return 0;
    }
    verify_job *j = calloc(1, sizeof(*j));
    if (!j) return ATRIUM_E_NOMEM;
    j->obj = json_deep_copy(obj);
    snprintf(j->server, sizeof(j->server), "%s", server_name);
    snprintf(j->key_id, sizeof(j->key_id), "%s", key_id);
    j->done = done;
    j->arg = arg;
    if (!j->obj) {
        free(j);
        return ATRIUM_E_NOMEM;
    }
    fed_key_result now;
    if (fed_keyring_lookup(m->keyring, j->server, j->key_id, valid_at_ms, &now, looked_up, j) ==
        FED_KEYRING_ANSWERED)
        finish(j, &now);
    return 0;
}
