# busybox for test pods (sh, wget, nslookup, httpd, sleep, ...): Debian's busybox-static, copied
# from the host into the context as `busybox`:
#   cp /bin/busybox . && podman build -f operator/busybox.Dockerfile .
FROM scratch
COPY busybox /bin/busybox
# one symlink per applet; /tmp for programs that want one
RUN ["/bin/busybox", "sh", "-c", "/bin/busybox --install -s /bin && mkdir -m 1777 /tmp"]
ENV PATH=/bin
CMD ["sh"]
