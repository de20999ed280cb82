/*
 * wire.h: the aclserver wire protocol as the C client speaks it. Byte-compatible with
 * client/flexnpu_wire/framing.py and ops.py (framing, op numbers) and client/flexnpu_wire/datalink.py
 * (host pointers); tests/c/test_constants.py checks every number here against the Python side.
 *
 * A frame: uint32 length (big-endian, of what follows) | uint16 op | uint16 flags |
 * uint32 request_id | uint8 n_ints | n_ints x int64 (big-endian) | tail bytes.
 *
 * When the generated wire contract (client/flexnpu_wire/generated/flexnpu_wire.h, on the include
 * path from the Makefile) is present, its numbers are used and every op number below is checked
 * against it at compile time; otherwise the same numbers are defined here.
 */
#ifndef FLEXNPU_WIRE_H_
#define FLEXNPU_WIRE_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__has_include)
#if __has_include("flexnpu_wire.h")
#include "flexnpu_wire.h"
#endif
#endif

#ifndef FLEXNPU_WIRE_H /* no generated contract in this tree */
#define FLEXNPU_PROTOCOL_VERSION 1
#define FLEXNPU_FLAG_REPLY 0x1
#define FLEXNPU_HEADER_BYTES 9
#define FLEXNPU_HOST_TAG (UINT64_C(1) << 60)
#define FLEXNPU_OFFSET_BITS 36
#endif
#define FLEXNPU_MAX_INTS 255
#define FLEXNPU_REPLY_MAX_FRAME (1u << 20)

enum flexnpu_op {
    OP_NONE = 0,
    OP_PING = 1,
    OP_HELLO = 2,
    OP_INIT = 3,
    OP_FINALIZE = 4,
    OP_GET_DEVICE_COUNT = 5,
    OP_SET_DEVICE = 6,
    OP_RESET_DEVICE = 7,
    OP_GET_DEVICE = 8,
    OP_MALLOC = 10,
    OP_FREE = 11,
    OP_MEMCPY = 12,
    OP_MEMSET = 13,
    OP_GET_MEM_INFO = 14,
    OP_MALLOC_HOST = 15,
    OP_FREE_HOST = 16,
    OP_CREATE_STREAM = 20,
    OP_DESTROY_STREAM = 21,
    OP_SYNCHRONIZE_STREAM = 22,
    OP_SYNCHRONIZE_DEVICE = 23,
    OP_LAUNCH_KERNEL = 24,
    OP_GET_STATS = 30,
    OP_GET_USAGE = 31,
    OP_MODEL_BYTES_OPEN = 40,
    OP_MODEL_BYTES_WRITE = 41,
    OP_MODEL_BYTES_CLOSE = 42,
    OP_MODEL_QUERY_SIZE = 43,
    OP_MODEL_QUERY_DESC = 44,
    OP_MODEL_LOAD = 45,
    OP_MODEL_GET_DESC = 46,
    OP_MODEL_EXECUTE = 47,
    OP_MODEL_UNLOAD = 48,
    OP_STAGING_FD = 50,
    OP_MALLOC_HOST_FD = 51,
    OP_OPERATOR = 60,
    OP_VMM_RESERVE = 61,
    OP_VMM_RELEASE = 62,
    OP_VMM_MALLOC_PHYSICAL = 63,
    OP_VMM_FREE_PHYSICAL = 64,
    OP_VMM_MAP = 65,
    OP_VMM_UNMAP = 66,
    OP_BINARY_LOAD = 67,
    OP_BINARY_GET_FUNCTION = 68,
    OP_LAUNCH_FUNCTION = 69,
    OP_BINARY_UNLOAD = 70,
};

