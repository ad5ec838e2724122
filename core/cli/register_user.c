/*
 * core/cli/register_user.c - `atrium register-user`: create an account (an admin, usually
 * the first one) on a running server through shared-secret admin registration.
 *
 * The exchange is the server's own (core/client/accounts/admin_register.c): GET a nonce, then POST
 * the user with the MAC computed by the same function the server checks it with
 * (admin_register_mac). The secret comes from the config file (registration.shared_secret,
 * after ATRIUM__* environment overrides, as the server reads it); the URL defaults to the
 * config's listener, with a wildcard bind address replaced by loopback. Failures print the
 * server's errcode and error, so an operator sees "M_USER_IN_USE", not a bare status.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cli/cli.h"
#include "core/client/accounts/admin_register.h"
#include "core/config/config.h"

#define CLI_ERR_BYTES 1024
#define CLI_URL_BYTES 512
#define CLI_HTTP_TIMEOUT_S 30    /* a password hash on a busy server takes a while */
#define CLI_MAX_ANSWER_BYTES (64 * 1024)
#define CLI_PASSWORD_MAX_BYTES 1024

extern char **environ;

typedef struct answer {
    char *data;
    size_t len;
    bool too_large;
} answer;

static size_t collect(char *ptr, size_t size, size_t nmemb, void *userdata)
{
    answer *a = userdata;
    size_t n = size * nmemb;
    if (a->len + n > CLI_MAX_ANSWER_BYTES) {
        a->too_large = true;
        return 0;
    }
    char *grown = realloc(a->data, a->len + n + 1);
    if (!grown) return 0;
    a->data = grown;
    memcpy(a->data + a->len, ptr, n);
    a->len += n;
    a->data[a->len] = '\0';
    return n;
}

/* One request; the parsed JSON answer (or NULL) and the status. -1 on transport failure
 * (printed). */
static long http_call(const char *method, const char *url, const char *body, json_t **out)
{
    *out = NULL;
    CURL *curl = curl_easy_init();
    if (!curl) {
        fprintf(stderr, "atrium: register-user: libcurl failed to start\n");
        return -1;
    }
    answer a = {0};
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, (long)CLI_HTTP_TIMEOUT_S);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &a);
    if (body) {
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    }
    CURLcode rc = curl_easy_perform(curl);
    long status = -1;
    if (rc == CURLE_OK) {
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
        *out = a.data ? json_loads(a.data, 0, NULL) : NULL;
    } else {
        fprintf(stderr, "atrium: register-user: %s %s failed: %s%s\n", method, url,
                curl_easy_strerror(rc), a.too_large ? " (answer too large)" : "");
    }
    free(a.data);
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    return status;
}

static void print_refusal(const char *what, long status, json_t *j)
{
    const char *code = json_string_value(json_object_get(j, "errcode"));
    const char *msg = json_string_value(json_object_get(j, "error"));
    fprintf(stderr, "atrium: register-user: %s refused: HTTP %ld %s: %s\n", what, status,
            code ? code : "(no errcode)", msg ? msg : "(no message)");
}

/* The listener URL from the config: http://host:port, loopback for wildcard binds. */
static void default_url(const struct core_config *cfg, char *out, size_t len)
{
    const char *host = cfg->http.bind_address;
    if (strcmp(host, "0.0.0.0") == 0) host = "127.0.0.1";
    if (strcmp(host, "::") == 0) host = "::1";
    bool v6 = strchr(host, ':') != NULL;
    snprintf(out, len, "http://%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", cfg->http.port);
}

static bool read_password(char *buf, size_t len)
{
    if (!fgets(buf, (int)len, stdin)) return false;
    buf[strcspn(buf, "\r\n")] = '\0';
    return buf[0] != '\0';
}

static int usage(void)
{
    fprintf(stderr, "usage: atrium register-user --config FILE --user NAME [--password PW] "
                    "[--admin] [--url http://127.0.0.1:8008]\n"
                    "       (without --password, the password is read from standard input)\n");
    return 2;
}

/* The exchange itself: nonce, MAC, POST. 0 or 1. */
static int exchange(const char *base, const char *secret, const char *user,
                    const char *password, bool admin)
{
    char url[CLI_URL_BYTES];
    size_t base_len = strlen(base);
    while (base_len && base[base_len - 1] == '/') base_len--;
    snprintf(url, sizeof(url), "%.*s/_synapse/admin/v1/register", (int)base_len, base);
    json_t *j;
    long status = http_call("GET", url, NULL, &j);
    if (status < 0) return 1;
    const char *nonce = json_string_value(json_object_get(j, "nonce"));
    if (status != 200 || !nonce) {
        print_refusal("asking for a nonce", status, j);
        json_decref(j);
        return 1;
    }
    char mac[ADMIN_MAC_HEX_CHARS + 1];
    admin_register_mac(secret, nonce, user, password, admin, mac);
    json_t *req = json_pack("{s:s, s:s, s:s, s:b, s:s}", "nonce", nonce, "username", user,
                            "password", password, "admin", admin, "mac", mac);
    json_decref(j);
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!body) {
        fprintf(stderr, "atrium: register-user: out of memory\n");
        return 1;
    }
    status = http_call("POST", url, body, &j);
    free(body);
    if (status < 0) return 1;
    const char *user_id = json_string_value(json_object_get(j, "user_id"));
    int rc = 0;
    if (status != 200 || !user_id) {
        print_refusal("registration", status, j);
        rc = 1;
    } else {
        printf("%s\n", user_id);
    }
    json_decref(j);
    return rc;
}

int cli_register_user(int argc, char **argv)
{
    const char *config = NULL, *user = NULL, *password = NULL, *url = NULL;
    bool admin = false;
    for (int i = 0; i < argc; i++) {
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--admin") == 0) admin = true;
        else if (strcmp(argv[i], "--config") == 0 && next) config = argv[++i];
        else if (strcmp(argv[i], "--user") == 0 && next) user = argv[++i];
        else if (strcmp(argv[i], "--password") == 0 && next) password = argv[++i];
        else if (strcmp(argv[i], "--url") == 0 && next) url = argv[++i];
        else {
            fprintf(stderr, "atrium: register-user: unknown or incomplete argument \"%s\"\n",
                    argv[i]);
            return usage();
        }
    }
    if (!config || !user) return usage();

    char err[CLI_ERR_BYTES];
    cfg_node *root = cfg_load_file(config, err, sizeof(err));
    struct core_config cfg;
    if (!root || cfg_apply_env(root, environ, err, sizeof(err)) < 0 ||
        core_config_load(root, &cfg, err, sizeof(err)) < 0) {
        fprintf(stderr, "atrium: register-user: %s\n", err);
        cfg_free(root);
        return 1;
    }
    int rc = 1;
    char typed[CLI_PASSWORD_MAX_BYTES], base[CLI_URL_BYTES];
    if (!cfg.registration.shared_secret[0]) {
        fprintf(stderr, "atrium: register-user: %s sets no registration.shared_secret; set one "
                        "(and restart the server) to register users this way\n", config);
    } else if (!password && !read_password(typed, sizeof(typed))) {
        fprintf(stderr, "atrium: register-user: no password given (--password, or one line "
                        "on standard input)\n");
    } else {
        if (!url) default_url(&cfg, base, sizeof(base));
        curl_global_init(CURL_GLOBAL_DEFAULT);
        rc = exchange(url ? url : base, cfg.registration.shared_secret, user,
                      password ? password : typed, admin);
        curl_global_cleanup();
    }
    core_config_release(&cfg);
    cfg_free(root);
    return rc;
}
