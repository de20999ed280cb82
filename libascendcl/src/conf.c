/*
 * conf.c: a small strict JSON reader (standard JSON values, depth and size bounded) and the
 * client.conf rules of docs/client-conf.md. The file is opened in bounded time: without following
 * a symlink in its last component, without blocking (a FIFO or a device is refused after fstat, not
 * waited on), and at most FLEXNPU_CONF_MAX_BYTES are read.
 */
#include "conf.h"

#include "acl/acl_base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 32

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jval {
    enum jtype type;
    int boolean;
    int is_int;     /* J_NUM: an integer that fits int64 */
    int64_t integer;
    char *str;      /* J_STR: NUL-terminated UTF-8 (no embedded NUL allowed) */
    size_t n;       /* J_ARR/J_OBJ: number of items */
    struct jval *items;
    char **keys;    /* J_OBJ */
};

struct parser {
    const char *p, *end;
    const char *error;
};

static void jfree(struct jval *v)
{
    if (!v)
        return;
    free(v->str);
    for (size_t i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

static void skip_ws(struct parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int put_utf8(char *out, size_t *len, uint32_t cp)
{
    if (cp < 0x80) {
        out[(*len)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*len)++] = (char)(0xC0 | cp >> 6);
        out[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*len)++] = (char)(0xE0 | cp >> 12);
        out[(*len)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x110000) {
        out[(*len)++] = (char)(0xF0 | cp >> 18);
        out[(*len)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*len)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*len)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        return -1;
    }
    return 0;
}

static int hex4(struct parser *ps, uint32_t *out)
{
    if (ps->end - ps->p < 4)
        return -1;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *ps->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static char *parse_string(struct parser *ps)
{
    /* at the opening quote */
    ps->p++;
    size_t cap = 16, len = 0;
    char *out = malloc(cap);
    if (!out) {
        ps->error = "out of memory";
        return NULL;
    }
    for (;;) {
        if (ps->p >= ps->end) {
            ps->error = "unterminated string";
            break;
        }
        if (cap - len < 8) {
            cap *= 2;
            char *nb = realloc(out, cap);
            if (!nb) {
                ps->error = "out of memory";
                break;
            }
            out = nb;
        }
        unsigned char c = (unsigned char)*ps->p++;
        if (c == '"') {
            out[len] = '\0';
            return out;
        }
        if (c < 0x20) {
            ps->error = "control character in a string";
            break;
        }
        if (c != '\\') {
            out[len++] = (char)c;
            continue;
        }
        if (ps->p >= ps->end) {
            ps->error = "unterminated escape";
            break;
        }
        char e = *ps->p++;
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            out[len++] = map[simple - "\"\\/bfnrt"];
            continue;
        }
        if (e != 'u') {
            ps->error = "invalid escape in a string";
            break;
        }
        uint32_t cp;
        if (hex4(ps, &cp)) {
            ps->error = "invalid \\u escape";
            break;
        }
        if (cp >= 0xD800 && cp < 0xDC00) {
            uint32_t lo;
            if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                ps->error = "unpaired surrogate";
                break;
            }
            ps->p += 2;
            if (hex4(ps, &lo) || lo < 0xDC00 || lo >= 0xE000) {
                ps->error = "unpaired surrogate";
                break;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp < 0xE000) {
            ps->error = "unpaired surrogate";
            break;
        }
        if (cp == 0) {
            ps->error = "NUL character in a string";
            break;
        }
        put_utf8(out, &len, cp);
    }
    free(out);
    return NULL;
}

static int parse_value(struct parser *ps, struct jval *v, int depth);

static int parse_number(struct parser *ps, struct jval *v)
{
    const char *s = ps->p;
    const char *q = s;
    if (q < ps->end && *q == '-')
        q++;
    if (q >= ps->end || *q < '0' || *q > '9') {
        ps->error = "invalid number";
        return -1;
    }
    if (*q == '0' && q + 1 < ps->end && q[1] >= '0' && q[1] <= '9') {
        ps->error = "leading zero in a number";
        return -1;
    }
    while (q < ps->end && *q >= '0' && *q <= '9')
        q++;
    int is_int = 1;
    if (q < ps->end && *q == '.') {
        is_int = 0;
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            ps->error = "invalid number";
            return -1;
        }
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        is_int = 0;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-'))
            q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            ps->error = "invalid number";
            return -1;
        }
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    }
    v->type = J_NUM;
    v->is_int = 0;
    if (is_int && q - s < 32) {
        char buf[32];
        memcpy(buf, s, (size_t)(q - s));
        buf[q - s] = '\0';
        errno = 0;
        char *endp;
        long long n = strtoll(buf, &endp, 10);
        if (errno == 0 && *endp == '\0') {
            v->is_int = 1;
            v->integer = n;
        }
    }
    ps->p = q;
    return 0;
}

