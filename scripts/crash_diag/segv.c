/* On SIGSEGV/SIGBUS: the fault address, the PC, the /proc/self/maps lines holding each, and a
   native backtrace, on stderr; then the signal again, to whatever handled it before (Python's
   faulthandler and Ray's handler chain back to this one). LD_PRELOAD it: see sitecustomize.py. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <execinfo.h>
#include <ucontext.h>
#include <fcntl.h>

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

static void handler(int sig, siginfo_t *si, void *uc_) {
  ucontext_t *uc = uc_;
  unsigned long pc = uc->uc_mcontext.gregs[REG_RIP];
  dprintf(2, "K3SEGV pid %d tid %d signal %d code %d addr %p pc %#lx\n", getpid(), gettid(), sig, si->si_code, si->si_addr, pc);
  maps_for((unsigned long)si->si_addr, "addr"); maps_for(pc, "pc");
  void *frames[64]; int n = backtrace(frames, 64); backtrace_symbols_fd(frames, n, 2);
  dprintf(2, "K3SEGV end\n");
  signal(sig, SIG_DFL); raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_sigaction = handler; sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, NULL); sigaction(SIGBUS, &sa, NULL);
}
