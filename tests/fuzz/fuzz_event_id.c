/*
 * tests/fuzz/fuzz_event_id.c - libFuzzer target: the event ID and content hash of a PDU
 * (core/rooms/events.c: event_compute_id, event_reference_hash, event_add_content_hash,
 * over the canonical JSON of core/rooms/canonical_json.c), in versions 1, 3, 4 and 11.
 *
 * Checked: the same PDU gives the same ID twice; a v3+ ID is "$" and 43 characters of
 * unpadded base64 in the version's alphabet; a v1-2 ID passes event_opaque_id_valid; a
 * content hash that was just added is then found correct; nothing reads past a buffer.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/rooms/events.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

static const char *const VERSIONS[] = {"1", "3", "4", "11"};

static void check_id(const room_version *v, const char *id)
{
    if (v->event_id_format == ROOM_EVENT_ID_OPAQUE) {
        if (!event_opaque_id_valid(id)) abort();
        return;
    }
    if (id[0] != '$' || strlen(id) != 44) abort();
    for (const char *p = id + 1; *p; p++) {
        bool url = v->event_id_format != ROOM_EVENT_ID_HASH_B64;
        bool ok = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') ||
                  (*p >= '0' && *p <= '9') || (url ? (*p == '-' || *p == '_') : (*p == '+' || *p == '/'));
        if (!ok) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t err;
    json_t *pdu = json_loadb((const char *)data, size, 0, &err);
    if (!pdu) return 0;
    for (size_t i = 0; i < sizeof(VERSIONS) / sizeof(VERSIONS[0]); i++) {
        const room_version *v = room_version_find(VERSIONS[i]);
        if (!v) abort();
        char a[EVENT_ID_LEN], b[EVENT_ID_LEN];
        int ra = event_compute_id(v, pdu, a);
        int rb = event_compute_id(v, pdu, b);
        if (ra != rb || (ra == 0 && strcmp(a, b) != 0)) abort();
        if (ra == 0) check_id(v, a);
        char ref[CJSON_SHA256_B64_LEN];
        (void)event_reference_hash(v, pdu, ref);
    }
    if (json_is_object(pdu)) {
        json_t *copy = json_deep_copy(pdu);
        if (copy && event_add_content_hash(copy) == 0 && !event_content_hash_ok(copy)) abort();
        json_decref(copy);
    }
    json_decref(pdu);
    return 0;
}
