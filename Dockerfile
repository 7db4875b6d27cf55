# syntax=docker/dockerfile:1
# The one image of Tessera's two servers (and its certs tool):
#   docker build -t registry.example.com/tessera:0.1.0 .
#   docker run --rm registry.example.com/tessera:0.1.0 webhook --help
# ENTRYPOINT is `python -m`, so the first argument names the module: webhook, extender,
# certs. Runs as uid 65532, needs no shell, and writes nothing outside /tmp (the
# Deployments mount the root filesystem read-only).
ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------- build: wheels only
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY pyproject.toml README.md ./
COPY cluster/ cluster/
COPY server/ server/
COPY webhook/ webhook/
COPY extender/ extender/
COPY certs/ certs/
COPY loadtest/ loadtest/
COPY console/ console/
# The project's wheel and every dependency's. The build backend (hatchling) lives only in
# pip's isolated build environment in this stage; --only-binary keeps compilers out: every
# dependency ships manylinux wheels.
RUN pip wheel --wheel-dir /wheels --only-binary=:all: .

# ---------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
# Install from the build stage's wheels without copying them into a layer (bind mount),
# compiling bytecode now because the root filesystem is read-only at run time; then remove
# pip, setuptools and wheel, which nothing at run time needs.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels --compile tessera \
    && pip uninstall --yes pip setuptools wheel \
    && groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin nonroot
USER 65532:65532
# serving ports (webhook, extender), then their metrics listeners as the manifests set them
EXPOSE 8443 8888 8080 8889
ENTRYPOINT ["python", "-m"]
CMD ["webhook", "--help"]
