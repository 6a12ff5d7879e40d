# deploy/: the Kubernetes manifests and their validation, and the image.
#
# deploy/validate is its own Go module (Kubernetes, kustomize and the CRD
# sources stay out of the main module). `make test` runs its tests last,
# after the unit tests and the lint (TEST_LAST: a unit failure shows before
# the slow part): every overlay built with kustomize and checked with the
# API server's own validation code against the pinned CRDs, plus the
# planted-error tests. `cd deploy/validate && go test ./...` does
# the same on its own.

DOCKER ?= docker
IMAGE  ?= kvgate:dev

TEST_LAST += deploy-validate
# Its modules download and its packages compile (Kubernetes' are many) at
# the start, beside the other preparations (test-prep); its tests run last.
TEST_PREP += deploy-compile

.PHONY: deploy-validate deploy-compile image

deploy-compile:
	cd deploy/validate && $(GO) mod download && $(GO) vet ./...

deploy-validate:
	cd deploy/validate && $(GO) vet ./... && $(GO) test -timeout 25m $(TESTFLAGS) ./...

## image: the kvgate container image (Dockerfile), when docker is present
image:
	@command -v $(DOCKER) >/dev/null || { echo "image: $(DOCKER) not found; the Dockerfile builds with any OCI builder"; exit 1; }
	$(DOCKER) build -t $(IMAGE) .
