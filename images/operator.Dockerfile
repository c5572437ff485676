# tpuforge/operator: the kopf operator. Control-plane side only: no JAX.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY workloads ./workloads
RUN pip install --no-cache-dir '.[operator]' && rm -rf /src
# The unprivileged user every tpuforge pod runs as (tpuforge.manifests.common.POD_UID). Its home is /tmp:
# pods mount a scratch volume there, the root filesystem being read-only.
RUN groupadd --gid 65532 tpuforge \
 && useradd --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin tpuforge
USER 65532:65532
# At most two malloc arenas: the informers' threads (one per kind) otherwise each keep an arena of what they
# freed (peak RSS at 1600 FineTuneJobs: 261 MB without, 227 MB with; docs/performance.md, run J).
ENV MALLOC_ARENA_MAX=2
ENTRYPOINT ["tpuforge", "operator"]
