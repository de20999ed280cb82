/*
 * wire.h: the aclserver wire protocol as the C client speaks it. Byte-compatible with
 * dra_driver/aclserver/protocol.py (framing, op numbers) and dra_driver/aclserver/datalink.py
 * (host pointers); tests/c/test_constants.py checks every number here against the Python side.
 *
 * A frame: uint32 length (big-endian, of what follows) | uint16 op | uint16 flags |
 * uint32 request_id | uint8 n_ints | n_ints x int64 (big-endian) | tail bytes.
 */
#ifndef FLEXNPU_WIRE_H_
#define FLEXNPU_WIRE_H_

#include <stddef.h>
#include <stdint.h>

#define FLEXNPU_PROTOCOL_VERSION 1
#define FLEXNPU_FLAG_REPLY 0x1
#define FLEXNPU_HEADER_BYTES 9
#define FLEXNPU_MAX_INTS 255
#define FLEXNPU_REPLY_MAX_FRAME (1u << 20)
#define FLEXNPU_HOST_TAG (UINT64_C(1) << 60)
#define FLEXNPU_OFFSET_BITS 36

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
};

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

struct wire_reader {
    unsigned char *buf;
    size_t cap, start, end;
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

void wire_reader_free(struct wire_reader *r);

#endif /* FLEXNPU_WIRE_H_ */
