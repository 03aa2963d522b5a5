/*
 * A CUDA driver API program for Tessera's GPU-sharing tests: it runs the steps on
 * its command line and prints one line per step (`<step> ... rc=<CUresult>`).
 *
 *   mode d|h|p|p2|pt   how entry points are reached: d = the linked symbols,
 *                      h = dlopen("libcuda.so.1") + dlsym(handle), p = cuGetProcAddress,
 *                      p2 = cuGetProcAddress_v2, pt = cuGetProcAddress_v2 with
 *                      per-thread default streams (the _ptsz variants)
 *   init | version | info | totalmem | peak | busy
 *   alloc N | pitch W H | managed N | async N | pool N | array W H | array3d W H D
 *   mipmap W H LEVELS | vmm N | free I | freeall | legacy N
 *   launch KIND N NS   KIND = kernel|ex|coop|graph|legacy; N kernels of NS fake ns,
 *                      each followed by a stream synchronisation
 *   forever KIND NS    launch until killed
 *   sleep NS           fake-clock sleep
 *   gpa NAME VERSION FLAGS | dlsym NAME
 *   fork ... endfork   the child runs the steps in between, the parent waits
 *   exec ...           re-executes this program through /bin/sh with the rest
 *   hold               prints "holding" and waits for stdin to close
 *   crash              SIGKILLs itself
 *   event TYPE DATA    injects an NVML event on device 0 (fake driver; 8 = Xid)
 *   rtldnext | memnode dlsym(RTLD_NEXT) check; cuGraphAddMemAllocNode
 *
 * N accepts K/M/G suffixes (powers of 1024).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUarray, *CUgraph, *CUgraphExec,
    *CUgraphNode;
typedef struct { size_t Width, Height; unsigned Format, NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; unsigned Format, NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
typedef struct {
    unsigned type, requestedHandleTypes, locType;
    int locId;
    void *win32;
    unsigned char compression, rdma;
    unsigned short usage;
    unsigned char reserved[4];
} CUmemAllocationProp;
typedef struct { CUfunction func; unsigned rest[16]; } CUDA_KERNEL_NODE_PARAMS;
typedef struct {
    unsigned gx, gy, gz, bx, by, bz, shmem;
    CUstream stream;
    void *attrs;
    unsigned nattrs;
} CUlaunchConfig;

/* The linked entry points (mode d). */
CUresult cuInit(unsigned);
CUresult cuDriverGetVersion(int *);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, CUstream);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayCreate(void **, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
CUresult cuMipmappedArrayDestroy(void *);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuMemAlloc(unsigned *, unsigned);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, CUstream, void **);
CUresult cuLaunch(CUfunction);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphAddKernelNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                              const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

struct api {
    CUresult (*init)(unsigned);
    CUresult (*version)(int *);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*pool)(CUdeviceptr *, size_t, void *, CUstream);
    CUresult (*free)(CUdeviceptr);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUresult (*array)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*array3d)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*array_destroy)(CUarray);
    CUresult (*mipmap)(void **, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
    CUresult (*mipmap_destroy)(void *);
    CUresult (*vmm)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                    unsigned long long);
    CUresult (*vmm_release)(CUmemGenericAllocationHandle);
    CUresult (*info)(size_t *, size_t *);
    CUresult (*totalmem)(size_t *, CUdevice);
    CUresult (*legacy_alloc)(unsigned *, unsigned);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUstream, void **, void **);
    CUresult (*launch_ex)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*coop)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     unsigned, CUstream, void **);
    CUresult (*legacy_launch)(CUfunction);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
};

static struct api A;
static void *drv;
static char *self_path;

