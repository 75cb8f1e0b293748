# Multi-stage build of a static pgoutbox binary on a small non-root image.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/pgoutbox ./cmd/pgoutbox \
 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/pgoutbox-demo ./cmd/pgoutbox-demo

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/pgoutbox /out/pgoutbox-demo /usr/local/bin/
# distroless's "nonroot" by number: Kubernetes checks runAsNonRoot only against
# a numeric user.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/pgoutbox"]
CMD ["run"]
