/*
 * objects.h: the host-side objects of libascendcl.so (data buffers, tensor descriptors, model
 * datasets, operator attributes): their layouts and the helpers the files that serve them share.
 *
 * They live only in the client: no server round trip, no quota, no session needed (they work
 * before aclInit, as CANN's do). Each carries a magic number that is checked before use and
 * cleared when it is destroyed, so a NULL, foreign or destroyed handle gets
 * ACL_ERROR_INVALID_PARAM with a message instead of undefined behaviour where it can be told.
 */
#ifndef FLEXNPU_OBJECTS_H_
#define FLEXNPU_OBJECTS_H_

#include "acl/acl.h"

#include <stddef.h>
#include <stdint.h>

#define DATA_BUFFER_MAGIC 0x464E4442u /* "FNDB" */
#define TENSOR_DESC_MAGIC 0x464E5444u /* "FNTD" */
#define DATASET_MAGIC 0x464E4453u     /* "FNDS" */
#define OP_ATTR_MAGIC 0x464E4f41u     /* "FNOA" */

struct aclDataBuffer {
    uint32_t magic;
    void *data;
    size_t size;
};

/* A list of int64: dims, or [min, max] pairs one after the other (ranges). */
struct int64_list {
    int64_t *v;
    size_t n; /* values (a range list: twice its ranges) */
};

struct aclTensorDesc {
    uint32_t magic;
    aclDataType data_type;
    aclFormat format;         /* the origin format (aclSetTensorOriginFormat, aclGetTensorDescFormat) */
    aclFormat storage_format; /* aclSetTensorFormat / aclSetTensorStorageFormat */
    struct int64_list dims;   /* the origin shape (aclCreateTensorDesc, aclSetTensorOriginShape) */
    struct int64_list storage_dims; /* aclSetTensorShape / aclSetTensorStorageShape */
    struct int64_list shape_range;  /* pairs */
    struct int64_list value_range;  /* pairs */
    char *name;                     /* never NULL once created */
    char *dynamic_input;
    void *const_data; /* a copy of aclSetTensorConst's bytes */
    size_t const_len;
    aclMemType placement;
    void *address;
};

struct dataset_blob {
    aclDataBuffer *buffer;   /* the caller's */
    aclTensorDesc *desc;     /* the dataset's own copy, or NULL */
};

struct aclmdlDataset {
    uint32_t magic;
    struct dataset_blob *blobs;
    size_t n, cap;
};

/* A zeroed object of size bytes whose first field (a uint32_t) is magic; NULL with the message
 * "<what>: out of host memory" (ACL_ERROR_BAD_ALLOC) when there is no memory. */
void *object_new(size_t size, uint32_t magic, const char *what);
/* 0 when obj is live (its magic), else ACL_ERROR_INVALID_PARAM naming what, the parameter and the type. */
int object_check(const void *obj, uint32_t magic, const char *what, const char *param, const char *type);
/* Clear the magic (a stale handle is then refused where it can be told) and free. */
void object_free(void *obj);

/* A copy of src (a new descriptor the caller destroys), NULL when out of memory. */
aclTensorDesc *tensor_desc_copy(const aclTensorDesc *src);
/* 0 when desc is a live tensor descriptor, else ACL_ERROR_INVALID_PARAM with a message. */
int tensor_desc_check(const aclTensorDesc *desc, const char *what);

/* A growing byte buffer of int64 big-endian words (an OPERATOR message's tail, op.c); oom is set
 * instead of failing each put. */
struct wbuf {
    unsigned char *p;
    size_t len, cap;
    int oom;
};
void wbuf_word(struct wbuf *b, int64_t v);
void wbuf_double(struct wbuf *b, double v);
void wbuf_blob(struct wbuf *b, const void *data, size_t n); /* its length, then its bytes padded to 8 */

/* The attributes of attr (NULL: none) in the wire form of flexnpu_wire/opcall.py (opattr.c). */
size_t opattr_count(const aclopAttr *attr);
void opattr_encode(const aclopAttr *attr, struct wbuf *b);

#endif /* FLEXNPU_OBJECTS_H_ */
