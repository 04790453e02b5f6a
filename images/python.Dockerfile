# Debian's python3 (3.11 in bookworm) in a venv on PATH, with torch and torchvision from PyPI:
# the base of the fedqueue image (workers/Dockerfile, BASE_IMAGE) where no registry serves one.
# PyPI's x86_64 torch is its CUDA build: it runs on the CPU too, and on a GPU host with the NVIDIA runtime.
ARG DEBIAN_IMAGE=fedqueue-debian:bookworm
FROM ${DEBIAN_IMAGE}

ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# The trusted certificates of the machine that builds (images/build.sh puts them in the context):
# pip then reaches PyPI through whatever TLS that machine trusts, an intercepting proxy's included.
# With none given, the image's own ca-certificates.
COPY build-host-ca.crt /usr/local/share/fedqueue/build-host-ca.crt
RUN [ -s /usr/local/share/fedqueue/build-host-ca.crt ] \
    || cp /etc/ssl/certs/ca-certificates.crt /usr/local/share/fedqueue/build-host-ca.crt
ENV PIP_CERT=/usr/local/share/fedqueue/build-host-ca.crt

RUN pip install --upgrade pip

RUN pip install "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
    && python -c "import torch, torchvision; print(torch.__version__, torchvision.__version__)"

CMD ["python"]
