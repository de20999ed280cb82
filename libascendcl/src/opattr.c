/*
 * opattr.c: aclopAttr, host-side: named operator attributes of every kind CANN declares (bool,
 * int, float, string, data type, and lists of each, and lists of int lists). Each setter copies
 * its values, so the caller may free them at once; setting a name again replaces its value.
 * Single operators themselves are stubs on a share (api/acl_api.json), so nothing reads them yet.
 */
#include "client.h"
#include "objects.h"

#include <stdlib.h>
#include <string.h>

enum attr_kind { A_BOOL, A_INT, A_FLOAT, A_STRING, A_DTYPE, A_LIST_DTYPE, A_LIST_BOOL, A_LIST_INT, A_LIST_FLOAT,
                 A_LIST_STRING, A_LIST_LIST_INT };

struct attr {
    char *name;
    enum attr_kind kind;
    size_t count;    /* values (lists: elements; list of lists: lists) */
    void *values;    /* the copied values; strings: an array of count copies */
    size_t *lengths; /* list of lists: each list's length (values holds them one after the other) */
};

struct aclopAttr {
    uint32_t magic;
    struct attr *items;
    size_t n, cap;
};

static void attr_free(struct attr *a)
{
    if (a->kind == A_STRING || a->kind == A_LIST_STRING)
        for (size_t i = 0; i < a->count; i++)
            free(((char **)a->values)[i]);
    free(a->values);
    free(a->lengths);
    free(a->name);
}

API aclopAttr *aclopCreateAttr(void)
{
    return object_new(sizeof(aclopAttr), OP_ATTR_MAGIC, "aclopCreateAttr");
}

API void aclopDestroyAttr(const aclopAttr *attr)
{
    if (object_check(attr, OP_ATTR_MAGIC, "aclopDestroyAttr", "attr", "aclopAttr"))
        return;
    aclopAttr *a = (aclopAttr *)attr;
    for (size_t i = 0; i < a->n; i++)
        attr_free(&a->items[i]);
    free(a->items);
    object_free(a);
}

/* Store value (already copied into a) under name, replacing an earlier one; frees a on failure. */
static int put(aclopAttr *attr, const char *name, struct attr *a, const char *what)
{
    a->name = strdup(name);
    if (a->name && attr->n == attr->cap) {
        size_t cap = attr->cap ? 2 * attr->cap : 8;
        struct attr *ni = realloc(attr->items, cap * sizeof *ni);
        if (ni) {
            attr->items = ni;
            attr->cap = cap;
        }
    }
    if (!a->name || attr->n == attr->cap) {
        attr_free(a);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    }
    for (size_t i = 0; i < attr->n; i++)
        if (strcmp(attr->items[i].name, name) == 0) {
            attr_free(&attr->items[i]);
            attr->items[i] = *a;
            return ACL_SUCCESS;
        }
    attr->items[attr->n++] = *a;
    return ACL_SUCCESS;
}

static int check(const aclopAttr *attr, const char *name, int count, const void *values, const char *what)
{
    int rc = object_check(attr, OP_ATTR_MAGIC, what, "attr", "aclopAttr");
    if (rc)
        return rc;
    if (!name)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: attrName is NULL", what);
    if (count < 0)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: attribute %s: numValues %d is negative", what, name, count);
    if (count > 0 && !values)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: attribute %s: values are NULL while numValues is %d", what,
                            name, count);
    return 0;
}

/* A scalar or a list of fixed-size values. */
static int set_values(aclopAttr *attr, const char *name, enum attr_kind kind, const void *values, int count,
                      size_t size, const char *what)
{
    int rc = check(attr, name, count, values, what);
    if (rc)
        return rc;
    struct attr a = {.kind = kind, .count = (size_t)count};
    if (count && !(a.values = malloc((size_t)count * size)))
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    if (count)
        memcpy(a.values, values, (size_t)count * size);
    return put(attr, name, &a, what);
}

static int set_strings(aclopAttr *attr, const char *name, enum attr_kind kind, const char *const *values, int count,
                       const char *what)
{
    int rc = check(attr, name, count, values, what);
    if (rc)
        return rc;
    for (int i = 0; i < count; i++)
        if (!values[i])
            return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: attribute %s: value %d is NULL", what, name, i);
    struct attr a = {.kind = kind};
    char **copies = calloc((size_t)count + 1, sizeof *copies);
    a.values = copies;
    for (int i = 0; copies && i < count; i++, a.count++)
        if (!(copies[i] = strdup(values[i])))
            break;
    if (!copies || a.count < (size_t)count) {
        attr_free(&a);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    }
    return put(attr, name, &a, what);
}

API aclError aclopSetAttrBool(aclopAttr *attr, const char *attrName, uint8_t attrValue)
{
    return set_values(attr, attrName, A_BOOL, &attrValue, 1, sizeof attrValue, "aclopSetAttrBool");
}

API aclError aclopSetAttrInt(aclopAttr *attr, const char *attrName, int64_t attrValue)
{
    return set_values(attr, attrName, A_INT, &attrValue, 1, sizeof attrValue, "aclopSetAttrInt");
}

API aclError aclopSetAttrFloat(aclopAttr *attr, const char *attrName, float attrValue)
{
    return set_values(attr, attrName, A_FLOAT, &attrValue, 1, sizeof attrValue, "aclopSetAttrFloat");
}

