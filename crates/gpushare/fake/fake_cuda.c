/*
 * A fake CUDA driver (libcuda.so.1) and NVML (libnvidia-ml.so.1) for Tessera's
 * GPU-sharing tests. No GPU, no NVIDIA code: it implements the driver entry points
 * that tessera-cuda intercepts, over host memory, and a simulated device on a fake
 * clock.
 *
 * The device. One serial device per state file (FAKECUDA_STATE; without it, a
 * state private to the process and the children it forks). Kernels run one after
 * another in launch order; a kernel's duration is in its name (`spin_<ns>`). Time
 * is simulated: the clock moves only when every registered process is blocked in
 * a fake wait (stream/context synchronisation, a full launch queue, an explicit
 * sleep), and then jumps to the earliest wake-up. Host code takes no fake time.
 * That is a conservative discrete-event simulation across processes: results do
 * not depend on how busy the real machine is.
 *
 * Memory. A shared counter per state file, with a per-process share that is
 * released when the process exits or dies (like a real driver destroying a
 * context), and a peak: the ground truth the tests compare the interposer against.
 *
 * Test hooks (not CUDA): fakecuda* for the harness, tesseraFake* for the
 * interposer's clock. Build: cc -shared -fPIC -O2 -Wl,-Bsymbolic -Wl,-soname,libcuda.so.1.
 * Defines: FAKECUDA_OMIT_CTX_GET_DEVICE leaves cuCtxGetDevice out (a driver
 * missing a symbol the interposer needs).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUarray, *CUmipmappedArray,
    *CUgraph, *CUgraphExec, *CUgraphNode, *CUmemoryPool;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
};

typedef struct {
    size_t Width, Height;
    unsigned Format, NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct {
    size_t Width, Height, Depth;
    unsigned Format, NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* ---------------------------------------------------------------- state */

#define FK_MAGIC 0x4641434b43554441ULL
#define FK_MAXP 64
#define FK_RING 256
#define FK_QUEUE 8
enum { P_FREE = 0, P_RUNNING = 1, P_BLOCKED = 2 };

struct fk_part {
    int32_t pid;
    int32_t state;
    /* The pid namespace (inode of /proc/self/ns/pid): sandboxed processes share
     * a device with the host and may have the same pid as another's. */
    uint64_t ns;
    /* 1: holds its liveness lock (byte `slot` of the state file). */
    uint32_t locked;
    uint32_t _lpad;
    uint64_t wake;
    uint64_t last_end;
    uint64_t busy_total;
    uint64_t mem_used;
    uint32_t ring_head; /* next slot to write */
    uint32_t ring_len;
    uint64_t ring_s[FK_RING];
    uint64_t ring_e[FK_RING];
};

struct fk_shm {
    uint64_t magic;
    pthread_mutex_t mu;
    uint64_t now;
    uint64_t busy_until;
    uint64_t mem_total;
    uint64_t mem_used;
    uint64_t mem_peak;
    uint32_t seq; /* futex word: bumped when the clock moves or a process leaves */
    uint32_t _pad;
    struct fk_part parts[FK_MAXP];
    /* NVML events (Xid, ECC) injected by tests: a ring read by event sets. */
    uint32_t ev_count;
    uint32_t _pad2;
    struct { uint32_t dev; uint32_t _p; uint64_t type, data; } ev[64];
};

static struct fk_shm *S;
static int my_part = -1;
static pid_t my_pid;
static uint64_t my_ns;
/* The state file, open (checks other participants' liveness locks), and this
 * participant's own open of it, holding an OFD lock on byte `my_part` for as
 * long as the process lives (works across pid namespaces, unlike pids). */
static int state_fd = -1;
static int part_fd = -1;
static pthread_mutex_t attach_mu = PTHREAD_MUTEX_INITIALIZER;
static int atexit_done;
static __thread CUdevice cur_dev;

static uint64_t env_u64(const char *k, uint64_t dflt) {
    const char *v = getenv(k);
    if (!v || !*v) return dflt;
    return strtoull(v, NULL, 10);
}

static void shm_init(struct fk_shm *s) {
    memset(s, 0, sizeof *s);
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->mu, &a);
    s->mem_total = env_u64("FAKECUDA_TOTAL_MEM", 1ULL << 30);
    __atomic_store_n(&s->magic, FK_MAGIC, __ATOMIC_RELEASE);
}

