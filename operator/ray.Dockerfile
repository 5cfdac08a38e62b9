# A Ray image for RayClusters on kai-ray: ray[default] (pinned) and kai-ray-helper (kai_ray.ray
# alone, no dependencies), so Ray workers can `import kai_ray.ray` (GPU memory caps,
# docs/gpu-env.md). `python3 -m kai_ray.testing.images build kai-ray-ray` builds it FROM a
# local Debian bookworm + python3 base, offline. By hand, from the repository root, FROM any
# Debian-like Python 3.11 image (the build needs no network):
#   python3 -m kai_ray.testing.images helper-wheel -o ctx/wheels \
#     && pip wheel -w ctx/wheels "ray[default]==2.60.0" nvidia-ml-py==13.615.71 \
#     && printf 'ray[default]==2.60.0\nnvidia-ml-py==13.615.71\n' > ctx/wheels/requirements.txt
#   podman build -f operator/ray.Dockerfile --build-arg BASE_IMAGE=python:3.11-slim ctx
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
COPY wheels /tmp/wheels
# kai-ray-helper has no dependencies: kai_ray.ray imports only the standard library (and the
# frameworks, lazily), so none of the scheduler's land in the Ray image.
# PIP_BREAK_SYSTEM_PACKAGES: Debian's python3 refuses system-wide pip installs otherwise
# (PEP 668); system-wide, `ray` is on the PATH of KubeRay's `bash -lc`.
RUN export PIP_BREAK_SYSTEM_PACKAGES=1 \
    && python3 -m pip install -q --no-cache-dir --no-index --find-links /tmp/wheels \
       -r /tmp/wheels/requirements.txt \
    && python3 -m pip install -q --no-cache-dir --no-index /tmp/wheels/kai_ray_helper-*.whl \
    && rm -rf /tmp/wheels \
    && echo 'ray:x:1000:1000:ray:/home/ray:/bin/bash' >> /etc/passwd \
    && echo 'ray:x:1000:' >> /etc/group \
    && mkdir -p /home/ray && chown 1000:1000 /home/ray
# a non-root user, as in Ray's own images
USER 1000:1000
WORKDIR /home/ray
ENV HOME=/home/ray PYTHONUNBUFFERED=1
CMD ["python3"]
