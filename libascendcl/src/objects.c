/*
 * objects.c: what the host-side objects (objects.h) share: allocation with a magic number, the
 * check of a handle before use, and release.
 */
#include "client.h"
#include "objects.h"

#include <stdlib.h>

void *object_new(size_t size, uint32_t magic, const char *what)
{
    uint32_t *obj = calloc(1, size);
    if (!obj) {
        flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
        return NULL;
    }
    *obj = magic;
    return obj;
}

int object_check(const void *obj, uint32_t magic, const char *what, const char *param, const char *type)
{
    if (!obj)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s is NULL", what, param);
    if (*(const uint32_t *)obj != magic)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: %s %p is not a live %s", what, param, obj, type);
    return 0;
}

void object_free(void *obj)
{
    if (obj)
        *(uint32_t *)obj = 0;
    free(obj);
}