static struct fk_shm *map_state(const char *path) {
    if (!path || !*path) {
        /* Shared with forked children (one device for a process tree). */
        void *p = mmap(NULL, sizeof(struct fk_shm), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        shm_init(p);
        return p;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return NULL;
    flock(fd, LOCK_EX);
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); return NULL; }
    int fresh = (size_t)st.st_size < sizeof(struct fk_shm);
    if (fresh && ftruncate(fd, sizeof(struct fk_shm)) != 0) { close(fd); return NULL; }
    void *p = mmap(NULL, sizeof(struct fk_shm), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED && (fresh || ((struct fk_shm *)p)->magic != FK_MAGIC)) shm_init(p);
    flock(fd, LOCK_UN);
    if (state_fd >= 0) close(state_fd);
    state_fd = fd;
    return p == MAP_FAILED ? NULL : p;
}

static void lk(void) {
    if (pthread_mutex_lock(&S->mu) == EOWNERDEAD) pthread_mutex_consistent(&S->mu);
}
static void ulk(void) { pthread_mutex_unlock(&S->mu); }

static long futex(uint32_t *w, int op, uint32_t v, const struct timespec *ts) {
    return syscall(SYS_futex, w, op, v, ts, NULL, 0);
}
static void wake_all(void) {
    __atomic_add_fetch(&S->seq, 1, __ATOMIC_SEQ_CST);
    futex(&S->seq, FUTEX_WAKE, 0x7fffffff, NULL);
}

/* A process is gone when /proc says so (zombies count as gone: a real driver has
 * released their context by then). */
static int fk_alive(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kill(pid, 0) == 0 || errno == EPERM;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *rp = strrchr(buf, ')');
    if (!rp || !rp[1] || !rp[2]) return 1;
    return rp[2] != 'Z' && rp[2] != 'X';
}

static void free_part_locked(struct fk_part *p) {
    S->mem_used -= p->mem_used < S->mem_used ? p->mem_used : S->mem_used;
    memset(p, 0, sizeof *p);
}

static uint64_t pid_ns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Whether participant slot i's process still holds its liveness lock (1: yes or
 * cannot tell; 0: no lock, it is gone). */
static int part_locked(int i) {
    if (state_fd < 0) return 1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = i, .l_len = 1};
    if (fcntl(state_fd, F_OFD_GETLK, &fl) != 0) return 1;
    return fl.l_type != F_UNLCK;
}

static void reap_dead_locked(void) {
    for (int i = 0; i < FK_MAXP; i++) {
        struct fk_part *p = &S->parts[i];
        if (!p->pid || (p->pid == my_pid && p->ns == my_ns)) continue;
        /* A pid is only meaningful in its own namespace; the lock in any. */
        int dead = (p->locked && !part_locked(i)) || (p->ns == my_ns && !fk_alive(p->pid));
        if (dead) {
            free_part_locked(p);
            wake_all();
        }
    }
}

static void fk_leave(void) {
    if (!S || my_part < 0 || my_pid != getpid()) return;
    lk();
    if (S->parts[my_part].pid == my_pid && S->parts[my_part].ns == my_ns)
        free_part_locked(&S->parts[my_part]);
    wake_all();
    if (part_fd >= 0) close(part_fd);
    part_fd = -1;
    ulk();
    my_part = -1;
}

static void fk_state(void) {
    if (S) return;
    pthread_mutex_lock(&attach_mu);
    if (!S) S = map_state(getenv("FAKECUDA_STATE"));
    pthread_mutex_unlock(&attach_mu);
    if (!S) {
        fprintf(stderr, "fakecuda: cannot map state %s\n", getenv("FAKECUDA_STATE"));
        abort();
    }
}

/* This process's participant slot (a new one after fork). */
static struct fk_part *fk_me(void) {
    fk_state();
    pid_t pid = getpid();
    if (my_part >= 0 && my_pid == pid) return &S->parts[my_part];
    lk();
    my_pid = pid;
    my_ns = pid_ns();
    my_part = -1;
    /* After fork the parent's lock descriptor is not this process's own. */
    part_fd = -1;
    /* A part of this pid is the program image this one exec'ed from: a real
     * driver released its context at exec. */
    for (int i = 0; i < FK_MAXP; i++)
        if (S->parts[i].pid == pid && S->parts[i].ns == my_ns) free_part_locked(&S->parts[i]);
    for (int pass = 0; pass < 2 && my_part < 0; pass++) {
        for (int i = 0; i < FK_MAXP; i++) {
            if (S->parts[i].pid == 0) {
                memset(&S->parts[i], 0, sizeof S->parts[i]);
                S->parts[i].pid = pid;
                S->parts[i].ns = my_ns;
                S->parts[i].state = P_RUNNING;
                my_part = i;
                break;
            }
        }
        if (my_part < 0) reap_dead_locked();
    }
    if (my_part >= 0 && state_fd >= 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", state_fd);
        part_fd = open(path, O_RDWR | O_CLOEXEC);
        struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = my_part, .l_len = 1};
        if (part_fd >= 0 && fcntl(part_fd, F_OFD_SETLK, &fl) == 0) S->parts[my_part].locked = 1;
    }
    ulk();
    if (my_part < 0) {
        fprintf(stderr, "fakecuda: more than %d processes on one fake device\n", FK_MAXP);
        abort();
    }
    if (!atexit_done) {
        atexit_done = 1;
        atexit(fk_leave);
    }
    return &S->parts[my_part];
}

