# The pod sandbox image (tagged registry.k8s.io/pause:3.10, containerd's sandbox_image): one
# static binary. The context holds `pause`, compiled on the host from operator/pause/pause.c:
#   gcc -static -Os -s -o pause operator/pause/pause.c && podman build -f operator/pause.Dockerfile .
FROM scratch
COPY pause /pause
# the upstream image's user: nobody's numeric id, no /etc/passwd needed
USER 65535:65535
ENTRYPOINT ["/pause"]
