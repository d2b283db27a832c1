# attrserve. CPU image by default:
#   docker build -t attrserve .
# CUDA image: the same file with torch from PyPI, whose Linux wheel bundles its CUDA libraries
# (torch 2.13.0: CUDA 13.0, so the host needs an NVIDIA driver >= 580 and the NVIDIA Container
# Toolkit):
#   docker build --build-arg TORCH_INDEX=https://pypi.org/simple -t attrserve:cuda .
# One file rather than a Dockerfile.cuda because torch's index is the only difference: the
# nvidia/cuda runtime bases would add a second copy of the CUDA libraries, and their ubuntu22.04
# tags carry Python 3.10, older than the 3.11 attrserve needs.
FROM python:3.11-slim

# The CPU index keeps the image free of CUDA (~0.2 GB of torch instead of ~3 GB).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# Optional extras installed with the dependencies (comma-separated pyproject extras): regions
# is scikit-image, the superpixels and XRAI segments (about 0.2 GB with SciPy); build with
# --build-arg EXTRAS= for the bare service, or add hf for Hugging Face directories
ARG EXTRAS=regions

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

WORKDIR /app
RUN python -m venv /opt/venv

# Dependencies first, from the manifests alone, so that a source change reuses this layer and
# does not reinstall torch. torch comes from TORCH_INDEX only (no mixing of indexes), pinned by
# constraints.txt; the rest from PyPI, where the installed torch already satisfies pyproject.
COPY pyproject.toml constraints.txt ./
RUN pip install --index-url "${TORCH_INDEX}" --constraint constraints.txt torch \
    && python -c "import os, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; extras = [e for e in os.environ.get('EXTRAS', '').split(',') if e]; print('\n'.join(p['dependencies'] + [d for e in extras for d in p['optional-dependencies'][e]]))" > /tmp/requirements.txt \
    && pip install --constraint constraints.txt --requirement /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY README.md ./
COPY methods ./methods
COPY model_registry ./model_registry
COPY service ./service
RUN pip install --no-deps . \
    && useradd --create-home --uid 10001 --user-group attrserve \
    && mkdir -p /models /data && chown 10001:10001 /models /data

# A numeric user, so that runAsNonRoot-style checks can verify it without the passwd file.
USER 10001:10001
# attribution jobs persist under /data: mount a volume there to keep them across containers
ENV ATTRSERVE_HOST=0.0.0.0 \
    ATTRSERVE_PORT=8000 \
    ATTRSERVE_DATA_DIR=/data
EXPOSE 8000
# Reads ATTRSERVE_PORT when it runs, so `-e ATTRSERVE_PORT=...` moves the check with the server;
# the exec form needs no shell, and no curl (slim has none). urlopen raises on a non-2xx answer.
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ['ATTRSERVE_PORT'] + '/v1/health/ready', timeout=2)"]
# Host, port and models come from ATTRSERVE_HOST, ATTRSERVE_PORT and ATTRSERVE_MODELS.
CMD ["attrserve", "serve"]