static int all_blocked_locked(void) {
    for (int i = 0; i < FK_MAXP; i++)
        if (S->parts[i].pid && S->parts[i].state == P_RUNNING) return 0;
    return 1;
}

static uint64_t min_wake_locked(void) {
    uint64_t m = UINT64_MAX;
    for (int i = 0; i < FK_MAXP; i++)
        if (S->parts[i].pid && S->parts[i].state == P_BLOCKED && S->parts[i].wake < m)
            m = S->parts[i].wake;
    return m;
}

/* Blocks this process until the fake clock reaches t. */
static void fk_block_until(uint64_t t) {
    struct fk_part *me = fk_me();
    lk();
    me->state = P_BLOCKED;
    me->wake = t;
    while (S->now < t) {
        if (all_blocked_locked()) {
            uint64_t m = min_wake_locked();
            if (m != UINT64_MAX && m > S->now) {
                S->now = m;
                wake_all();
                continue;
            }
            /* Someone is due already and has not run yet: let it. */
        }
        uint32_t seq = __atomic_load_n(&S->seq, __ATOMIC_SEQ_CST);
        ulk();
        struct timespec ts = {0, 2 * 1000 * 1000};
        long r = futex(&S->seq, FUTEX_WAIT, seq, &ts);
        int timed_out = r != 0 && errno == ETIMEDOUT;
        lk();
        if (timed_out) reap_dead_locked();
    }
    me->state = P_RUNNING;
    ulk();
}

/* ---------------------------------------------------------------- memory */

struct fk_block {
    uint64_t magic;
    uint64_t size; /* accounted bytes */
    uint64_t map_len;
    uint64_t _pad[5];
};
#define BLOCK_MAGIC 0x626c6f636b46414bULL

static CUresult fk_alloc(size_t size, void **out) {
    struct fk_part *me = fk_me();
    lk();
    /* A real driver frees a process's memory as it dies (its device files
     * close before it is a zombie); do the same before counting. */
    reap_dead_locked();
    if (S->mem_used + size > S->mem_total) {
        ulk();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    S->mem_used += size;
    me->mem_used += size;
    if (S->mem_used > S->mem_peak) S->mem_peak = S->mem_used;
    ulk();
    /* Host memory behind it: malloc for small blocks, a reserved but untouched
     * mapping for large ones (no RSS cost). */
    size_t len = sizeof(struct fk_block) + size;
    struct fk_block *b;
    if (len <= (1u << 20)) {
        b = malloc(len);
        if (!b) b = MAP_FAILED;
    } else {
        b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
    }
    if (b == MAP_FAILED) {
        lk();
        S->mem_used -= size;
        me->mem_used -= size;
        ulk();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    b->magic = BLOCK_MAGIC;
    b->size = size;
    b->map_len = len;
    *out = b + 1;
    return CUDA_SUCCESS;
}

static CUresult fk_free(void *p) {
    if (!p) return CUDA_SUCCESS;
    struct fk_block *b = (struct fk_block *)p - 1;
    if (b->magic != BLOCK_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    struct fk_part *me = fk_me();
    lk();
    S->mem_used -= b->size < S->mem_used ? b->size : S->mem_used;
    me->mem_used -= b->size < me->mem_used ? b->size : me->mem_used;
    ulk();
    b->magic = 0;
    if (b->map_len <= (1u << 20)) free(b);
    else munmap(b, b->map_len);
    return CUDA_SUCCESS;
}

static size_t format_bytes(unsigned f) {
    switch (f) {
    case 0x01: case 0x08: return 1;
    case 0x02: case 0x09: case 0x10: return 2;
    case 0x03: case 0x0a: case 0x20: return 4;
    default: return 16;
    }
}
static size_t dim(size_t v) { return v ? v : 1; }

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    void *v;
    CUresult r = fk_alloc(n, &v);
    if (r == CUDA_SUCCESS) *p = (CUdeviceptr)(uintptr_t)v;
    return r;
}
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h,
                                   unsigned elem) {
    (void)elem;
    if (!p || !pitch) return CUDA_ERROR_INVALID_VALUE;
    size_t pw = (w + 511) & ~(size_t)511;
    CUresult r = cuMemAlloc_v2(p, pw * dim(h));
    if (r == CUDA_SUCCESS) *pitch = pw;
    return r;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
    (void)flags;
    return cuMemAlloc_v2(p, n);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
    (void)s;
    return cuMemAlloc_v2(p, n);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) {
    return cuMemAllocAsync(p, n, s);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)pool;
    (void)s;
    return cuMemAlloc_v2(p, n);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool,
                                             CUstream s) {
    return cuMemAllocFromPoolAsync(p, n, pool, s);
}
/* A pretend allocation entry point of a future driver: the interposer must refuse
 * allocation entry points it does not know. */
