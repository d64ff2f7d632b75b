# One image for every levers9 process; the command picks the service:
#   podman run levers9:local service scheduler
# Built by scripts/build_image.sh (buildah bud --pull=never --layers) on the local base images that
# scripts/base_image.sh makes (Debian 12 + python3.11 + the Debian tools below; no registry needed).
# With a registry at hand:
#   docker build --build-arg BASE=python:3.11-slim-bookworm --build-arg BUILD_BASE=python:3.11-bookworm .
ARG BASE=localhost/levers9-base:bookworm
ARG BUILD_BASE=localhost/levers9-base:bookworm-build

# ---- the dependencies, in a venv, where a compiler is at hand (pyfuse3 comes as sources) -------------
FROM ${BUILD_BASE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN set -e; missing=""; \
    for p in python3-venv gcc libc6-dev python3-dev pkg-config libfuse3-dev; do \
      dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; \
    done; \
    if [ -n "$missing" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $missing && rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3 -m venv /opt/venv
# from pyproject.toml alone: a change to the code reuses this layer
COPY pyproject.toml /tmp/levers9/
RUN python3 -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/levers9/pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt && rm -rf /tmp/requirements.txt /tmp/levers9

# ---- the image ----------------------------------------------------------------------------------------
FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# runc runs user containers and criu dumps/restores them, buildah/skopeo/umoci build and move images,
# docker-registry serves them; only the worker, the build pool and the registry use them, but one
# image for all keeps builds and rollouts simple. The local base has them all (nothing is fetched);
# another base gets the missing ones from apt.
RUN set -e; missing=""; \
    for p in ca-certificates runc criu iproute2 nftables iptables fuse3 procps \
             buildah skopeo umoci docker-registry; do \
      dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; \
    done; \
    if [ -n "$missing" ]; then \
      apt-get update && apt-get install -y --no-install-recommends $missing && rm -rf /var/lib/apt/lists/*; \
    fi

COPY --from=deps /opt/venv /opt/venv
WORKDIR /opt/levers9
COPY pyproject.toml setup.py README.md ./
COPY libs/ libs/
COPY services/ services/
COPY sdk/ sdk/
RUN pip install --no-deps . && rm -rf build *.egg-info

ENV LEVERS9_HTTP_HOST=0.0.0.0 \
    LEVERS9_HTTP_PORT=8080 \
    LEVERS9_LOG_FORMAT=json

EXPOSE 8080

HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]

ENTRYPOINT ["levers9"]
CMD ["service", "gateway"]