API aclError aclopSetAttrString(aclopAttr *attr, const char *attrName, const char *attrValue)
{
    if (!attrValue)
        return flexnpu_fail(ACL_ERROR_INVALID_PARAM, "aclopSetAttrString: attrValue is NULL");
    return set_strings(attr, attrName, A_STRING, &attrValue, 1, "aclopSetAttrString");
}

API aclError aclopSetAttrDataType(aclopAttr *attr, const char *attrName, aclDataType attrValue)
{
    return set_values(attr, attrName, A_DTYPE, &attrValue, 1, sizeof attrValue, "aclopSetAttrDataType");
}

API aclError aclopSetAttrListDataType(aclopAttr *attr, const char *attrName, int numValues, const aclDataType values[])
{
    return set_values(attr, attrName, A_LIST_DTYPE, values, numValues, sizeof *values, "aclopSetAttrListDataType");
}

API aclError aclopSetAttrListBool(aclopAttr *attr, const char *attrName, int numValues, const uint8_t *values)
{
    return set_values(attr, attrName, A_LIST_BOOL, values, numValues, sizeof *values, "aclopSetAttrListBool");
}

API aclError aclopSetAttrListInt(aclopAttr *attr, const char *attrName, int numValues, const int64_t *values)
{
    return set_values(attr, attrName, A_LIST_INT, values, numValues, sizeof *values, "aclopSetAttrListInt");
}

API aclError aclopSetAttrListFloat(aclopAttr *attr, const char *attrName, int numValues, const float *values)
{
    return set_values(attr, attrName, A_LIST_FLOAT, values, numValues, sizeof *values, "aclopSetAttrListFloat");
}

API aclError aclopSetAttrListString(aclopAttr *attr, const char *attrName, int numValues, const char **values)
{
    return set_strings(attr, attrName, A_LIST_STRING, values, numValues, "aclopSetAttrListString");
}

API aclError aclopSetAttrListListInt(aclopAttr *attr, const char *attrName, int numLists, const int *numValues,
                                     const int64_t *const values[])
{
    const char *what = "aclopSetAttrListListInt";
    int rc = check(attr, attrName, numLists, numValues, what);
    if (!rc && numLists > 0 && !values)
        rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: attribute %s: values are NULL", what, attrName);
    size_t total = 0;
    for (int i = 0; !rc && i < numLists; i++) {
        if (numValues[i] < 0 || (numValues[i] > 0 && !values[i]))
            rc = flexnpu_fail(ACL_ERROR_INVALID_PARAM, "%s: attribute %s: list %d has %d values at %p", what,
                              attrName, i, numValues[i], (const void *)values[i]);
        else
            total += (size_t)numValues[i];
    }
    if (rc)
        return rc;
    struct attr a = {.kind = A_LIST_LIST_INT, .count = (size_t)numLists};
    a.lengths = malloc(((size_t)numLists + 1) * sizeof *a.lengths);
    a.values = malloc((total + 1) * sizeof(int64_t));
    if (!a.lengths || !a.values) {
        attr_free(&a);
        return flexnpu_fail(ACL_ERROR_BAD_ALLOC, "%s: out of host memory", what);
    }
    int64_t *out = a.values;
    for (int i = 0; i < numLists; i++) {
        a.lengths[i] = (size_t)numValues[i];
        if (numValues[i])
            memcpy(out, values[i], (size_t)numValues[i] * sizeof *out);
        out += numValues[i];
    }
    return put(attr, attrName, &a, what);
}

/* -- the wire form (flexnpu_wire/opcall.py: the kinds are numbered as enum attr_kind) ------------- */

size_t opattr_count(const aclopAttr *attr)
{
    return attr ? attr->n : 0;
}

void opattr_encode(const aclopAttr *attr, struct wbuf *b)
{
    for (size_t i = 0; attr && i < attr->n; i++) {
        const struct attr *a = &attr->items[i];
        wbuf_blob(b, a->name, strlen(a->name));
        wbuf_word(b, (int64_t)a->kind);
        int list = a->kind >= A_LIST_DTYPE;
        if (list)
            wbuf_word(b, (int64_t)a->count);
        const int64_t *cursor = a->values;
        for (size_t k = 0; k < a->count; k++) {
            switch (a->kind) {
            case A_BOOL:
            case A_LIST_BOOL:
                wbuf_word(b, ((const uint8_t *)a->values)[k]);
                break;
            case A_INT:
            case A_LIST_INT:
                wbuf_word(b, ((const int64_t *)a->values)[k]);
                break;
            case A_DTYPE:
            case A_LIST_DTYPE:
                wbuf_word(b, (int64_t)((const aclDataType *)a->values)[k]);
                break;
            case A_FLOAT:
            case A_LIST_FLOAT:
                wbuf_double(b, (double)((const float *)a->values)[k]);
                break;
            case A_STRING:
            case A_LIST_STRING: {
                const char *s = ((char *const *)a->values)[k];
                wbuf_blob(b, s, strlen(s));
                break;
            }
            case A_LIST_LIST_INT:
                wbuf_word(b, (int64_t)a->lengths[k]);
                for (size_t j = 0; j < a->lengths[k]; j++)
                    wbuf_word(b, *cursor++);
                break;
            }
        }
    }
}