EXPORT CUresult cuMemAllocFuture(CUdeviceptr *p, size_t n) { return cuMemAlloc_v2(p, n); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return fk_free((void *)(uintptr_t)p); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    (void)s;
    return cuMemFree_v2(p);
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }
EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    if (!a || !d) return CUDA_ERROR_INVALID_VALUE;
    return fk_alloc(d->Width * dim(d->Height) * dim(d->NumChannels) * format_bytes(d->Format), a);
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    if (!a || !d) return CUDA_ERROR_INVALID_VALUE;
    return fk_alloc(d->Width * dim(d->Height) * dim(d->Depth) * dim(d->NumChannels) *
                        format_bytes(d->Format),
                    a);
}
EXPORT CUresult cuArrayDestroy(CUarray a) { return fk_free(a); }
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                       unsigned levels) {
    if (!a || !d) return CUDA_ERROR_INVALID_VALUE;
    size_t w = d->Width, h = d->Height, z = d->Depth, total = 0;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        total += dim(w) * dim(h) * dim(z) * dim(d->NumChannels) * format_bytes(d->Format);
        w /= 2;
        h /= 2;
        z /= 2;
    }
    return fk_alloc(total, a);
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return fk_free(a); }
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const void *prop,
                            unsigned long long flags) {
    (void)prop;
    (void)flags;
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    void *v;
    CUresult r = fk_alloc(n, &v);
    if (r == CUDA_SUCCESS) *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return r;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return fk_free((void *)(uintptr_t)h); }
EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total) {
    fk_state();
    lk();
    reap_dead_locked();
    if (free_b) *free_b = S->mem_total - S->mem_used;
    if (total) *total = S->mem_total;
    ulk();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    (void)dev;
    fk_state();
    if (bytes) *bytes = S->mem_total;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                       size_t n, void *params) {
    (void)g; (void)deps; (void)n; (void)params;
    if (node) *node = (CUgraphNode)1;
    return CUDA_SUCCESS;
}

