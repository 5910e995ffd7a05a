/* Memory blocks kept for reuse by the native decoder and encoder (each extension has its own
 * pool). A fresh page costs a page fault, and the kernel's zeroing, on its first write: a
 * decode of 100,000 records whose output came straight from the system each call spent a third
 * of its time there, and an encode called now and then a quarter. So blocks of REUSE_MIN bytes
 * or more are kept when freed (outputs once Arrow releases them, scratch after a call), up to a
 * pool's `keep` bytes and `slots` blocks, and later requests take them.
 *
 * Those blocks also lie on huge pages where the system has them (Linux, transparent huge pages
 * on request): decoding or encoding a batch whose buffers have not been touched for a while
 * (any other work in between) missed the TLB on every 4 KiB page of every column, and each miss
 * is a page walk through two sets of page tables on a VM. A block of REUSE_HUGE bytes or more
 * is a mapping of its own, aligned to 2 MiB; smaller ones are cut from a pool's current region
 * (REUSE_REGION bytes, aligned, advised likewise), so that the columns of a batch share huge
 * pages. Both kinds go back to the system with munmap: a block's size is a multiple of
 * REUSE_GRAIN, its start on such a boundary. */
#ifndef ARROWSTASH_REUSE_H
#define ARROWSTASH_REUSE_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#define REUSE_MIN ((size_t)64 << 10)
#define REUSE_MAX_SLOTS 256
#define REUSE_HUGE ((size_t)2 << 20)
#define REUSE_REGION ((size_t)32 << 20)
#define REUSE_GRAIN ((size_t)64 << 10)
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(__SANITIZE_ADDRESS__)
#define REUSE_MAP 1 /* (under AddressSanitizer every block comes from malloc, which it checks) */
#endif

typedef struct {
    size_t keep;  /* bytes kept at most */
    int slots;    /* blocks kept at most, up to REUSE_MAX_SLOTS */
    int count;
    size_t bytes;
    pthread_mutex_t mu;
    struct { void *p; size_t cap; } slot[REUSE_MAX_SLOTS];
    uint8_t *next, *end; /* the unused rest of the current region */
} Reuse;

#define REUSE_INIT(keep, slots) \
    {(keep), (slots), 0, 0, PTHREAD_MUTEX_INITIALIZER, {{0, 0}}, NULL, NULL}

static size_t reuse_round(size_t n, size_t to) { return (n + to - 1) & ~(to - 1); }

#ifdef REUSE_MAP
/* `size` bytes (a multiple of REUSE_HUGE) aligned to REUSE_HUGE and advised for huge pages. */
static uint8_t *reuse_map(size_t size) {
    uint8_t *p = mmap(NULL, size + REUSE_HUGE, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    uint8_t *a = (uint8_t *)reuse_round((uintptr_t)p, REUSE_HUGE);
    if (a > p) munmap(p, (size_t)(a - p));
    munmap(a + size, (size_t)(p + REUSE_HUGE - a));
    madvise(a, size, MADV_HUGEPAGE);
    return a;
}
#endif

/* A new block of at least *cap bytes (*cap becomes its size), or NULL; called under r->mu. */
static void *reuse_sys_alloc(Reuse *r, size_t *cap) {
#ifdef REUSE_MAP
    if (*cap >= REUSE_MIN) {
        size_t size = reuse_round(*cap, REUSE_GRAIN);
        uint8_t *p;
        if (size >= REUSE_HUGE) {
            size = reuse_round(size, REUSE_HUGE);
            p = reuse_map(size);
        } else {
            if (r->next == NULL || (size_t)(r->end - r->next) < size) {
                uint8_t *region = reuse_map(REUSE_REGION);
                if (region == NULL) return NULL;
                if (r->next < r->end) munmap(r->next, (size_t)(r->end - r->next));
                r->next = region;
                r->end = region + REUSE_REGION;
            }
            p = r->next;
            r->next += size;
        }
        if (p) *cap = size;
        return p;
    }
#else
    (void)r;
#endif
    return malloc(*cap);
}

/* Free a block of `cap` bytes from reuse_sys_alloc. */
static void reuse_sys_free(void *p, size_t cap) {
#ifdef REUSE_MAP
    if (p && cap >= REUSE_MIN) {
        munmap(p, cap);
        return;
    }
#endif
    free(p);
}

/* Give the end of a block of *cap bytes, of which `used` are needed, back to the system;
 * returns the block (maybe moved) and sets *cap, or returns NULL and leaves both as they were. */
static inline void *reuse_sys_shrink(void *p, size_t *cap, size_t used) {
#ifdef REUSE_MAP
    if (*cap >= REUSE_MIN) {
        size_t keep = reuse_round(used ? used : 1, REUSE_GRAIN);
        if (keep < REUSE_MIN) keep = REUSE_MIN;
        if (keep < *cap) {
            munmap((uint8_t *)p + keep, *cap - keep);
            *cap = keep;
        }
        return p;
    }
#endif
    void *fit = realloc(p, used ? used : 1);
    if (fit) *cap = used ? used : 1;
    return fit;
}

/* A block of at least *cap bytes (*cap becomes its real size), or NULL. A kept block is taken
 * when it is at most 4 times too large (best fit), so small requests leave the big ones. */
static void *reuse_alloc(Reuse *r, size_t *cap) {
    if (*cap < REUSE_MIN) return malloc(*cap);
    void *p = NULL;
    pthread_mutex_lock(&r->mu);
    int best = -1;
    for (int i = 0; i < r->count; i++)
        if (r->slot[i].cap >= *cap && r->slot[i].cap / 4 <= *cap &&
            (best < 0 || r->slot[i].cap < r->slot[best].cap))
            best = i;
    if (best >= 0) {
        p = r->slot[best].p;
        *cap = r->slot[best].cap;
        r->bytes -= *cap;
        r->slot[best] = r->slot[--r->count];
    } else {
        p = reuse_sys_alloc(r, cap);
    }
    pthread_mutex_unlock(&r->mu);
    return p;
}

/* Free (or keep) a block of cap bytes from reuse_alloc or realloc. When there is no room, the
 * smallest kept blocks make way for a larger one (the small ones are the steps of growth). */
static void reuse_free(Reuse *r, void *p, size_t cap) {
    if (!p || cap < REUSE_MIN || cap > r->keep) {
        reuse_sys_free(p, cap);
        return;
    }
    void *drop[REUSE_MAX_SLOTS];
    size_t drop_cap[REUSE_MAX_SLOTS];
    int n_drop = 0, kept = 0;
    pthread_mutex_lock(&r->mu);
    while (r->count > 0 && (r->count == r->slots || r->bytes + cap > r->keep)) {
        int small = 0;
        for (int i = 1; i < r->count; i++)
            if (r->slot[i].cap < r->slot[small].cap) small = i;
        if (r->slot[small].cap >= cap) break;
        drop_cap[n_drop] = r->slot[small].cap;
        drop[n_drop++] = r->slot[small].p;
        r->bytes -= r->slot[small].cap;
        r->slot[small] = r->slot[--r->count];
    }
    if (r->count < r->slots && r->bytes + cap <= r->keep) {
        r->slot[r->count].p = p;
        r->slot[r->count++].cap = cap;
        r->bytes += cap;
        kept = 1;
    }
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < n_drop; i++) reuse_sys_free(drop[i], drop_cap[i]);
    if (!kept) reuse_sys_free(p, cap);
}

#endif