static int parse_container(struct parser *ps, struct jval *v, int depth, int object)
{
    char close = object ? '}' : ']';
    ps->p++;
    v->type = object ? J_OBJ : J_ARR;
    size_t cap = 0;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        if (v->n == cap) {
            cap = cap ? 2 * cap : 4;
            struct jval *ni = realloc(v->items, cap * sizeof *ni);
            if (!ni) {
                ps->error = "out of memory";
                return -1;
            }
            v->items = ni;
            if (object) {
                char **nk = realloc(v->keys, cap * sizeof *nk);
                if (!nk) {
                    ps->error = "out of memory";
                    return -1;
                }
                v->keys = nk;
            }
        }
        struct jval *item = &v->items[v->n];
        memset(item, 0, sizeof *item);
        if (object) {
            v->keys[v->n] = NULL;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != '"') {
                ps->error = "expected a string key";
                return -1;
            }
            char *key = parse_string(ps);
            if (!key)
                return -1;
            v->keys[v->n] = key;
            v->n++; /* owned from here, freed by jfree */
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                ps->error = "expected ':' after a key";
                return -1;
            }
            ps->p++;
        } else {
            v->n++;
        }
        if (parse_value(ps, item, depth + 1))
            return -1;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return 0;
        }
        ps->error = object ? "expected ',' or '}'" : "expected ',' or ']'";
        return -1;
    }
}

static int literal(struct parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, word, n) == 0) {
        ps->p += n;
        return 0;
    }
    ps->error = "invalid literal";
    return -1;
}

static int parse_value(struct parser *ps, struct jval *v, int depth)
{
    if (depth > MAX_DEPTH) {
        ps->error = "nested too deeply";
        return -1;
    }
    skip_ws(ps);
    if (ps->p >= ps->end) {
        ps->error = "unexpected end of input";
        return -1;
    }
    switch (*ps->p) {
    case '{':
        return parse_container(ps, v, depth, 1);
    case '[':
        return parse_container(ps, v, depth, 0);
    case '"':
        v->type = J_STR;
        v->str = parse_string(ps);
        return v->str ? 0 : -1;
    case 't':
        v->type = J_BOOL;
        v->boolean = 1;
        return literal(ps, "true");
    case 'f':
        v->type = J_BOOL;
        return literal(ps, "false");
    case 'n':
        v->type = J_NULL;
        return literal(ps, "null");
    default:
        return parse_number(ps, v);
    }
}

static const struct jval *jget(const struct jval *obj, const char *key)
{
    if (!obj || obj->type != J_OBJ)
        return NULL;
    const struct jval *found = NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (obj->keys[i] && strcmp(obj->keys[i], key) == 0)
            found = &obj->items[i]; /* the last duplicate wins, as in Python's json */
    return found;
}

struct ctx {
    const char *source;
    char *err;
    size_t err_len;
};

static int bad(struct ctx *c, int code, const char *field, const char *fmt, ...)
{
    char what[384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (field)
        snprintf(c->err, c->err_len, "client.conf %s: field %s %s", c->source, field, what);
    else
        snprintf(c->err, c->err_len, "client.conf %s: %s", c->source, what);
    return code;
}

static int get_string(struct ctx *c, const struct jval *obj, const char *key, const char *field, char *out,
                      size_t cap, int required)
{
    const struct jval *v = jget(obj, key);
    if (!v) {
        if (!required) {
            out[0] = '\0';
            return 0;
        }
        return bad(c, ACL_ERROR_FILE_MISSING_ATTR, field, "is missing (a non-empty string is required)");
    }
    if (v->type != J_STR || v->str[0] == '\0')
        return bad(c, ACL_ERROR_FILE_ATTR_INVALID, field, "must be a non-empty string");
    if (strlen(v->str) >= cap)
        return bad(c, ACL_ERROR_FILE_ATTR_INVALID, field, "is longer than %zu bytes", cap - 1);
    strcpy(out, v->str);
    return 0;
}

static int get_int(struct ctx *c, const struct jval *obj, const char *key, const char *field, int64_t lo,
                   int64_t hi, int64_t *out)
{
    const struct jval *v = jget(obj, key);
    if (!v)
        return bad(c, ACL_ERROR_FILE_MISSING_ATTR, field, "is missing (an integer is required)");
    if (v->type != J_NUM || !v->is_int || v->integer < lo || v->integer > hi)
        return bad(c, ACL_ERROR_FILE_ATTR_INVALID, field, "must be an integer in %lld..%lld", (long long)lo,
                   (long long)hi);
    *out = v->integer;
    return 0;
}

static int parse_tcp(struct ctx *c, const char *tcp, struct client_conf *out)
{
    const char *colon = strrchr(tcp, ':');
    if (!colon || colon == tcp || colon[1] == '\0')
        return bad(c, ACL_ERROR_FILE_ATTR_INVALID, "endpoints.tcp", "must be host:port, got '%s'", tcp);
    char *endp;
    errno = 0;
    long port = strtol(colon + 1, &endp, 10);
    if (errno || *endp || port <= 0 || port >= 65536 || colon[1] < '0' || colon[1] > '9')
        return bad(c, ACL_ERROR_FILE_ATTR_INVALID, "endpoints.tcp", "must be host:port, got '%s'", tcp);
    const char *h = tcp;
    size_t hl = (size_t)(colon - tcp);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl == 0 || hl >= sizeof out->tcp_host)
        return bad(c, ACL_ERROR_FILE_ATTR_INVALID, "endpoints.tcp", "has an invalid host in '%s'", tcp);
    memcpy(out->tcp_host, h, hl);
    out->tcp_host[hl] = '\0';
    out->tcp_port = (int)port;
    return 0;
}