/* Legacy 32-bit entry points (CUDA < 3.2). The interposer refuses them. */
EXPORT CUresult cuMemAlloc(unsigned *p, unsigned n) {
    CUdeviceptr d;
    CUresult r = cuMemAlloc_v2(&d, n);
    if (r == CUDA_SUCCESS && p) *p = (unsigned)d;
    return r;
}
EXPORT CUresult cuMemAllocPitch(unsigned *p, unsigned *pitch, unsigned w, unsigned h, unsigned e) {
    (void)p; (void)pitch; (void)w; (void)h; (void)e;
    return CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemFree(unsigned p) { (void)p; return CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuMemGetInfo(unsigned *f, unsigned *t) {
    if (f) *f = 0;
    if (t) *t = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuArrayCreate(CUarray *a, const void *d) { (void)a; (void)d; return CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuArray3DCreate(CUarray *a, const void *d) { (void)a; (void)d; return CUDA_ERROR_INVALID_VALUE; }
EXPORT CUresult cuDeviceTotalMem(unsigned *b, CUdevice d) { (void)d; if (b) *b = 0; return CUDA_SUCCESS; }

/* ---------------------------------------------------------------- device, context */

EXPORT CUresult cuInit(unsigned flags) {
    (void)flags;
    fk_me();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = (int)env_u64("FAKECUDA_DRIVER_VERSION", 12040);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetCount(int *n) {
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = (int)env_u64("FAKECUDA_DEVICES", 1);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    int n;
    cuDeviceGetCount(&n);
    if (!d || ordinal < 0 || ordinal >= n) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice d) {
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    memset(uuid, 0, 16);
    uuid[15] = (unsigned char)d;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid_v2(unsigned char *uuid, CUdevice d) { return cuDeviceGetUuid(uuid, d); }
EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned flags, CUdevice d) {
    (void)flags;
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    cur_dev = d;
    *c = (CUcontext)(uintptr_t)(d + 1);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    *c = (CUcontext)(uintptr_t)(d + 1);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    if (c) cur_dev = (CUdevice)((uintptr_t)c - 1);
    return CUDA_SUCCESS;
}
#ifndef FAKECUDA_OMIT_CTX_GET_DEVICE
EXPORT CUresult cuCtxGetDevice(CUdevice *d) {
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *d = cur_dev;
    return CUDA_SUCCESS;
}
#endif
EXPORT CUresult cuGetErrorString(CUresult r, const char **s) {
    if (s) *s = r == CUDA_SUCCESS ? "no error" : "fake error";
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- kernels */

struct fk_func { uint64_t magic; uint64_t ns; };
#define FUNC_MAGIC 0x66756e6346414b45ULL
struct fk_graph { uint64_t magic; uint64_t ns; };
#define GRAPH_MAGIC 0x677261706846414bULL

EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    (void)image;
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    *m = (CUmodule)1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    (void)m;
    if (!f || !name) return CUDA_ERROR_INVALID_VALUE;
    const char *us = strrchr(name, '_');
    struct fk_func *fn = malloc(sizeof *fn);
    if (!fn) return CUDA_ERROR_OUT_OF_MEMORY;
    fn->magic = FUNC_MAGIC;
    fn->ns = us ? strtoull(us + 1, NULL, 10) : 0;
    *f = fn;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned flags) {
    (void)flags;
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = (CUstream)2;
    return CUDA_SUCCESS;
}

/* Queues a kernel of `ns` on the serial device; blocks while this process has
 * FK_QUEUE kernels not finished (a real launch queue is finite too). */
static CUresult fk_run(uint64_t ns) {
    struct fk_part *me = fk_me();
    for (;;) {
        lk();
        uint32_t pending = 0;
        uint64_t oldest = UINT64_MAX;
        for (uint32_t k = 0; k < me->ring_len; k++) {
            uint32_t i = (me->ring_head + FK_RING - 1 - k) % FK_RING;
            if (me->ring_e[i] > S->now) {
                pending++;
                if (me->ring_e[i] < oldest) oldest = me->ring_e[i];
            }
        }
        if (pending < FK_QUEUE) break;
        ulk();
        fk_block_until(oldest);
    }
    uint64_t start = S->busy_until > S->now ? S->busy_until : S->now;
    uint64_t end = start + ns;
    S->busy_until = end;
    me->ring_s[me->ring_head] = start;
    me->ring_e[me->ring_head] = end;
    me->ring_head = (me->ring_head + 1) % FK_RING;
    if (me->ring_len < FK_RING) me->ring_len++;
    me->last_end = end;
    me->busy_total += ns;
    ulk();
    return CUDA_SUCCESS;
}

static CUresult fk_launch_f(CUfunction f) {
    struct fk_func *fn = f;
    if (!fn || fn->magic != FUNC_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    return fk_run(fn->ns);
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shmem, CUstream s,
                               void **params, void **extra) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s;
    (void)params; (void)extra;
    return fk_launch_f(f);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                    unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                    CUstream s, void **params, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
}
EXPORT CUresult cuLaunchKernelEx(const void *config, CUfunction f, void **params, void **extra) {
    (void)config; (void)params; (void)extra;
    return fk_launch_f(f);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const void *config, CUfunction f, void **params,
                                      void **extra) {
    return cuLaunchKernelEx(config, f, params, extra);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                          CUstream s, void **params) {
    (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s;
    (void)params;
    return fk_launch_f(f);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                               unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                               unsigned shmem, CUstream s, void **params) {
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params);
}
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(void *params, unsigned n, unsigned flags) {
    (void)params; (void)n; (void)flags;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuLaunch(CUfunction f) { return fk_launch_f(f); }
EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h) { (void)w; (void)h; return fk_launch_f(f); }
EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
    (void)w; (void)h; (void)s;
    return fk_launch_f(f);
}

EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned flags) {
    (void)flags;
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    struct fk_graph *gr = malloc(sizeof *gr);
    if (!gr) return CUDA_ERROR_OUT_OF_MEMORY;
    gr->magic = GRAPH_MAGIC;
    gr->ns = 0;
    *g = gr;
    return CUDA_SUCCESS;
}
/* CUDA_KERNEL_NODE_PARAMS starts with the CUfunction; the fake reads only that. */
EXPORT CUresult cuGraphAddKernelNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                     size_t n, const void *params) {
    (void)deps; (void)n;
    struct fk_graph *gr = g;
    if (!gr || gr->magic != GRAPH_MAGIC || !params) return CUDA_ERROR_INVALID_VALUE;
    struct fk_func *fn = *(CUfunction const *)params;
    if (!fn || fn->magic != FUNC_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    gr->ns += fn->ns;
    if (node) *node = (CUgraphNode)1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                        size_t n, const void *params) {
    return cuGraphAddKernelNode(node, g, deps, n, params);
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    (void)flags;
    struct fk_graph *gr = g;
    if (!e || !gr || gr->magic != GRAPH_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    struct fk_graph *x = malloc(sizeof *x);
    if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
    *x = *gr;
    *e = x;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    (void)s;
    struct fk_graph *x = e;
    if (!x || x->magic != GRAPH_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    return fk_run(x->ns);
}
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return cuGraphLaunch(e, s); }

EXPORT CUresult cuStreamSynchronize(CUstream s) {
    (void)s;
    struct fk_part *me = fk_me();
    fk_block_until(me->last_end);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
EXPORT CUresult cuCtxSynchronize(void) { return cuStreamSynchronize(NULL); }
EXPORT CUresult cuStreamQuery(CUstream s) {
    (void)s;
    struct fk_part *me = fk_me();
    lk();
    int busy = me->last_end > S->now;
    ulk();
    return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- cuGetProcAddress */

struct fk_sym { const char *name; void *fn; };
#define SYM(n) {#n, (void *)n}
static const struct fk_sym SYMS[] = {
    SYM(cuInit), SYM(cuDriverGetVersion), SYM(cuDeviceGetCount), SYM(cuDeviceGet),
    SYM(cuDeviceGetUuid), SYM(cuDeviceGetUuid_v2), SYM(cuCtxCreate_v2),
    SYM(cuDevicePrimaryCtxRetain), SYM(cuCtxSetCurrent),
#ifndef FAKECUDA_OMIT_CTX_GET_DEVICE
    SYM(cuCtxGetDevice),
#endif
    SYM(cuGetErrorString), SYM(cuMemAlloc_v2), SYM(cuMemAllocPitch_v2), SYM(cuMemAllocManaged),
    SYM(cuMemAllocAsync), SYM(cuMemAllocAsync_ptsz), SYM(cuMemAllocFromPoolAsync),
    SYM(cuMemAllocFromPoolAsync_ptsz), SYM(cuMemAllocFuture), SYM(cuMemFree_v2),
    SYM(cuMemFreeAsync), SYM(cuMemFreeAsync_ptsz), SYM(cuArrayCreate_v2), SYM(cuArray3DCreate_v2),
    SYM(cuArrayDestroy), SYM(cuMipmappedArrayCreate), SYM(cuMipmappedArrayDestroy),
    SYM(cuMemCreate), SYM(cuMemRelease), SYM(cuMemGetInfo_v2), SYM(cuDeviceTotalMem_v2),
    SYM(cuGraphAddMemAllocNode), SYM(cuMemAlloc), SYM(cuMemAllocPitch), SYM(cuMemFree),
    SYM(cuMemGetInfo), SYM(cuArrayCreate), SYM(cuArray3DCreate), SYM(cuDeviceTotalMem),
    SYM(cuModuleLoadData), SYM(cuModuleGetFunction), SYM(cuStreamCreate), SYM(cuLaunchKernel),
    SYM(cuLaunchKernel_ptsz), SYM(cuLaunchKernelEx), SYM(cuLaunchKernelEx_ptsz),
    SYM(cuLaunchCooperativeKernel), SYM(cuLaunchCooperativeKernel_ptsz),
    SYM(cuLaunchCooperativeKernelMultiDevice), SYM(cuLaunch), SYM(cuLaunchGrid),
    SYM(cuLaunchGridAsync), SYM(cuGraphCreate), SYM(cuGraphAddKernelNode),
    SYM(cuGraphAddKernelNode_v2), SYM(cuGraphInstantiateWithFlags), SYM(cuGraphLaunch),
    SYM(cuGraphLaunch_ptsz), SYM(cuStreamSynchronize), SYM(cuStreamSynchronize_ptsz),
    SYM(cuCtxSynchronize), SYM(cuStreamQuery),
};
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                 unsigned long long flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    unsigned long long flags, int *status);

/* A different entry point for the same function, as a real driver may hand out. */
static CUresult tramp_cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return cuMemAlloc_v2(p, n); }

static void *fk_find(const char *name) {
    if (!strcmp(name, "cuGetProcAddress")) return (void *)cuGetProcAddress;
    if (!strcmp(name, "cuGetProcAddress_v2")) return (void *)cuGetProcAddress_v2;
    for (size_t i = 0; i < sizeof SYMS / sizeof SYMS[0]; i++)
        if (!strcmp(SYMS[i].name, name)) return SYMS[i].fn;
    return NULL;
}

/* The versioned variant a real driver picks: `_ptsz` under per-thread default
 * streams, `_v2` from CUDA 3.2 (cuGetProcAddress_v2 from 12.0), else the base. */
static void *fk_resolve(const char *symbol, int ver, unsigned long long flags) {
    char buf[128];
    void *f;
    if (getenv("FAKECUDA_GPA_TRAMPOLINE") && !strcmp(symbol, "cuMemAlloc") && ver >= 3020)
        return (void *)tramp_cuMemAlloc_v2;
    if (!strcmp(symbol, "cuGetProcAddress"))
        return ver >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    if (flags & 2) {
        snprintf(buf, sizeof buf, "%s_ptsz", symbol);
        if ((f = fk_find(buf))) return f;
    }
    if (ver >= 3020) {
        snprintf(buf, sizeof buf, "%s_v2", symbol);
        if ((f = fk_find(buf))) return f;
    }
    return fk_find(symbol);
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                 unsigned long long flags) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = fk_resolve(symbol, cudaVersion, flags);
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    unsigned long long flags, int *status) {
    CUresult r = cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (status) *status = r == CUDA_SUCCESS ? 0 : 1;
    return r;
}

/* ---------------------------------------------------------------- hooks */

EXPORT unsigned long long tesseraFakeClockNs(void) {
    fk_state();
    return __atomic_load_n(&S->now, __ATOMIC_SEQ_CST);
}
EXPORT void tesseraFakeSleepUntilNs(unsigned long long t) { fk_block_until(t); }

EXPORT unsigned long long fakecudaClockNs(void) { return tesseraFakeClockNs(); }
EXPORT void fakecudaSleepUntilNs(unsigned long long t) { fk_block_until(t); }
/* Points this process at another state file (the harness, between scenarios). */
EXPORT int fakecudaAttach(const char *path) {
    fk_leave();
    pthread_mutex_lock(&attach_mu);
    struct fk_shm *old = S;
    S = map_state(path);
    pthread_mutex_unlock(&attach_mu);
    if (old) munmap(old, sizeof *old);
    return S ? 0 : -1;
}
EXPORT void fakecudaParticipate(void) { fk_me(); }
EXPORT void fakecudaLeave(void) { fk_leave(); }
EXPORT unsigned fakecudaParticipants(void) {
    fk_state();
    lk();
    reap_dead_locked();
    unsigned n = 0;
    for (int i = 0; i < FK_MAXP; i++) n += S->parts[i].pid != 0;
    ulk();
    return n;
}
EXPORT unsigned long long fakecudaBusyNs(int pid) {
    fk_state();
    lk();
    unsigned long long b = 0;
    for (int i = 0; i < FK_MAXP; i++)
        if (S->parts[i].pid == pid) b = S->parts[i].busy_total;
    ulk();
    return b;
}
/* Device time of the processes of pid namespace `ns` (a sandbox) still there. */
EXPORT unsigned long long fakecudaBusyInPidNs(unsigned long long ns) {
    fk_state();
    lk();
    unsigned long long b = 0;
    for (int i = 0; i < FK_MAXP; i++)
        if (S->parts[i].pid && S->parts[i].ns == ns) b += S->parts[i].busy_total;
    ulk();
    return b;
}
EXPORT unsigned long long fakecudaMemUsed(void) {
    fk_state();
    lk();
    reap_dead_locked();
    unsigned long long u = S->mem_used;
    ulk();
    return u;
}
EXPORT unsigned long long fakecudaMemPeak(void) {
    fk_state();
    return __atomic_load_n(&S->mem_peak, __ATOMIC_SEQ_CST);
}

/* ---------------------------------------------------------------- NVML */

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
    unsigned pid;
    unsigned long long timeStamp;
    unsigned smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

EXPORT nvmlReturn_t nvmlInit_v2(void) { fk_state(); return 0; }
EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }
EXPORT nvmlReturn_t nvmlShutdown(void) { return 0; }
EXPORT const char *nvmlErrorString(nvmlReturn_t r) { return r ? "fake NVML error" : "success"; }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) {
    if (!n) return 2;
    *n = (unsigned)env_u64("FAKECUDA_DEVICES", 1);
    return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (!d || i >= env_u64("FAKECUDA_DEVICES", 1)) return 2;
    *d = (nvmlDevice_t)(uintptr_t)(i + 1);
    return 0;
}
/* One sample per process that ran in (lastSeen, now]: its SM utilisation over that
 * window, rounded to a whole percent as NVML reports it. */
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d,
                                                    nvmlProcessUtilizationSample_t *out,
                                                    unsigned *count, unsigned long long last_us) {
    (void)d;
    if (!count) return 2;
    fk_state();
    lk();
    uint64_t now = S->now, ws = last_us * 1000ULL;
    unsigned n = 0;
    if (now > ws) {
        uint64_t len = now - ws;
        for (int i = 0; i < FK_MAXP; i++) {
            struct fk_part *p = &S->parts[i];
            if (!p->pid) continue;
            uint64_t ov = 0;
            for (uint32_t k = 0; k < p->ring_len; k++) {
                uint64_t s = p->ring_s[k], e = p->ring_e[k];
                if (s < ws) s = ws;
                if (e > now) e = now;
                if (e > s) ov += e - s;
            }
            if (!ov) continue;
            if (out && n < *count) {
                out[n].pid = (unsigned)p->pid;
                out[n].timeStamp = now / 1000ULL;
                out[n].smUtil = (unsigned)((ov * 100 + len / 2) / len);
                out[n].memUtil = out[n].encUtil = out[n].decUtil = 0;
            }
            n++;
        }
    }
    ulk();
    if (!out) {
        *count = n;
        return n ? 7 /* NVML_ERROR_INSUFFICIENT_SIZE */ : 0;
    }
    if (n > *count) n = *count;
    *count = n;
    return 0;
}