#ifdef FLEXNPU_WIRE_H
#define FLEXNPU_SAME_OP(name) _Static_assert(OP_##name == FLEXNPU_OP_##name, "op " #name " differs from the contract")
FLEXNPU_SAME_OP(NONE);
FLEXNPU_SAME_OP(PING);
FLEXNPU_SAME_OP(HELLO);
FLEXNPU_SAME_OP(INIT);
FLEXNPU_SAME_OP(FINALIZE);
FLEXNPU_SAME_OP(GET_DEVICE_COUNT);
FLEXNPU_SAME_OP(SET_DEVICE);
FLEXNPU_SAME_OP(RESET_DEVICE);
FLEXNPU_SAME_OP(GET_DEVICE);
FLEXNPU_SAME_OP(MALLOC);
FLEXNPU_SAME_OP(FREE);
FLEXNPU_SAME_OP(MEMCPY);
FLEXNPU_SAME_OP(MEMSET);
FLEXNPU_SAME_OP(GET_MEM_INFO);
FLEXNPU_SAME_OP(MALLOC_HOST);
FLEXNPU_SAME_OP(FREE_HOST);
FLEXNPU_SAME_OP(CREATE_STREAM);
FLEXNPU_SAME_OP(DESTROY_STREAM);
FLEXNPU_SAME_OP(MODEL_BYTES_OPEN);
FLEXNPU_SAME_OP(MODEL_BYTES_WRITE);
FLEXNPU_SAME_OP(MODEL_BYTES_CLOSE);
FLEXNPU_SAME_OP(MODEL_QUERY_SIZE);
FLEXNPU_SAME_OP(MODEL_QUERY_DESC);
FLEXNPU_SAME_OP(MODEL_LOAD);
FLEXNPU_SAME_OP(MODEL_GET_DESC);
FLEXNPU_SAME_OP(MODEL_EXECUTE);
FLEXNPU_SAME_OP(MODEL_UNLOAD);
FLEXNPU_SAME_OP(STAGING_FD);
FLEXNPU_SAME_OP(MALLOC_HOST_FD);
FLEXNPU_SAME_OP(OPERATOR);
FLEXNPU_SAME_OP(VMM_RESERVE);
FLEXNPU_SAME_OP(VMM_RELEASE);
FLEXNPU_SAME_OP(VMM_MALLOC_PHYSICAL);
FLEXNPU_SAME_OP(VMM_FREE_PHYSICAL);
FLEXNPU_SAME_OP(VMM_MAP);
FLEXNPU_SAME_OP(VMM_UNMAP);
FLEXNPU_SAME_OP(SYNCHRONIZE_STREAM);
FLEXNPU_SAME_OP(SYNCHRONIZE_DEVICE);
FLEXNPU_SAME_OP(LAUNCH_KERNEL);
FLEXNPU_SAME_OP(GET_STATS);
FLEXNPU_SAME_OP(GET_USAGE);
_Static_assert(FLEXNPU_OP_HELLO_NREPLY == 3, "HELLO reply: server pid, device count, staging size");
_Static_assert(FLEXNPU_OP_MALLOC_HOST_NREPLY == 2, "MALLOC_HOST reply: wire pointer, mapped size");
_Static_assert(FLEXNPU_OP_GET_MEM_INFO_NREPLY == 2, "GET_MEM_INFO reply: free, total");
_Static_assert(FLEXNPU_OP_MEMCPY_NREQ_MAX == 6, "MEMCPY takes an optional span");
#endif

/* The wire form of a host pointer: HOST_TAG | region_id << OFFSET_BITS | offset. */
static inline uint64_t wire_host_ptr(uint64_t region_id, uint64_t offset)
{
    return FLEXNPU_HOST_TAG | (region_id << FLEXNPU_OFFSET_BITS) | offset;
}

/* One decoded reply. ints[0] is the ACL return code. tail points into the reader's buffer and
 * stays valid until the next read. */
struct wire_msg {
    uint16_t op;
    uint16_t flags;
    uint32_t request_id;
    unsigned n_ints;
    int64_t ints[FLEXNPU_MAX_INTS];
    const char *tail;
    size_t tail_len;
};

#define WIRE_MAX_FDS 8

/* The bytes read but not yet decoded, and the descriptors that came with them (SCM_RIGHTS on
 * the unix socket: the aclserver passes a sealed memfd with the replies of STAGING_FD and
 * MALLOC_HOST_FD), oldest first. */
struct wire_reader {
    unsigned char *buf;
    size_t cap, start, end;
    int fds[WIRE_MAX_FDS];
    unsigned nfds;
};

/* Encode one frame into out (capacity cap). Returns its length, or 0 if it does not fit. */
size_t wire_encode(unsigned char *out, size_t cap, uint16_t op, uint32_t request_id, const int64_t *ints,
                   unsigned n_ints, const void *tail, size_t tail_len);

/* Send all of buf, waiting at most timeout_ms (< 0: no limit) in total. 0 or -errno. */
int wire_send_all(int fd, const void *buf, size_t len, int timeout_ms);

/* Read the next frame, waiting at most timeout_ms (< 0: no limit). 0 on success, -errno on a
 * socket error, -ETIMEDOUT, -ECONNRESET when the peer closed, -EPROTO for a malformed or
 * oversized frame. */
int wire_read(int fd, struct wire_reader *r, struct wire_msg *msg, int timeout_ms);

/* The oldest descriptor received (the caller owns it), -1 when none came. */
int wire_take_fd(struct wire_reader *r);

void wire_reader_free(struct wire_reader *r); /* and close the descriptors it still holds */

#endif /* FLEXNPU_WIRE_H_ */
