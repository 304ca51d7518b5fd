# syntax=docker/dockerfile:1
#
# weir's container image: the release binary on distroless (glibc, CA certs).
#
#   docker build -t weir:0.1.0 .
#   docker run --rm -p 15000:15000 weir:0.1.0          # admin: /metrics /healthz /readyz
#
# The build stage runs exactly the build command of .ci/run (tests/deploy.rs
# checks that the two agree), so the image is built the way CI builds.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Everything the build needs and nothing else (.dockerignore is an allowlist).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=weir-target \
    cargo build --release --locked \
    && install -D -m 0755 target/release/weir /out/weir

# cc-debian12 = glibc + libgcc + CA certificates, no shell, no package
# manager; the :nonroot tag runs as uid/gid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/weir /usr/local/bin/weir
# The image's default config: data listener on loopback (only the app in the
# same pod or network namespace reaches it), admin on 0.0.0.0 so kubelet
# probes and Prometheus can reach /healthz, /readyz and /metrics. Mount your
# own at /etc/weir (a ConfigMap directory, not a subPath, so edits reload).
COPY deploy/docker/weir.toml /etc/weir/weir.toml
USER 65532:65532
# 15001: data (shared listener), 15000: admin.
EXPOSE 15001 15000
ENV WEIR_LOG_FORMAT=json
ENTRYPOINT ["weir", "run", "--config", "/etc/weir/weir.toml"]