static void use_direct(void) {
    A = (struct api){cuInit, cuDriverGetVersion, cuMemAlloc_v2, cuMemAllocPitch_v2,
                     cuMemAllocManaged, cuMemAllocAsync, cuMemAllocFromPoolAsync, cuMemFree_v2,
                     cuMemFreeAsync, cuArrayCreate_v2, cuArray3DCreate_v2, cuArrayDestroy,
                     cuMipmappedArrayCreate, cuMipmappedArrayDestroy, cuMemCreate, cuMemRelease,
                     cuMemGetInfo_v2, cuDeviceTotalMem_v2, cuMemAlloc, cuLaunchKernel,
                     cuLaunchKernelEx, cuLaunchCooperativeKernel, cuLaunch, cuGraphLaunch};
}

static void *driver(void) {
    if (!drv) drv = dlopen("libcuda.so.1", RTLD_NOW);
    if (!drv) {
        fprintf(stderr, "probe: dlopen libcuda.so.1: %s\n", dlerror());
        exit(3);
    }
    return drv;
}

#define RESOLVE(field, name) *(void **)&A.field = look(name)

static void *(*look)(const char *);
static void *by_dlsym(const char *n) { return dlsym(driver(), n); }

static int gpa_kind; /* 1 = v1, 2 = v2, 3 = v2 per-thread */
static void *by_gpa(const char *n) {
    /* cuGetProcAddress takes the base name; strip a _v2 suffix. */
    char base[128];
    snprintf(base, sizeof base, "%s", n);
    char *v = strstr(base, "_v2");
    if (v && v[3] == 0) *v = 0;
    void *fn = NULL;
    CUresult r;
    if (gpa_kind == 1) {
        CUresult (*gpa)(const char *, void **, int, unsigned long long) = dlsym(driver(), "cuGetProcAddress");
        if (!gpa) return NULL;
        r = gpa(base, &fn, 12040, 0);
    } else {
        CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) =
            dlsym(driver(), "cuGetProcAddress_v2");
        int st = -1;
        if (!gpa) return NULL;
        r = gpa(base, &fn, 12040, gpa_kind == 3 ? 2 : 0, &st);
    }
    return r == 0 ? fn : NULL;
}

static void use_lookup(void) {
    RESOLVE(init, "cuInit");
    RESOLVE(version, "cuDriverGetVersion");
    RESOLVE(alloc, "cuMemAlloc_v2");
    RESOLVE(pitch, "cuMemAllocPitch_v2");
    RESOLVE(managed, "cuMemAllocManaged");
    RESOLVE(async, "cuMemAllocAsync");
    RESOLVE(pool, "cuMemAllocFromPoolAsync");
    RESOLVE(free, "cuMemFree_v2");
    RESOLVE(free_async, "cuMemFreeAsync");
    RESOLVE(array, "cuArrayCreate_v2");
    RESOLVE(array3d, "cuArray3DCreate_v2");
    RESOLVE(array_destroy, "cuArrayDestroy");
    RESOLVE(mipmap, "cuMipmappedArrayCreate");
    RESOLVE(mipmap_destroy, "cuMipmappedArrayDestroy");
    RESOLVE(vmm, "cuMemCreate");
    RESOLVE(vmm_release, "cuMemRelease");
    RESOLVE(info, "cuMemGetInfo_v2");
    RESOLVE(totalmem, "cuDeviceTotalMem_v2");
    RESOLVE(legacy_alloc, look == by_dlsym ? "cuMemAlloc" : "cuMemAllocLegacy");
    RESOLVE(launch, "cuLaunchKernel");
    RESOLVE(launch_ex, "cuLaunchKernelEx");
    RESOLVE(coop, "cuLaunchCooperativeKernel");
    RESOLVE(legacy_launch, "cuLaunch");
    RESOLVE(graph_launch, "cuGraphLaunch");
}

static unsigned long long num(const char *s) {
    char *e;
    unsigned long long v = strtoull(s, &e, 10);
    switch (*e) {
    case 'K': case 'k': v <<= 10; break;
    case 'M': case 'm': v <<= 20; break;
    case 'G': case 'g': v <<= 30; break;
    }
    return v;
}

