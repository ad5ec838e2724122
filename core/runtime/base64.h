/*
 * core/runtime/base64.h - the one base64 decoder of the server: keys, seeds and
 * signatures that other servers (and operators migrating a key file) hand us, read by
 * federation and by the room model alike, so it sits in the runtime below both.
 *
 * Matrix writes unpadded standard base64, but the appendix asks decoders to accept padding
 * too, and Synapse also accepts the URL-safe alphabet; so this decoder takes all of them:
 * either alphabet ('+' or '-' for 62, '/' or '_' for 63), with or without '=' padding.
 * It is strict about everything else (no whitespace, no padding in the middle, no length
 * that no encoding can have), because a lenient decoder that skips junk would let two
 * different strings name the same key. Encoding stays in cjson_b64. Internal prefix:
 * rt_b64_. Any thread, no state.
 */
#ifndef ATRIUM_CORE_RT_BASE64_H
#define ATRIUM_CORE_RT_BASE64_H

#include <stddef.h>

/* The most bytes `in_len` characters of base64 can decode to (a bound for out_cap). */
#define RT_B64_DECODED_MAX(in_len) (((in_len) / 4) * 3 + 2)

/* Decode in[0..in_len) into out (at most out_cap bytes). Returns the number of bytes
 * decoded, or -1 when the input is not base64 (a character outside both alphabets, '='
 * anywhere but at the end, a wrong amount of padding, a length of 4k+1) or decodes to
 * more than out_cap bytes. Nothing is promised about out's contents after a failure. */
long rt_b64_decode(const char *in, size_t in_len, unsigned char *out, size_t out_cap);

/* Decode a NUL-terminated string that must decode to exactly `want` bytes (a 32-byte key,
 * a 64-byte signature). 0, or -1 as above or when the length differs. */
int rt_b64_decode_exact(const char *in, unsigned char *out, size_t want);

#endif
