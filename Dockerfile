# syntax=docker/dockerfile:1
# The one kvgate binary (every subcommand: extproc, localrouter, relay,
# mocker, ...), static, on a distroless base that runs as non-root.
#
#   make image                       # docker build -t kvgate:dev .
#   docker run --rm kvgate:dev extproc -h
#
# deploy/validate's tests run the build line below (read from this file)
# and check that the binary it makes is static.

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/kvgate ./cmd/kvgate

# static: no libc, no shell; nonroot: uid/gid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvgate /usr/local/bin/kvgate
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kvgate"]
