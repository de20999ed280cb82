/*
 * mempolicy.c: CANN's memory policies and attributes, mapped to what a share's aclserver knows.
 *
 * CANN accepts every aclrtMemMallocPolicy value: a base policy (HUGE_FIRST .. HUGE1G_ONLY_P2P,
 * 0..7) with or without the flags ACL_MEM_TYPE_LOW_BAND_WIDTH, ACL_MEM_TYPE_HIGH_BAND_WIDTH and
 * ACL_MEM_ACCESS_USER_SPACE_READONLY, and any value it does not know as its default. The aclserver
 * knows the six policies 0..5 (one kind of memory per share), so the flags are dropped, the 1 GiB
 * policies become their 2 MiB twins (HUGE1G_ONLY -> HUGE_ONLY, HUGE1G_ONLY_P2P -> HUGE_ONLY_P2P)
 * and an unknown value becomes HUGE_FIRST. aclrtGetMemInfo's aclrtMemAttr 0..17 map likewise onto
 * 0..5 (P2P and 1 GiB kinds onto their plain twins; the kind-less ACL_MEM_* onto HBM): a share
 * reports one memory, its quota, whatever the kind.
 */
#include "client.h"

#define KIB 1024u
#define MIB (1024u * KIB)

int mem_policy_for_server(int policy)
{
    int base = policy & 0xFF; /* the flags are 0x100, 0x1000 and 0x100000 */
    switch (base) {
    case ACL_MEM_MALLOC_HUGE1G_ONLY:
        return ACL_MEM_MALLOC_HUGE_ONLY;
    case ACL_MEM_MALLOC_HUGE1G_ONLY_P2P:
        return ACL_MEM_MALLOC_HUGE_ONLY_P2P;
    case ACL_MEM_MALLOC_HUGE_FIRST:
    case ACL_MEM_MALLOC_HUGE_ONLY:
    case ACL_MEM_MALLOC_NORMAL_ONLY:
    case ACL_MEM_MALLOC_HUGE_FIRST_P2P:
    case ACL_MEM_MALLOC_HUGE_ONLY_P2P:
    case ACL_MEM_MALLOC_NORMAL_ONLY_P2P:
        return base;
    default:
        return ACL_MEM_MALLOC_HUGE_FIRST;
    }
}

uint32_t mem_policy_page_size(int policy)
{
    switch (policy & 0xFF) {
    case ACL_MEM_MALLOC_NORMAL_ONLY:
    case ACL_MEM_MALLOC_NORMAL_ONLY_P2P:
        return 4 * KIB;
    case ACL_MEM_MALLOC_HUGE1G_ONLY:
    case ACL_MEM_MALLOC_HUGE1G_ONLY_P2P:
        return 1024u * MIB;
    default:
        return 2 * MIB;
    }
}

int mem_attr_for_server(int attr)
{
    static const int twin[] = {
        [ACL_DDR_MEM] = ACL_DDR_MEM,
        [ACL_HBM_MEM] = ACL_HBM_MEM,
        [ACL_DDR_MEM_HUGE] = ACL_DDR_MEM_HUGE,
        [ACL_DDR_MEM_NORMAL] = ACL_DDR_MEM_NORMAL,
        [ACL_HBM_MEM_HUGE] = ACL_HBM_MEM_HUGE,
        [ACL_HBM_MEM_NORMAL] = ACL_HBM_MEM_NORMAL,
        [ACL_DDR_MEM_P2P_HUGE] = ACL_DDR_MEM_HUGE,
        [ACL_DDR_MEM_P2P_NORMAL] = ACL_DDR_MEM_NORMAL,
        [ACL_HBM_MEM_P2P_HUGE] = ACL_HBM_MEM_HUGE,
        [ACL_HBM_MEM_P2P_NORMAL] = ACL_HBM_MEM_NORMAL,
        [ACL_HBM_MEM_HUGE1G] = ACL_HBM_MEM_HUGE,
        [ACL_HBM_MEM_P2P_HUGE1G] = ACL_HBM_MEM_HUGE,
        [ACL_MEM_NORMAL] = ACL_HBM_MEM_NORMAL,
        [ACL_MEM_HUGE] = ACL_HBM_MEM_HUGE,
        [ACL_MEM_HUGE1G] = ACL_HBM_MEM_HUGE,
        [ACL_MEM_P2P_NORMAL] = ACL_HBM_MEM_NORMAL,
        [ACL_MEM_P2P_HUGE] = ACL_HBM_MEM_HUGE,
        [ACL_MEM_P2P_HUGE1G] = ACL_HBM_MEM_HUGE,
    };
    return attr >= 0 && attr < (int)(sizeof twin / sizeof twin[0]) ? twin[attr] : -1;
}
