/* An AVX-512 CPU shown to one process as an AVX2 machine (bench/backend_speed.py --avx2-only).

   ONNX Runtime, numpy and OpenBLAS choose their kernels from the CPUID instruction, and no setting makes
   ONNX Runtime take its AVX2 kernels on a CPU with AVX-512. Loaded with LD_PRELOAD, this library asks
   Linux to fault every CPUID the process runs (arch_prctl ARCH_SET_CPUID, on CPUs with CPUID faulting),
   answers each fault with the real CPUID's result less the AVX-512, AMX and AVX-VNNI bits, and steps past
   the instruction. Everything loaded after it sees an AVX2 machine; glibc's own string functions, chosen
   by the loader before any library's constructor runs, keep their AVX-512 forms.

   The setting is per thread, inherited by threads started later and dropped by execve, so compilers the
   process runs see the real CPU; LD_PRELOAD is taken out of the environment for the same reason. On
   success the constructor sets SATURATE_AVX2_ONLY=masked, which the bench checks. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#define ARCH_SET_CPUID 0x1012

/* CPUID leaf 7 subleaf 0: EBX avx512 f dq ifma pf er cd bw vl; ECX avx512 vbmi vbmi2 vnni bitalg
   vpopcntdq; EDX avx512 4vnniw 4fmaps vp2intersect, amx-bf16, avx512-fp16, amx-tile, amx-int8.
   Subleaf 1: EAX avx-vnni, avx512-bf16, avx-ifma (none on the AVX2 machines this stands in for). */
#define BIT(n) (1u << (n))
static const unsigned leaf7_ebx = BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31);
static const unsigned leaf7_ecx = BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14);
static const unsigned leaf7_edx = BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25);
static const unsigned leaf7_1_eax = BIT(4) | BIT(5) | BIT(23);

static void answer_cpuid(int sig, siginfo_t *info, void *context)
{
    (void)sig;
    (void)info;
    greg_t *reg = ((ucontext_t *)context)->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)reg[REG_RIP];
    if (ip[0] != 0x0f || ip[1] != 0xa2) {
        /* A fault of the program's own: the instruction runs again without this handler and the
           process ends as it would have. */
        signal(SIGSEGV, SIG_DFL);
        return;
    }
    unsigned leaf = (unsigned)reg[REG_RAX], subleaf = (unsigned)reg[REG_RCX], a, b, c, d;
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
    __cpuid_count(leaf, subleaf, a, b, c, d);
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
    if (leaf == 7 && subleaf == 0) {
        b &= ~leaf7_ebx;
        c &= ~leaf7_ecx;
        d &= ~leaf7_edx;
    } else if (leaf == 7 && subleaf == 1) {
        a &= ~leaf7_1_eax;
    }
    reg[REG_RAX] = a;
    reg[REG_RBX] = b;
    reg[REG_RCX] = c;
    reg[REG_RDX] = d;
    reg[REG_RIP] += 2;
}

__attribute__((constructor)) static void hide_avx512(void)
{
    unsetenv("LD_PRELOAD");
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = answer_cpuid;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGSEGV, &action, NULL) != 0)
        return;
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) {
        signal(SIGSEGV, SIG_DFL);
        return;
    }
    setenv("SATURATE_AVX2_ONLY", "masked", 1);
}