static int check_conf(struct ctx *c, const struct jval *doc, struct client_conf *out)
{
    int rc;
    if (doc->type != J_OBJ)
        return bad(c, ACL_ERROR_PARSE_FILE, NULL, "must hold a JSON object");
    int64_t version;
    const struct jval *vv = jget(doc, "version");
    if (!vv)
        return bad(c, ACL_ERROR_FILE_MISSING_ATTR, "version", "is missing (must be 1)");
    if ((rc = get_int(c, doc, "version", "version", 1, 1, &version)))
        return rc;
    if ((rc = get_string(c, doc, "claim_uid", "claim_uid", out->claim_uid, sizeof out->claim_uid, 1)))
        return rc;
    if ((rc = get_string(c, doc, "token", "token", out->token, sizeof out->token, 1)))
        return rc;
    if ((rc = get_string(c, doc, "shm_dir", "shm_dir", out->shm_dir, sizeof out->shm_dir, 1)))
        return rc;
    if (out->shm_dir[0] != '/')
        return bad(c, ACL_ERROR_FILE_ATTR_INVALID, "shm_dir", "must be an absolute path, got '%s'", out->shm_dir);
    if ((rc = get_string(c, doc, "soc_name", "soc_name", out->soc_name, sizeof out->soc_name, 0)))
        return rc;
    const struct jval *ep = jget(doc, "endpoints");
    if (!ep)
        return bad(c, ACL_ERROR_FILE_MISSING_ATTR, "endpoints", "is missing (an object with 'unix' and/or 'tcp')");
    if (ep->type != J_OBJ)
        return bad(c, ACL_ERROR_FILE_ATTR_INVALID, "endpoints", "must be an object with 'unix' and/or 'tcp'");
    for (size_t i = 0; i < ep->n; i++)
        if (strcmp(ep->keys[i], "unix") != 0 && strcmp(ep->keys[i], "tcp") != 0) {
            char field[96];
            snprintf(field, sizeof field, "endpoints.%.60s", ep->keys[i]);
            return bad(c, ACL_ERROR_FILE_ATTR_INVALID, field, "is not a known endpoint (unix, tcp)");
        }
    if ((rc = get_string(c, ep, "unix", "endpoints.unix", out->unix_path, sizeof out->unix_path, 0)))
        return rc;
    if (out->unix_path[0] && out->unix_path[0] != '/')
        return bad(c, ACL_ERROR_FILE_ATTR_INVALID, "endpoints.unix", "must be an absolute path, got '%s'",
                   out->unix_path);
    char tcp[128];
    if ((rc = get_string(c, ep, "tcp", "endpoints.tcp", tcp, sizeof tcp, 0)))
        return rc;
    if (tcp[0] && (rc = parse_tcp(c, tcp, out)))
        return rc;
    if (!out->unix_path[0] && !tcp[0])
        return bad(c, ACL_ERROR_FILE_MISSING_ATTR, "endpoints", "needs at least one of 'unix' and 'tcp'");
    const struct jval *shares = jget(doc, "shares");
    if (!shares)
        return bad(c, ACL_ERROR_FILE_MISSING_ATTR, "shares", "is missing (a non-empty list)");
    if (shares->type != J_ARR || shares->n == 0 || shares->n > 1024)
        return bad(c, ACL_ERROR_FILE_ATTR_INVALID, "shares", "must be a non-empty list (at most 1024 entries)");
    unsigned char seen[1024] = {0};
    for (size_t i = 0; i < shares->n; i++) {
        char field[64];
        snprintf(field, sizeof field, "shares[%zu]", i);
        if (shares->items[i].type != J_OBJ)
            return bad(c, ACL_ERROR_FILE_ATTR_INVALID, field, "must be an object");
        int64_t vid;
        snprintf(field, sizeof field, "shares[%zu].virtual_id", i);
        if ((rc = get_int(c, &shares->items[i], "virtual_id", field, 0, (int64_t)shares->n - 1, &vid)))
            return rc;
        if (seen[vid])
            return bad(c, ACL_ERROR_FILE_ATTR_INVALID, "shares", "virtual_id values must be 0..%zu once each",
                       shares->n - 1);
        seen[vid] = 1;
    }
    out->share_count = (int)shares->n;
    return 0;
}

