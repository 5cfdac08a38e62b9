# The GPU reservation pod's image: `python3 -m kai_ray.reservation` (standard library + pynvml),
# as a non-root numeric user. `python3 -m kai_ray.testing.images build kai-ray-reservation`
# builds it FROM a local Debian bookworm + python3 base, offline. By hand, from the repository
# root, FROM any Debian-like Python image (the build needs no network):
#   mkdir -p ctx/wheels && pip wheel --no-deps -w ctx/wheels . \
#     && pip download -d ctx/wheels nvidia-ml-py==13.615.71 \
#     && echo nvidia-ml-py==13.615.71 > ctx/wheels/requirements.txt
#   podman build -f operator/reservation.Dockerfile --build-arg BASE_IMAGE=python:3.11-slim ctx
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
COPY wheels /tmp/wheels
# kai-ray without its dependencies: the reservation program imports none of them.
# PIP_BREAK_SYSTEM_PACKAGES: Debian's python3 refuses system-wide pip installs otherwise (PEP 668)
RUN export PIP_BREAK_SYSTEM_PACKAGES=1 \
    && python3 -m pip install -q --no-cache-dir --no-index --find-links /tmp/wheels \
       -r /tmp/wheels/requirements.txt \
    && python3 -m pip install -q --no-cache-dir --no-index --no-deps /tmp/wheels/kai_ray-*.whl \
    && rm -rf /tmp/wheels \
    && echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'nonroot:x:65532:' >> /etc/group
# the chart's podSecurityContext runs it as 65532 as well
USER 65532:65532
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
ENTRYPOINT ["python3", "-m", "kai_ray.reservation"]
