/*
 * core/client/accounts/admin_register.h - the MAC of shared-secret admin registration, shared by
 * the server's /_synapse/admin/v1/register and the `atrium register-user` command, so both sides
 * compute it with the one function below.
 */
#ifndef ATRIUM_CORE_ADMIN_REGISTER_H
#define ATRIUM_CORE_ADMIN_REGISTER_H

#include <stdbool.h>

#include "core/runtime/hmac_sha1.h"

#define ADMIN_MAC_HEX_CHARS (2 * RT_SHA1_DIGEST_BYTES)

/* hex_out (ADMIN_MAC_HEX_CHARS + 1 bytes) = lower-case hex of HMAC-SHA1 under secret of
 * nonce NUL username NUL password NUL ("admin" | "notadmin"), as Synapse defines it. */
void admin_register_mac(const char *secret, const char *nonce, const char *username,
                        const char *password, bool admin, char *hex_out);

#endif
