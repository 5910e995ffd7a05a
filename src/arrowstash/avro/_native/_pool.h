/* Helper threads kept between calls by the native decoder and encoder. Each extension has its
 * own set: the pool is static, so one unit per extension includes this file.
 *
 * Creating a thread took 60-260 us of the caller's time on a 2-core VM, and the new thread began
 * 0.1-0.3 ms later; a kept thread woken through its condition variable began within ~30 us, on
 * the core it ran on before. Idle helpers wait in a list; a call takes as many as it needs and
 * starts new ones when the list runs short (several calls may run at once). A forked child has
 * none of its parent's threads: its list starts empty.
 *
 * Where a woken helper runs (Linux): after the process had slept 5 ms or more, as a consumer
 * does between polls, the scheduler woke helpers on the caller's own core (the other core, idle
 * that long, counts as busy to a guest kernel), and the two shared it for the whole call: two
 * threads decoded 100,000 flat records in 4.7 ms against 3.9 ms for one, and 14.9 against 13.7
 * ms on `events`. So a helper is woken with the caller's core taken out of its CPU mask, and
 * puts the caller's whole mask back once it runs: only the wake-up is steered. */
#ifndef ARROWSTASH_POOL_H
#define ARROWSTASH_POOL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__linux__) && defined(CPU_ZERO)
#define POOL_STEER 1
/* The CPUs a call's helpers may use: wake is `all` less the caller's core (when the others
 * are enough for the helpers), all is the calling thread's own mask. */
typedef struct { cpu_set_t wake, all; int steer, cpu; } PoolPlace;

static void pool_place(PoolPlace *pl, int helpers) {
    int cpu = pl->cpu = sched_getcpu();
    pl->steer = cpu >= 0 && sched_getaffinity(0, sizeof(cpu_set_t), &pl->all) == 0 &&
                CPU_ISSET(cpu, &pl->all) && CPU_COUNT(&pl->all) > helpers;
    if (!pl->steer) return;
    pl->wake = pl->all;
    CPU_CLR(cpu, &pl->wake);
}
#else
typedef struct { int steer, cpu; } PoolPlace;

static void pool_place(PoolPlace *pl, int helpers) { (void)helpers, pl->steer = 0, pl->cpu = -1; }
#endif

typedef struct PoolHelper {
    pthread_cond_t cv;
    void (*fn)(void *); /* the job handed over, NULL while idle */
    void *arg;
    struct PoolHelper *next;
#ifdef POOL_STEER
    pthread_t tid;
    int steered;     /* its mask is wake: it puts all back before the job */
    cpu_set_t all;
#endif
    int from;        /* the core of the thread that handed the job over, -1 unknown */
} PoolHelper;

/* Jobs that began on the core of the thread that handed them over, in this process: the
 * tests see the wake-ups steered. */
static atomic_long pool_same_core;

/* Steer helper w's wake-up away from the caller's core (w is not running: idle or new). */
static void pool_steer(PoolHelper *w, const PoolPlace *pl) {
#ifdef POOL_STEER
    w->steered = pl->steer && pthread_setaffinity_np(w->tid, sizeof(cpu_set_t), &pl->wake) == 0;
    if (w->steered) w->all = pl->all;
#else
    (void)w, (void)pl;
#endif
}

/* In the helper, woken: counted if it runs on the caller's core, then its mask back to the
 * caller's, so that the scheduler may move it. */
static void pool_unsteer(PoolHelper *me) {
#ifdef POOL_STEER
    if (me->from >= 0 && sched_getcpu() == me->from) atomic_fetch_add(&pool_same_core, 1);
    if (me->steered) pthread_setaffinity_np(pthread_self(), sizeof(cpu_set_t), &me->all);
    me->steered = 0;
#else
    (void)me;
#endif
}

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static PoolHelper *pool_idle;

static void *pool_loop(void *self) {
    PoolHelper *me = self;
    pthread_mutex_lock(&pool_mu);
#ifdef POOL_STEER
    me->tid = pthread_self(); /* read by pool_steer once it is idle, under pool_mu */
#endif
    for (;;) {
        while (!me->fn) pthread_cond_wait(&me->cv, &pool_mu);
        void (*fn)(void *) = me->fn;
        void *arg = me->arg;
        me->fn = NULL;
        pthread_mutex_unlock(&pool_mu);
        pool_unsteer(me);
        fn(arg);
        pthread_mutex_lock(&pool_mu);
        me->next = pool_idle;
        pool_idle = me;
    }
    return NULL;
}

/* Run fn(arg) on a kept helper (a new one if none is idle), woken where pl says: 0, or -1 if
 * no thread could start. */
static int pool_run(void (*fn)(void *), void *arg, const PoolPlace *pl) {
    pthread_mutex_lock(&pool_mu);
    PoolHelper *w = pool_idle;
    if (w) {
        pool_idle = w->next;
        pool_steer(w, pl);
        w->from = pl->cpu;
        w->fn = fn, w->arg = arg;
        pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&pool_mu);
    if (w) return 0;
    /* a new helper, started outside the lock (creating a thread takes a while): nobody else
     * knows it until it puts itself on the idle list */
    if (!(w = calloc(1, sizeof(PoolHelper)))) return -1;
    pthread_cond_init(&w->cv, NULL);
    w->fn = fn, w->arg = arg, w->from = pl->cpu;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
#ifdef POOL_STEER
    w->steered = pl->steer &&
                 pthread_attr_setaffinity_np(&attr, sizeof(cpu_set_t), &pl->wake) == 0;
    if (w->steered) w->all = pl->all;
#endif
    pthread_t tid;
    int failed = pthread_create(&tid, &attr, pool_loop, w) != 0;
    pthread_attr_destroy(&attr);
    if (failed) {
        pthread_cond_destroy(&w->cv);
        free(w);
        return -1;
    }
    pthread_detach(tid);
    return 0;
}

static void pool_lock(void) { pthread_mutex_lock(&pool_mu); }

static void pool_unlock(void) { pthread_mutex_unlock(&pool_mu); }

static void pool_forget(void) { /* in a forked child: the helpers stayed in the parent */
    pool_idle = NULL;
    pthread_mutex_unlock(&pool_mu);
}

static void pool_register(void) { pthread_atfork(pool_lock, pool_unlock, pool_forget); }

/* When the extension is imported (the fork handlers are registered once, whatever happens). */
static void pool_init(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pool_register);
}

/* -- waiting for the helpers ----------------------------------------------------------------
 * They are usually about to finish, and a thread woken from a condition variable took about a
 * millisecond to run again on a busy VM (a tenth of a batch of 100,000 records), so a waiting
 * thread spins for up to POOL_SPIN_NS first, then sleeps. */
#define POOL_SPIN_NS 500000

static int64_t pool_elapsed_ns(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)(t.tv_sec - t0->tv_sec) * 1000000000 + (t.tv_nsec - t0->tv_nsec);
}

static inline void pool_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Until *value >= goal, where value only grows, under mu, which cv is broadcast with. */
static void pool_wait(atomic_long *value, long goal, pthread_mutex_t *mu, pthread_cond_t *cv) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned i = 1; atomic_load(value) < goal; i++) {
        if (i % 256 == 0 && pool_elapsed_ns(&t0) > POOL_SPIN_NS) break;
        pool_relax();
    }
    pthread_mutex_lock(mu); /* also: the last helper is out of its critical section */
    while (atomic_load(value) < goal) pthread_cond_wait(cv, mu);
    pthread_mutex_unlock(mu);
}

#endif