int conf_parse(const char *text, size_t len, const char *source, struct client_conf *out, char *err,
               size_t err_len)
{
    struct ctx c = {.source = source, .err = err, .err_len = err_len};
    memset(out, 0, sizeof *out);
    struct parser ps = {.p = text, .end = text + len};
    struct jval doc;
    memset(&doc, 0, sizeof doc);
    int rc;
    if (parse_value(&ps, &doc, 0)) {
        rc = bad(&c, ACL_ERROR_PARSE_FILE, NULL, "is not valid JSON: %s at byte %td", ps.error, ps.p - text);
    } else {
        skip_ws(&ps);
        if (ps.p != ps.end)
            rc = bad(&c, ACL_ERROR_PARSE_FILE, NULL, "is not valid JSON: extra data at byte %td", ps.p - text);
        else
            rc = check_conf(&c, &doc, out);
    }
    jfree(&doc);
    return rc;
}

static const char *file_kind(mode_t mode)
{
    return S_ISDIR(mode)    ? "a directory"
           : S_ISFIFO(mode) ? "a FIFO"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISLNK(mode)  ? "a symbolic link"
                            : "not a regular file";
}

/* Open path for reading in bounded time: O_NONBLOCK so that a FIFO or a device cannot hold the
 * open, O_NOFOLLOW so that a symlink in the last component is refused, not followed. */
static int open_conf(const char *path, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK);
    if (fd >= 0)
        return fd;
    int e = errno;
    struct stat st;
    if (e == ELOOP && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
        snprintf(err, err_len, "cannot read client.conf %s: it is a symbolic link (symbolic links are not followed)",
                 path);
    else if (e == ENXIO && lstat(path, &st) == 0)
        snprintf(err, err_len, "cannot read client.conf %s: it is %s, not a regular file", path, file_kind(st.st_mode));
    else if (e == EACCES)
        snprintf(err, err_len, "cannot read client.conf %s: not readable by uid %d: %s", path, (int)geteuid(),
                 strerror(e));
    else
        snprintf(err, err_len, "cannot read client.conf %s: %s", path, strerror(e));
    return -1;
}

int conf_load(const char *path, struct client_conf *out, char *err, size_t err_len)
{
    int fd = open_conf(path, err, err_len);
    if (fd < 0)
        return ACL_ERROR_INVALID_FILE;
    struct stat st;
    if (fstat(fd, &st)) {
        snprintf(err, err_len, "cannot read client.conf %s: %s", path, strerror(errno));
        close(fd);
        return ACL_ERROR_INVALID_FILE;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "cannot read client.conf %s: it is %s, not a regular file", path,
                 file_kind(st.st_mode));
        close(fd);
        return ACL_ERROR_INVALID_FILE;
    }
    if (st.st_size > FLEXNPU_CONF_MAX_BYTES) {
        snprintf(err, err_len, "cannot read client.conf %s: %lld bytes, more than the %d a client.conf may have",
                 path, (long long)st.st_size, FLEXNPU_CONF_MAX_BYTES);
        close(fd);
        return ACL_ERROR_INVALID_FILE_SIZE;
    }
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *text = malloc(cap);
    if (!text) {
        close(fd);
        snprintf(err, err_len, "cannot read client.conf %s: out of memory", path);
        return ACL_ERROR_INVALID_FILE;
    }
    for (;;) {
        ssize_t n = read(fd, text + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(err, err_len, "cannot read client.conf %s: %s", path, strerror(errno));
            free(text);
            close(fd);
            return ACL_ERROR_INVALID_FILE;
        }
        if (n == 0 || (len += (size_t)n) == cap)
            break;
    }
    close(fd);
    if (len == cap) {
        snprintf(err, err_len, "cannot read client.conf %s: it changed size while being read", path);
        free(text);
        return ACL_ERROR_INVALID_FILE;
    }
    int rc = conf_parse(text, len, path, out, err, err_len);
    free(text);
    return rc;
}