/* Events. An event set remembers how many events it has seen; waiting returns
 * the next one injected after it was created (fakecudaInjectEvent). */
typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;
struct fk_evset { uint32_t seen; unsigned long long mask[8]; };

EXPORT nvmlReturn_t nvmlEventSetCreate(struct fk_evset **set) {
    if (!set) return 2;
    fk_state();
    struct fk_evset *e = calloc(1, sizeof *e);
    if (!e) return 999;
    e->seen = __atomic_load_n(&S->ev_count, __ATOMIC_SEQ_CST);
    *set = e;
    return 0;
}
EXPORT nvmlReturn_t nvmlEventSetFree(struct fk_evset *set) { free(set); return 0; }
EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *t) {
    (void)d;
    if (!t) return 2;
    *t = 1 | 2 | 8; /* single-bit ECC, double-bit ECC, critical Xid */
    return 0;
}
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types,
                                             struct fk_evset *set) {
    uintptr_t i = (uintptr_t)d - 1;
    if (!set || i >= 8) return 2;
    set->mask[i] |= types;
    return 0;
}
EXPORT nvmlReturn_t nvmlEventSetWait_v2(struct fk_evset *set, nvmlEventData_t *out, unsigned ms) {
    if (!set || !out) return 2;
    fk_state();
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        uint32_t n = __atomic_load_n(&S->ev_count, __ATOMIC_SEQ_CST);
        while (set->seen < n) {
            uint32_t k = set->seen++ % 64;
            uint32_t dev = S->ev[k].dev;
            if (dev < 8 && (set->mask[dev] & S->ev[k].type)) {
                out->device = (nvmlDevice_t)(uintptr_t)(dev + 1);
                out->eventType = S->ev[k].type;
                out->eventData = S->ev[k].data;
                out->gpuInstanceId = out->computeInstanceId = 0xffffffffu;
                return 0;
            }
        }
        struct timespec t;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 >= (long)ms)
            return 10; /* NVML_ERROR_TIMEOUT */
        usleep(1000);
    }
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned len) {
    if (!uuid || len < 41) return 2;
    snprintf(uuid, len, "GPU-fa4ec0de-0000-0000-0000-%012lu", (unsigned long)((uintptr_t)d - 1));
    return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned *i) {
    if (!i) return 2;
    *i = (unsigned)((uintptr_t)d - 1);
    return 0;
}
/* Test hook: an NVML event on device `dev` (type: 8 = Xid, data = the Xid). */
EXPORT void fakecudaInjectEvent(unsigned dev, unsigned long long type, unsigned long long data) {
    fk_state();
    lk();
    uint32_t k = S->ev_count % 64;
    S->ev[k].dev = dev;
    S->ev[k].type = type;
    S->ev[k].data = data;
    __atomic_add_fetch(&S->ev_count, 1, __ATOMIC_SEQ_CST);
    ulk();
}
