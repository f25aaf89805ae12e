# syntax=docker/dockerfile:1
#
# walpost container image: a release build in a Rust builder stage, copied into a small
# Debian runtime that runs as an unprivileged user.
#
#   docker build --build-arg WALPOST_GIT_COMMIT=$(git rev-parse --short=12 HEAD) -t walpost .
#   docker run --rm walpost --version        # walpost 0.1.0 (<commit>)
#
# .git is not sent to the build (.dockerignore), so the commit printed by
# `walpost --version` comes from the WALPOST_GIT_COMMIT build argument
# (crates/walpost/build.rs reads it); without it the image says "unknown".
#
# Structure checked by crates/walpost/tests/compose.rs (no Docker engine is needed
# for that test).

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# ---- build ------------------------------------------------------------------------
FROM ${RUST_IMAGE} AS build

# The rdkafka crate builds its bundled librdkafka with cmake (features cmake-build,
# ssl, libz), the same packages scripts/setup-deps.sh installs for local builds.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        cmake pkg-config libssl-dev zlib1g-dev libcurl4-openssl-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY . .

ARG WALPOST_GIT_COMMIT=unknown
ENV WALPOST_GIT_COMMIT=${WALPOST_GIT_COMMIT}

# Cache mounts keep the crates.io download and the target directory between builds
# (BuildKit, the default builder of current Docker releases). The binary is copied out
# of the cached target directory because cache mounts are not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p walpost --bin walpost \
 && install -D -m 0755 target/release/walpost /out/walpost \
 && /out/walpost --version

# ---- runtime ----------------------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime

ARG WALPOST_GIT_COMMIT=unknown
LABEL org.opencontainers.image.title="walpost" \
      org.opencontainers.image.description="Streams transactional-outbox events from PostgreSQL's WAL to Kafka" \
      org.opencontainers.image.source="https://github.com/walpost/walpost" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${WALPOST_GIT_COMMIT}"

# What the binary links dynamically (ldd): libssl3/libcrypto3 and zlib, besides libc
# and libgcc_s which the base image has. librdkafka is built without curl (the rdkafka
# `curl` feature is off), so libcurl is not needed at run time; add libcurl4 here if
# that feature is ever turned on. ca-certificates: for sslmode=verify-full and
# security.protocol=SSL against public CAs. No curl: the health check below uses
# bash's /dev/tcp, so the image stays small.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 walpost \
 && useradd --system --uid 10001 --gid walpost --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin walpost

COPY --from=build /out/walpost /usr/local/bin/walpost

# /metrics, /healthz and /readyz; the health check below needs them on.
ENV WALPOST_METRICS_ADDR=127.0.0.1:9187
EXPOSE 9187

USER 10001:10001

# walpost handles SIGTERM itself (stop reading, wait for Kafka's acks up to
# pipeline.shutdown_timeout_secs = 30 s by default, confirm, exit 0): give it longer
# than that before the SIGKILL (`docker stop -t 45`, compose stop_grace_period: 45s).
STOPSIGNAL SIGTERM

# Liveness: GET /healthz on the port of WALPOST_METRICS_ADDR, with bash's /dev/tcp
# (bash, head and grep are part of every Debian base image).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${WALPOST_METRICS_ADDR##*:} && printf 'GET /healthz HTTP/1.0\\r\\n\\r\\n' >&3 && grep -q '^HTTP/1\\.[01] 200 ' <&3"]

ENTRYPOINT ["walpost"]
CMD ["run"]
