# syntax=docker/dockerfile:1
#
# weir's container image: the release binary, stripped, on distroless (glibc,
# CA certs).
#
#   docker build -t weir:0.1.0 .
#   docker run --rm -p 15000:15000 weir:0.1.0          # admin: /metrics /healthz /readyz
#   docker build --target debug --output type=local,dest=out .
#                                                       # out/weir.debug: its debug info
#
# The build stage runs exactly the build command of .ci/run (tests/deploy.rs
# checks that the two agree), so the image is built the way CI builds.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Everything the build needs and nothing else (.dockerignore is an allowlist).
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY bench/micro ./bench/micro
# The release profile keeps line tables (debug = "line-tables-only"): most of
# the binary's size. They are split off into weir.debug, which the `debug`
# stage below exports, and the binary keeps a .gnu_debuglink to it, so gdb,
# perf or addr2line given weir.debug resolve addresses from the image's
# binary. The image carries the stripped binary alone (bench/RESULTS.md:
# sizes before and after).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,id=weir-target \
    cargo build --release --locked \
    && install -D -m 0755 target/release/weir /out/weir \
    && cd /out \
    && objcopy --only-keep-debug weir weir.debug \
    && objcopy --strip-all --add-gnu-debuglink=weir.debug weir

# The debug info, apart from the image (built only when asked for).
FROM scratch AS debug
COPY --from=build /out/weir.debug /weir.debug

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
# Healthy once /readyz answers 200 (no curl here: weir asks itself, at the
# admin address of the config it runs; docs/reference/cli.md#weir-health).
# Compose's `depends_on: condition: service_healthy` waits for it; Kubernetes
# ignores it and uses the pod's probes.
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 \
    CMD ["weir", "health", "--config", "/etc/weir/weir.toml", "--timeout", "2s"]
# weir drains for up to shutdown_timeout after SIGTERM (20 s in the config
# above): stop it with more grace than Docker's default 10 s
# (`docker stop -t 30`; Compose: stop_grace_period).
ENTRYPOINT ["weir", "run", "--config", "/etc/weir/weir.toml"]
