/* The pod sandbox's pause process (containerd's sandbox_image): holds the pod's namespaces,
 * sleeps until SIGTERM/SIGINT, and, as PID 1 of a pod sharing its PID namespace, reaps the
 * zombies orphaned into it. Built with `gcc -static` so the image needs nothing else. */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) {
  /* exit status 0: the kubelet stops sandboxes with SIGTERM, that is no failure */
  (void)sig;
  _exit(0);
}

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("pause (kai-ray) 3.10");
    return 0;
  }
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP | SA_RESTART};
  if (sigaction(SIGTERM, &stop, NULL) < 0 || sigaction(SIGINT, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  if (getpid() != 1) fputs("pause: warning: not running as PID 1\n", stderr);
  for (;;) pause();
}
