/*
 * tests/fuzz/fuzz_pdu.c - libFuzzer target: the checks a receiver runs on a PDU another
 * server sent before anything else looks at it (core/rooms/events.c: event_check_format,
 * event_required_signers, event_content_hash_ok, event_redact), in four room versions.
 *
 * The input is the PDU's JSON as a /send body would carry it (jansson's parse, as
 * core/federation/transport/fed_auth.c does). Checked: a refusal always says why; a PDU
 * that passes the format check has a sender, so its required signers are known; the
 * redacted copy of an accepted PDU passes the format check again (redaction never makes a
 * valid event invalid), and everything terminates under ASan and UBSan.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/rooms/events.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); /* libFuzzer's entry */

static const char *const VERSIONS[] = {"1", "6", "10", "11"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t err;
    json_t *pdu = json_loadb((const char *)data, size, 0, &err);
    if (!pdu) return 0;
    for (size_t i = 0; i < sizeof(VERSIONS) / sizeof(VERSIONS[0]); i++) {
        const room_version *v = room_version_find(VERSIONS[i]);
        if (!v) abort();
        char why[EVENT_WHY_LEN] = "";
        int rc = event_check_format(v, pdu, why);
        if (rc != EVENT_FORMAT_OK) {
            if (!why[0] || rc > 0 || rc < EVENT_FORMAT_NOT_CANONICAL) abort();
            continue;
        }
        json_t *signers = event_required_signers(v, pdu);
        if (!signers) abort();
        json_decref(signers);
        (void)event_content_hash_ok(pdu);
        json_t *red = event_redact(v, pdu);
        if (!red) abort();
        if (event_check_format(v, red, why) != EVENT_FORMAT_OK) abort();
        json_decref(red);
    }
    json_decref(pdu);
    return 0;
}
