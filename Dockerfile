# One multi-stage build for every Go binary of the product. The final image
# holds all of them; docker-compose.yml picks one per service.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# docker build --build-arg VERSION=v1.2.3 --build-arg REVISION=$(git rev-parse HEAD)
ARG VERSION=dev
ARG REVISION=
RUN CGO_ENABLED=0 go build -trimpath \
	-ldflags="-s -w -X github.com/edgelimit/edgelimit/internal/boot.Version=${VERSION} -X github.com/edgelimit/edgelimit/internal/boot.Revision=${REVISION}" \
	-o /out/ ./cmd/...

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
COPY deploy/ /etc/edgelimit/
USER nonroot