enum kind { K_PTR, K_ASYNC, K_ARRAY, K_MIPMAP, K_VMM };
struct allocation { enum kind kind; unsigned long long h; };
static struct allocation allocs[4096];
static int nallocs;

static void keep(enum kind k, unsigned long long h) {
    if (nallocs < 4096) allocs[nallocs++] = (struct allocation){k, h};
}

static CUresult release(struct allocation *a) {
    CUresult r = 0;
    switch (a->kind) {
    case K_PTR: r = A.free(a->h); break;
    case K_ASYNC: r = A.free_async(a->h, NULL); break;
    case K_ARRAY: r = A.array_destroy((CUarray)(uintptr_t)a->h); break;
    case K_MIPMAP: r = A.mipmap_destroy((void *)(uintptr_t)a->h); break;
    case K_VMM: r = A.vmm_release(a->h); break;
    }
    a->h = 0;
    return r;
}

static CUresult launch_one(const char *kind, CUfunction f, CUgraphExec g) {
    if (!strcmp(kind, "kernel")) return A.launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    if (!strcmp(kind, "ex")) {
        CUlaunchConfig c = {1, 1, 1, 1, 1, 1, 0, NULL, NULL, 0};
        return A.launch_ex(&c, f, NULL, NULL);
    }
    if (!strcmp(kind, "coop")) return A.coop(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
    if (!strcmp(kind, "legacy")) return A.legacy_launch(f);
    if (!strcmp(kind, "graph")) return A.graph_launch(g, NULL);
    return 1;
}

static CUresult prepare_kernel(unsigned long long ns, CUfunction *f, CUgraphExec *g) {
    CUmodule m;
    char name[64];
    snprintf(name, sizeof name, "spin_%llu", ns);
    CUresult r = cuModuleLoadData(&m, "fake");
    if (!r) r = cuModuleGetFunction(f, m, name);
    CUgraph gr;
    if (!r) r = cuGraphCreate(&gr, 0);
    CUDA_KERNEL_NODE_PARAMS p = {*f, {0}};
    CUgraphNode node;
    if (!r) r = cuGraphAddKernelNode(&node, gr, NULL, 0, &p);
    if (!r) r = cuGraphInstantiateWithFlags(g, gr, 0);
    return r;
}

static unsigned long long hook_u64(const char *name) {
    unsigned long long (*f)(void) = dlsym(driver(), name);
    return f ? f() : 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    self_path = argv[0];
    use_direct();
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        CUresult r = 0;
        if (!strcmp(s, "mode")) {
            const char *m = argv[++i];
            if (!strcmp(m, "d")) {
                use_direct();
                look = NULL;
            }
            else {
                look = !strcmp(m, "h") ? by_dlsym : by_gpa;
                gpa_kind = !strcmp(m, "p") ? 1 : !strcmp(m, "p2") ? 2 : 3;
                use_lookup();
            }
            printf("mode %s\n", m);
        } else if (!strcmp(s, "init")) {
            if (!A.init) { printf("init rc=unresolved\n"); continue; }
            r = A.init(0);
            CUdevice d;
            CUcontext c;
            if (!r) r = cuDeviceGet(&d, 0);
            if (!r) r = cuCtxCreate_v2(&c, 0, d);
            printf("init rc=%d\n", r);
        } else if (!strcmp(s, "version")) {
            int v = 0;
            r = A.version(&v);
            printf("version %d rc=%d\n", v, r);
        } else if (!strcmp(s, "info")) {
            size_t f = 0, t = 0;
            r = A.info(&f, &t);
            printf("info free=%zu total=%zu rc=%d\n", f, t, r);
        } else if (!strcmp(s, "totalmem")) {
            size_t b = 0;
            r = A.totalmem(&b, 0);
            printf("totalmem %zu rc=%d\n", b, r);
        } else if (!strcmp(s, "peak")) {
            printf("peak %llu used=%llu\n", hook_u64("fakecudaMemPeak"), hook_u64("fakecudaMemUsed"));
        } else if (!strcmp(s, "busy")) {
            unsigned long long (*f)(int) = dlsym(driver(), "fakecudaBusyNs");
            printf("busy %llu\n", f ? f(getpid()) : 0);
        } else if (!strcmp(s, "alloc") || !strcmp(s, "managed") || !strcmp(s, "async") ||
                   !strcmp(s, "pool") || !strcmp(s, "vmm")) {
            unsigned long long n = num(argv[++i]);
            CUdeviceptr p = 0;
            enum kind k = K_PTR;
            if (!strcmp(s, "alloc")) r = A.alloc(&p, n);
            else if (!strcmp(s, "managed")) r = A.managed(&p, n, 1);
            else if (!strcmp(s, "async")) { r = A.async(&p, n, NULL); k = K_ASYNC; }
            else if (!strcmp(s, "pool")) { r = A.pool(&p, n, NULL, NULL); k = K_ASYNC; }
            else {
                CUmemAllocationProp prop = {1, 0, 1, 0, NULL, 0, 0, 0, {0}};
                CUmemGenericAllocationHandle h = 0;
                r = A.vmm(&h, n, &prop, 0);
                p = h;
                k = K_VMM;
            }
            if (!r) keep(k, p);
            printf("%s %llu rc=%d\n", s, n, r);
        } else if (!strcmp(s, "legacy")) {
            unsigned p = 0;
            unsigned long long n = num(argv[++i]);
            r = A.legacy_alloc ? A.legacy_alloc(&p, (unsigned)n) : -1;
            printf("legacy %llu rc=%d\n", n, r);
        } else if (!strcmp(s, "pitch")) {
            unsigned long long w = num(argv[++i]), h = num(argv[++i]);
            CUdeviceptr p = 0;
            size_t pitch = 0;
            r = A.pitch(&p, &pitch, w, h, 4);
            if (!r) keep(K_PTR, p);
            printf("pitch %llu %llu pitch=%zu rc=%d\n", w, h, pitch, r);
        } else if (!strcmp(s, "array") || !strcmp(s, "array3d") || !strcmp(s, "mipmap")) {
            CUarray a = NULL;
            if (!strcmp(s, "array")) {
                CUDA_ARRAY_DESCRIPTOR d = {num(argv[i + 1]), num(argv[i + 2]), 0x20, 1};
                i += 2;
                r = A.array(&a, &d);
                if (!r) keep(K_ARRAY, (uintptr_t)a);
            } else {
                CUDA_ARRAY3D_DESCRIPTOR d = {num(argv[i + 1]), num(argv[i + 2]), 0, 0x20, 1, 0};
                if (!strcmp(s, "array3d")) {
                    d.Depth = num(argv[i + 3]);
                    i += 3;
                    r = A.array3d(&a, &d);
                    if (!r) keep(K_ARRAY, (uintptr_t)a);
                } else {
                    unsigned levels = (unsigned)num(argv[i + 3]);
                    i += 3;
                    void *m = NULL;
                    r = A.mipmap(&m, &d, levels);
                    if (!r) keep(K_MIPMAP, (uintptr_t)m);
                }
            }
            printf("%s rc=%d\n", s, r);
        } else if (!strcmp(s, "free")) {
            int k = (int)num(argv[++i]);
            r = k < nallocs ? release(&allocs[k]) : 1;
            printf("free %d rc=%d\n", k, r);
        } else if (!strcmp(s, "freeall")) {
            for (int k = 0; k < nallocs; k++)
                if (allocs[k].h) r |= release(&allocs[k]);
            printf("freeall rc=%d\n", r);
        } else if (!strcmp(s, "launch") || !strcmp(s, "forever")) {
            int forever = !strcmp(s, "forever");
            const char *kind = argv[++i];
            unsigned long long n = forever ? ~0ULL : num(argv[++i]);
            unsigned long long ns = num(argv[++i]);
            CUfunction f;
            CUgraphExec g;
            r = prepare_kernel(ns, &f, &g);
            unsigned long long done = 0;
            for (; !r && done < n; done++) {
                r = launch_one(kind, f, g);
                if (!r) r = cuStreamSynchronize(NULL);
            }
            printf("%s %s %llu rc=%d\n", s, kind, done, r);
        } else if (!strcmp(s, "sleep")) {
            unsigned long long ns = num(argv[++i]);
            void (*sl)(unsigned long long) = dlsym(driver(), "fakecudaSleepUntilNs");
            sl(hook_u64("fakecudaClockNs") + ns);
            printf("sleep %llu\n", ns);
        } else if (!strcmp(s, "gpa")) {
            const char *name = argv[++i];
            int ver = (int)num(argv[++i]);
            unsigned long long flags = num(argv[++i]);
            CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) =
                dlsym(driver(), "cuGetProcAddress_v2");
            void *fn = NULL;
            int st = -1;
            r = gpa(name, &fn, ver, flags, &st);
            printf("gpa %s rc=%d status=%d found=%d\n", name, r, st, fn != NULL);
        } else if (!strcmp(s, "dlsym")) {
            const char *name = argv[++i];
            printf("dlsym %s found=%d\n", name, dlsym(driver(), name) != NULL);
        } else if (!strcmp(s, "rtldnext")) {
            /* dlsym(RTLD_NEXT) is relative to its caller: from this program the
             * next dlsym is the first one after it (an interposer's, or glibc's). */
            void *next = dlsym(RTLD_NEXT, "dlsym");
            void *dflt = dlsym(RTLD_DEFAULT, "dlsym");
            printf("rtldnext same=%d\n", next == dflt && next != NULL);
        } else if (!strcmp(s, "memnode")) {
            CUresult (*f)(void **, void *, void *, size_t, void *) =
                look ? look("cuGraphAddMemAllocNode") : dlsym(driver(), "cuGraphAddMemAllocNode");
            void *node = NULL;
            r = f ? f(&node, NULL, NULL, 0, NULL) : -1;
            printf("memnode rc=%d\n", r);
        } else if (!strcmp(s, "event")) {
            unsigned long long type = num(argv[++i]), data = num(argv[++i]);
            void (*inj)(unsigned, unsigned long long, unsigned long long) =
                dlsym(driver(), "fakecudaInjectEvent");
            inj(0, type, data);
            printf("event %llu %llu\n", type, data);
        } else if (!strcmp(s, "fork")) {
            pid_t pid = fork();
            if (pid == 0) continue; /* the child runs the steps up to endfork */
            int depth = 1;
            while (++i < argc && depth) {
                if (!strcmp(argv[i], "fork")) depth++;
                if (!strcmp(argv[i], "endfork")) depth--;
            }
            i--;
            int status = 0;
            waitpid(pid, &status, 0);
            printf("joined %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
        } else if (!strcmp(s, "endfork")) {
            fflush(stdout);
            _exit(0);
        } else if (!strcmp(s, "exec")) {
            char **av = calloc((size_t)argc + 4, sizeof *av);
            int k = 0;
            av[k++] = "sh";
            av[k++] = "-c";
            av[k++] = "exec \"$0\" \"$@\"";
            av[k++] = self_path;
            for (int j = i + 1; j < argc; j++) av[k++] = argv[j];
            av[k] = NULL;
            printf("exec\n");
            execv("/bin/sh", av);
            perror("probe: exec /bin/sh");
            return 4;
        } else if (!strcmp(s, "hold")) {
            printf("holding\n");
            char buf[64];
            while (fread(buf, 1, sizeof buf, stdin) > 0) {}
            printf("released\n");
        } else if (!strcmp(s, "crash")) {
            fflush(stdout);
            raise(SIGKILL);
        } else {
            fprintf(stderr, "probe: unknown step %s\n", s);
            return 2;
        }
    }
    return 0;
}
