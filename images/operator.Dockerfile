# tpuforge/operator: the kopf operator. Control-plane side only: no JAX.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY workloads ./workloads
RUN pip install --no-cache-dir '.[operator]' && rm -rf /src
USER 65532:65532
ENTRYPOINT ["tpuforge", "operator"]
