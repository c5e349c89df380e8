# The gpuplan image: estimator service, operator and scheduler extender (CPU only).
# Build: docker build -t ghcr.io/gpuplan/gpuplan:0.1.0 .   (not built in CI here: no Docker engine)
# Pinned by digest (the multi-arch index of python:3.11.14-slim-bookworm, as recorded in several
# public Dockerfiles; not resolved against Docker Hub here). `make image-check` reads this line:
# Debian bookworm, whose python3 is 3.11, stands in for it.
FROM python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d
# LightGBM's manylinux wheel links libgomp.so.1, which the slim image lacks.
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The UID has no passwd entry, so HOME is /, which it cannot write (nor can anyone with a read-only
# root filesystem): caches go to /tmp (an emptyDir in every chart pod), the performance database
# and model bundles to the /data volume (the chart mounts an emptyDir or uses PostgreSQL).
ENV XDG_CACHE_HOME=/tmp/.cache XDG_DATA_HOME=/data
WORKDIR /src
COPY pyproject.toml README.md ./
COPY estimator ./estimator
COPY operator ./operator
# The extras the image's three processes need: `gpuplan serve`, the operator and the extender,
# PostgreSQL for the performance database (estimator.database.urlSecret).
RUN pip install --no-compile ".[serve,operator,postgres]" && rm -rf /src \
    && mkdir -p /data && chown 65532:65532 /data
VOLUME ["/data"]
# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd; the same UID as the
# benchmark Jobs.
USER 65532:65532
ENTRYPOINT ["gpuplan"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
