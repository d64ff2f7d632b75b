# One image for every levers9 process; the command picks the service:
#   docker run levers9 service scheduler
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# runc runs user containers and criu dumps/restores them; only the worker uses them, but one image
# for all services keeps builds and rollouts simple.
RUN apt-get update \
 && apt-get install -y --no-install-recommends runc criu ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/levers9
COPY pyproject.toml README.md ./
COPY libs/ libs/
COPY services/ services/
COPY sdk/ sdk/
RUN pip install . && rm -rf build

ENV LEVERS9_HTTP_HOST=0.0.0.0 \
    LEVERS9_HTTP_PORT=8080 \
    LEVERS9_LOG_FORMAT=json

EXPOSE 8080

HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status == 200 else 1)"]

ENTRYPOINT ["levers9"]
CMD ["service", "gateway"]
