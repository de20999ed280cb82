"""A Python program that loads the ACL runtime the way pyACL and framework plugins do:
``ctypes.CDLL("libascendcl.so")``. No FlexNPU import; it runs under any Python 3 with ctypes.

Usage: python3 acl_ctypes.py <quota_bytes> <devices>. Prints ``val <key> <value>`` lines and
``ok``/``FAIL`` lines; exits with the number of failures.
"""

import ctypes
import sys

ACL_SUCCESS, ACL_ERROR_RT_MEMORY_ALLOCATION = 0, 207001
H2D, D2H = 1, 2
failures = 0


def check(cond, what):
    global failures
    print(("ok " if cond else "FAIL ") + what, flush=True)
    failures += 0 if cond else 1


def main(quota, devices):
    acl = ctypes.CDLL("libascendcl.so")
    acl.aclGetRecentErrMsg.restype = ctypes.c_char_p
    acl.aclrtGetSocName.restype = ctypes.c_char_p
    acl.aclrtMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int]
    acl.aclrtMallocHost.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    acl.aclrtFree.argtypes = [ctypes.c_void_p]
    acl.aclrtFreeHost.argtypes = [ctypes.c_void_p]
    acl.aclrtMemcpy.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
    ]
    acl.aclrtGetMemInfo.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t),
    ]

    def msg():
        m = acl.aclGetRecentErrMsg()
        return m.decode() if m else ""

    check(acl.aclInit(None) == ACL_SUCCESS, f"aclInit {msg()}")
    count = ctypes.c_uint32()
    check(acl.aclrtGetDeviceCount(ctypes.byref(count)) == 0, "aclrtGetDeviceCount")
    print(f"val device_count {count.value}")
    check(count.value == devices, f"device count {count.value} == {devices}")
    check(acl.aclrtSetDevice(0) == 0, "aclrtSetDevice(0)")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(acl.aclrtGetMemInfo(1, ctypes.byref(free), ctypes.byref(total)) == 0, "aclrtGetMemInfo")
    print(f"val total {total.value}")
    check(total.value == quota, f"total {total.value} == quota {quota}")
    dev = ctypes.c_void_p()
    check(acl.aclrtMalloc(ctypes.byref(dev), quota // 2, 0) == 0, f"malloc half the quota {msg()}")
    other = ctypes.c_void_p()
    ret = acl.aclrtMalloc(ctypes.byref(other), quota, 0)
    print(f"val over_quota_code {ret}")
    print(f"val over_quota_msg {msg()}")
    check(ret == ACL_ERROR_RT_MEMORY_ALLOCATION, "malloc beyond the quota is refused with 207001")
    n = 3 << 20
    host = ctypes.c_void_p()
    check(acl.aclrtMallocHost(ctypes.byref(host), n) == 0, "aclrtMallocHost")
    pattern = bytes((i * 7 + 3) & 0xFF for i in range(n))
    ctypes.memmove(host, pattern, n)
    check(acl.aclrtMemcpy(dev, quota // 2, host, n, H2D) == 0, f"memcpy host to device {msg()}")
    ctypes.memset(host, 0, n)
    check(acl.aclrtMemcpy(host, n, dev, n, D2H) == 0, f"memcpy device to host {msg()}")
    check(ctypes.string_at(host, n) == pattern, "content came back intact")
    plain = ctypes.create_string_buffer(n)
    check(acl.aclrtMemcpy(plain, n, dev, n, D2H) == 0, "memcpy device to a plain buffer")
    check(plain.raw == pattern, "plain buffer content intact")
    check(acl.aclrtFreeHost(host) == 0 and acl.aclrtFree(dev) == 0, "free")
    check(acl.aclFinalize() == 0, "aclFinalize")
    print(f"failures {failures}")
    return min(failures, 100)


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
