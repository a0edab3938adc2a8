# syntax=docker/dockerfile:1
# The `agora` binary (arbiter, worker, CLI) in a slim Debian image.
#   docker build -t agora .            (BuildKit: cache mounts keep the cargo registry and the
#                                       compiled dependencies between builds)

# --- build -----------------------------------------------------------------------------------
FROM rust:1-bookworm AS builder

# HiGHS (the auction's solver) is built from source: cmake and a C++ compiler, and libclang for
# its bindings. First, so the layer survives every source change.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake libclang-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . .

# Queries are checked against the committed offline data (.sqlx/), never a live database.
ENV SQLX_OFFLINE=true
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p agora-cli \
    && install -D -m 0755 target/release/agora /out/agora

# --- run -------------------------------------------------------------------------------------
FROM debian:bookworm-slim AS runtime

# libstdc++ for HiGHS (C++), ca-certificates for TLS to Postgres or a collector, curl for
# health checks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libstdc++6 ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 agora \
    && useradd --system --uid 10001 --gid agora --home-dir /var/lib/agora --create-home agora

COPY --from=builder /out/agora /usr/local/bin/agora
# Fleet files for the simulated GPU fleet (AGORA_FLEET); real hosts attach with `agora worker`.
COPY services/agora-sim/clusters/ /usr/share/agora/clusters/

ENV AGORA_LISTEN=0.0.0.0:8080 \
    AGORA_FLEET=/usr/share/agora/clusters/themis-testbed-azure.toml \
    RUST_LOG=info

USER agora
WORKDIR /var/lib/agora
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8080/healthz || exit 1

ENTRYPOINT ["/usr/local/bin/agora"]
CMD ["serve"]
