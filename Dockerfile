# Container image for pgward.
#   docker build -t pgward .
#   docker run -p 6432:6432 -v /path/to/config:/etc/pgward:ro pgward
# The directory mounted at /etc/pgward holds pgward.ini and the files it names; relative paths
# in it are resolved from /etc/pgward. Without a mount, the example from etc/ is used.

FROM rust:bookworm AS build
# pg_query (PostgreSQL's parser) is built with bindgen, which needs libclang.
RUN apt-get update && apt-get install -y --no-install-recommends libclang-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Dependencies first, so that they stay cached while the sources change.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
    && cargo build --release --locked \
    && rm -rf src
COPY src ./src
RUN touch src/main.rs src/lib.rs && cargo build --release --locked

FROM debian:bookworm-slim
RUN useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin pgward
COPY --from=build /src/target/release/pgward /usr/local/bin/pgward
COPY etc/pgward.ini etc/userlist.txt /etc/pgward/
# The example listens on 127.0.0.1 and finds its auth_file as etc/userlist.txt from the source
# tree; inside the container it must listen on every address and use the copied file.
RUN sed -i -e 's/^listen_addr = .*/listen_addr = */' \
        -e 's|^auth_file = .*|auth_file = /etc/pgward/userlist.txt|' /etc/pgward/pgward.ini
WORKDIR /etc/pgward
USER pgward
EXPOSE 6432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/pgward"]
CMD ["/etc/pgward/pgward.ini"]
