/* Memory blocks kept for reuse by the native decoder and encoder (each extension has its own
 * pool). A fresh page costs a page fault, and the kernel's zeroing, on its first write: a
 * decode of 100,000 records whose output came straight from the system each call spent a third
 * of its time there, and an encode called now and then a quarter. So blocks of REUSE_MIN bytes
 * or more are kept when freed (outputs once Arrow releases them, scratch after a call), up to a
 * pool's `keep` bytes and `slots` blocks, and later requests take them. */
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

/* Blocks of REUSE_HUGE bytes or more are whole, aligned huge pages where the system has them
 * (Linux, transparent huge pages on request): decoding or encoding a batch whose buffers have
 * not been touched for a while (any other work in between) missed the TLB on every 4 KiB page
 * of every column, and each miss is a page walk through two sets of page tables on a VM. */
#define REUSE_HUGE ((size_t)2 << 20)
#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(__SANITIZE_ADDRESS__)
#define REUSE_MAP 1 /* (under AddressSanitizer every block comes from malloc, which it checks) */
#endif

static void *reuse_sys_alloc(size_t *cap) {
#ifdef REUSE_MAP
    if (*cap >= REUSE_HUGE) {
        size_t size = (*cap + REUSE_HUGE - 1) & ~(REUSE_HUGE - 1);
        uint8_t *p = mmap(NULL, size + REUSE_HUGE, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        uint8_t *a = (uint8_t *)(((uintptr_t)p + REUSE_HUGE - 1) & ~(uintptr_t)(REUSE_HUGE - 1));
        if (a > p) munmap(p, (size_t)(a - p));
        if (a + size < p + size + REUSE_HUGE) munmap(a + size, (size_t)(p + REUSE_HUGE - a));
        madvise(a, size, MADV_HUGEPAGE);
        *cap = size;
        return a;
    }
#endif
    return malloc(*cap);
}

/* Free a block of `cap` bytes from reuse_sys_alloc. */
static void reuse_sys_free(void *p, size_t cap) {
#ifdef REUSE_MAP
    if (p && cap >= REUSE_HUGE) {
        munmap(p, cap);
        return;
    }
#endif
    free(p);
}

/* Give the end of a block of *cap bytes, of which `used` are needed, back to the system;
 * returns the block (maybe moved) and sets *cap, or returns NULL and leaves both as they were. */
static void *reuse_sys_shrink(void *p, size_t *cap, size_t used) {
#ifdef REUSE_MAP
    if (*cap >= REUSE_HUGE) {
        size_t keep = (used + REUSE_HUGE - 1) & ~(REUSE_HUGE - 1);
        if (keep < REUSE_HUGE) keep = REUSE_HUGE;
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

typedef struct {
    size_t keep;  /* bytes kept at most */
    int slots;    /* blocks kept at most, up to REUSE_MAX_SLOTS */
    int count;
    size_t bytes;
    pthread_mutex_t mu;
    struct { void *p; size_t cap; } slot[REUSE_MAX_SLOTS];
} Reuse;

#define REUSE_INIT(keep, slots) {(keep), (slots), 0, 0, PTHREAD_MUTEX_INITIALIZER, {{0, 0}}}

/* A block of at least *cap bytes (*cap becomes its real size), or NULL. A kept block is taken
 * when it is at most 4 times too large (best fit), so small requests leave the big ones. */
static void *reuse_alloc(Reuse *r, size_t *cap) {
    void *p = NULL;
    if (*cap >= REUSE_MIN) {
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
        }
        pthread_mutex_unlock(&r->mu);
    }
    return p ? p : reuse_sys_alloc(cap);
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
