/*
 * conf.h: client.conf (docs/client-conf.md, version 1) as the C client reads it. The same
 * validation as client/flexnpu_wire/clientconf.py; every error names the file and the field.
 */
#ifndef FLEXNPU_CONF_H_
#define FLEXNPU_CONF_H_

#include <stddef.h>

#define FLEXNPU_DEFAULT_CONF "/etc/flexnpu/client.conf"
#define FLEXNPU_CONF_MAX_BYTES (1 << 20)

struct client_conf {
    char claim_uid[128];
    char token[612]; /* the aclserver accepts a HELLO frame of at most 640 bytes before authentication */
    char unix_path[108]; /* "" when absent */
    char tcp_host[64];   /* "" when absent */
    int tcp_port;
    char shm_dir[512];
    char soc_name[64]; /* optional "soc_name"; "" when absent */
    int share_count;
};

/* Load and validate path, in bounded time (a FIFO, device, socket or directory is refused, a
 * symlink is not followed, at most FLEXNPU_CONF_MAX_BYTES are read). Returns 0 (ACL_SUCCESS) or an
 * ACL error code with err filled: ACL_ERROR_INVALID_FILE (missing, unreadable, not a regular
 * file), ACL_ERROR_INVALID_FILE_SIZE (larger than the cap), ACL_ERROR_PARSE_FILE (not JSON),
 * ACL_ERROR_FILE_MISSING_ATTR (a required field is absent), ACL_ERROR_FILE_ATTR_INVALID. */
int conf_load(const char *path, struct client_conf *out, char *err, size_t err_len);

/* Parse text already read from source (same codes as conf_load). */
int conf_parse(const char *text, size_t len, const char *source, struct client_conf *out, char *err,
               size_t err_len);

#endif /* FLEXNPU_CONF_H_ */
