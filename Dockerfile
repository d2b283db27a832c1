# attrserve: CPU image by default; for CUDA build with
#   docker build --build-arg BASE=nvidia/cuda:12.4.1-runtime-ubuntu22.04 --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124 .
ARG BASE=python:3.11-slim
FROM ${BASE}

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    ATTRSERVE_HOST=0.0.0.0 ATTRSERVE_PORT=8000

# CUDA bases ship without Python; the slim base already has it.
RUN if ! command -v python3 >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends python3 python3-pip \
        && ln -s /usr/bin/python3 /usr/local/bin/python && rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /app
COPY pyproject.toml README.md ./
COPY methods ./methods
COPY model_registry ./model_registry
COPY service ./service
RUN python -m pip install --extra-index-url "${TORCH_INDEX}" . \
    && useradd --create-home --uid 10001 attrserve \
    && mkdir -p /models && chown attrserve /models

USER attrserve
EXPOSE 8000
VOLUME ["/models"]
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/v1/health/ready', timeout=2).status != 200)"
CMD ["attrserve", "serve", "--host", "0.0.0.0", "--port", "8000"]
