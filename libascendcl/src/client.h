/*
 * client.h: internals shared by the translation units of libascendcl.so (error recording).
 */
#ifndef FLEXNPU_CLIENT_H_
#define FLEXNPU_CLIENT_H_

#include "acl/acl_base.h"

/* Record a failure message for aclGetRecentErrMsg (this thread) and return code. */
int flexnpu_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* FLEXNPU_CLIENT_H_ */
