# The gpuplan image: estimator service, operator and scheduler extender (CPU only).
# Build: docker build -t ghcr.io/gpuplan/gpuplan:0.1.0 .   (not built in CI here: no Docker engine)
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY estimator ./estimator
COPY operator ./operator
# The extras the image's three processes need: `gpuplan serve`, the operator and the extender,
# PostgreSQL for the performance database (estimator.database.urlSecret).
RUN pip install --no-compile ".[serve,operator,postgres]" && rm -rf /src
USER 65532:65532
ENTRYPOINT ["gpuplan"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
