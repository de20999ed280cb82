/*
 * flexnpu_kernel.h: the arguments of the emulated backend's kernel, launched with
 * aclrtLaunchKernel(NULL, 1, &args, sizeof args, stream). The kernel occupies the die for
 * duration_us under the share's compute policy, then writes (tag, crc32 of in_len bytes at
 * in_ptr) as two little-endian uint64 at out_ptr (each pointer is device memory or 0).
 */
#ifndef FLEXNPU_KERNEL_H_
#define FLEXNPU_KERNEL_H_

#include <stdint.h>

typedef struct aclrtEmulatedKernelArgs {
    uint64_t duration_us;
    uint64_t tag;
    uint64_t out_ptr;
    uint64_t in_ptr;
    uint64_t in_len;
} aclrtEmulatedKernelArgs;

#endif /* FLEXNPU_KERNEL_H_ */
