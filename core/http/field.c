/*
 * core/http/field.c - typed fields of a JSON request body, answered with the spec's error
 * codes when they are wrong, so every endpoint refuses a bad field the same way: 400
 * M_MISSING_PARAM for an absent required field, M_BAD_JSON for a wrong type,
 * M_INVALID_PARAM for a string over its limit or with a NUL in it. The body itself is
 * read with http_req_json (request.c); this file does not decide which fields an endpoint
 * takes. Internal prefix: http_field_.
 */
#include <string.h>

#include "core/http/http.h"

bool http_field_string(atrium_req *r, json_t *obj, const char *key, bool required, size_t max_bytes,
                const char **out)
{
    *out = NULL;
    json_t *v = json_object_get(obj, key);
    if (!v || (json_is_null(v) && !required)) {
        if (!required) return true;
        http_respond_error(r, 400, "M_MISSING_PARAM", "Missing '%s'", key);
        return false;
    }
    if (!json_is_string(v)) {
        http_respond_error(r, 400, "M_BAD_JSON", "'%s' must be a string", key);
        return false;
    }
    if (max_bytes && json_string_length(v) > max_bytes) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'%s' is longer than %zu bytes", key,
                           max_bytes);
        return false;
    }
    if (strlen(json_string_value(v)) != json_string_length(v)) {
        http_respond_error(r, 400, "M_INVALID_PARAM", "'%s' must not contain NUL", key);
        return false;
    }
    *out = json_string_value(v);
    return true;
}

bool http_field_bool(atrium_req *r, json_t *obj, const char *key, bool def, bool *out)
{
    *out = def;
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return true;
    if (!json_is_boolean(v)) {
        http_respond_error(r, 400, "M_BAD_JSON", "'%s' must be true or false", key);
        return false;
    }
    *out = json_is_true(v);
    return true;
}

bool http_field_object(atrium_req *r, json_t *obj, const char *key, bool required, json_t **out)
{
    *out = NULL;
    json_t *v = json_object_get(obj, key);
    if (!v || (json_is_null(v) && !required)) {
        if (!required) return true;
        http_respond_error(r, 400, "M_MISSING_PARAM", "Missing '%s'", key);
        return false;
    }
    if (!json_is_object(v)) {
        http_respond_error(r, 400, "M_BAD_JSON", "'%s' must be an object", key);
        return false;
    }
    *out = v;
    return true;
}
