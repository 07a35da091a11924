/* On SIGSEGV/SIGBUS: the fault address, the PC, the /proc/self/maps lines holding each, and a
   native backtrace, on stderr; then the signal goes on to the handlers the process installed
   (Python's faulthandler, Ray's), which still run. LD_PRELOAD it: see sitecustomize.py.
   It stays the handler the kernel calls first: sigaction() calls for these two signals are
   intercepted, and the handler they install is kept as the next one to call. (Installed only
   at start-up, it was replaced by Ray's and Python's, and saw the signal only as they re-raised
   it with tgkill: si_code -6, the address the PID.) */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <execinfo.h>
#include <ucontext.h>
#include <fcntl.h>
#include <dlfcn.h>

static void maps_for(unsigned long a, const char *what) {
  char buf[1 << 16]; int fd = open("/proc/self/maps", O_RDONLY); if (fd < 0) return;
  char line[512]; int n, li = 0, found = 0;
  while ((n = read(fd, buf, sizeof buf)) > 0) {
    for (int i = 0; i < n; i++) {
      if (buf[i] == '\n' || li == 511) { line[li] = 0; li = 0;
        unsigned long lo, hi; if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) {
          dprintf(2, "K3SEGV %s %#lx in: %s\n", what, a, line); found = 1; }
      } else line[li++] = buf[i];
    }
  }
  close(fd); if (!found) dprintf(2, "K3SEGV %s %#lx in no mapping\n", what, a);
}

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction;
static struct sigaction next_segv, next_bus;  /* what the process asked for: called after our report */
static volatile sig_atomic_t entries;
static int ours_installed;

static struct sigaction *next_for(int sig) { return sig == SIGSEGV ? &next_segv : sig == SIGBUS ? &next_bus : NULL; }

static void report(int sig, siginfo_t *si, ucontext_t *uc) {
  unsigned long pc = uc->uc_mcontext.gregs[REG_RIP];
  dprintf(2, "K3SEGV pid %d tid %d signal %d code %d addr %p pc %#lx\n", getpid(), gettid(), sig, si->si_code, si->si_addr, pc);
  maps_for((unsigned long)si->si_addr, "addr"); maps_for(pc, "pc");
  void *frames[64]; int n = backtrace(frames, 64); backtrace_symbols_fd(frames, n, 2);
  dprintf(2, "K3SEGV end\n");
}

static void handler(int sig, siginfo_t *si, void *uc) {
  if (entries++ == 0) report(sig, si, uc);  /* the first delivery is the fault itself */
  struct sigaction *next = next_for(sig);
  if (entries > 8 || next->sa_handler == SIG_DFL || next->sa_handler == SIG_IGN) {  /* the end of the chain */
    struct sigaction dfl; memset(&dfl, 0, sizeof dfl); dfl.sa_handler = SIG_DFL;
    real_sigaction(sig, &dfl, NULL); raise(sig); return;
  }
  if (next->sa_flags & SA_SIGINFO) next->sa_sigaction(sig, si, uc); else next->sa_handler(sig);
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  struct sigaction *next = next_for(sig);
  if (!ours_installed || next == NULL) return real_sigaction(sig, act, old);
  if (old) *old = *next;
  if (act) *next = *act;
  return 0;
}

__attribute__((constructor)) static void install(void) {
  real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_sigaction = handler; sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  real_sigaction(SIGSEGV, &sa, &next_segv); real_sigaction(SIGBUS, &sa, &next_bus);
  ours_installed = 1;
}
